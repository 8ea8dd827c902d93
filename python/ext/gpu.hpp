// SPDX-License-Identifier: Apache-2.0
/**
 * @file python/ext/gpu.hpp
 * @brief The GPU controllers, built by nvcc in `gpu.cu` and handed to the binding as `controller_api`.
 *
 * Only host-only types cross: the engine's pool as a `layer_first_table` of device pointers, the file
 * tier by reference, streams as integers.
 */
#pragma once

#include "controller_api.hpp"

#include <strata/layout/layer_first.hpp>
#include <strata/tier/file_store.hpp>

#include <memory>
#include <optional>

namespace strata::python {

/// @brief `gpu_executor_config` and `pinned_pool_options`, in host-only terms.
struct gpu_options {
  std::optional<int> force{};           ///< 0 gpu_assisted, 1 dma_batch, 2 staged (none: chosen per transfer)
  bool staged_loads = false;            ///< let loads use `staged`
  bool dma_submit_thread = true;        ///< `dma_batch` from a submit thread
  double cpu_weight = 1;                ///< weight of the caller's CPU time in the backend choice
  std::uintptr_t load_stream = 0;       ///< stream for loads (0: the executor's own)
  std::uintptr_t copy_stream = 0;       ///< stream for backups and demotions (0: the executor's own)
  bool registered_host_memory = false;  ///< pinned host pool by mmap + cudaHostRegister (else cudaHostAlloc)
};

/**
 * @brief A `cache_controller<gpu_policies<layer_first_table>>`, or with `file` a
 *        `cache_controller<gpu_policies<layer_first_table, file_store&>>`.
 * @param pool the engine's pool: device pointers
 * @param host_pages records of the pinned host tier
 * @param file the file tier (outlives the controller), or null
 */
std::unique_ptr<controller_api> make_gpu_controller(layer_first_table const& pool, std::int64_t host_pages,
                                                    controller_options const& options, gpu_options const& gpu,
                                                    file_store* file);

/// @brief CUDA devices visible (0 without a driver or a GPU; never throws).
int cuda_device_count() noexcept;

}  // namespace strata::python
