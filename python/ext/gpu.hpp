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

#include <strata/layout/engine.hpp>
#include <strata/layout/layer_first.hpp>
#include <strata/layout/page_first.hpp>
#include <strata/tier/file_store.hpp>

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <variant>

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
  int load_ctas = 2;                    ///< CTAs of `gpu_assisted` loads (`gpu_assisted_config::ctas`)
  int device = 0;                       ///< the pool's device: the controller's executor, host tier and streams
};

/**
 * @brief A `cache_controller<gpu_policies<layer_first_table>>`, or with `file` a
 *        `cache_controller<gpu_policies<layer_first_table, strata_scheduler, file_store&>>`, and with
 *        `remote` a `remote_tier<keyed_store_api>` below them.
 * @param pool the engine's pool: device pointers
 * @param host_pages records of the pinned host tier
 * @param file the file tier (outlives the controller), or null
 * @param remote the shared remote store's face (outlives the controller), or null
 */
std::unique_ptr<controller_api> make_gpu_controller(layer_first_table const& pool, std::int64_t host_pages,
                                                    controller_options const& options, gpu_options const& gpu,
                                                    file_store* file, keyed_store_api* remote);

/// @brief CUDA devices visible (0 without a driver or a GPU; never throws).
int cuda_device_count() noexcept;

// --- the transfer backends one by one ----------------------------------------------------------

/// @brief A layout the binding's GPU copies move pages between (one of the Python layouts' values).
using gpu_layout = std::variant<layer_first, page_first, layer_first_table, vllm_layout, hf_layout>;

/// @brief Backends `make_gpu_copier` makes (the first three are `gpu_backend`'s order).
enum class copier_kind : int { gpu_assisted = 0, dma_batch = 1, staged = 2, dma_copy = 3 };

/// @brief One enqueued copy: a `transfer_handle` (per-layer events when asked for).
class gpu_transfer_api {
 public:
  virtual ~gpu_transfer_api() = default;
  /// @brief Makes `stream` wait for `layer` (per-layer transfers; else for the whole transfer).
  virtual void wait_layer(std::int64_t layer, std::uintptr_t stream) const = 0;
  /// @brief Makes `stream` wait for the whole transfer.
  virtual void wait(std::uintptr_t stream) const = 0;
  /// @brief Blocks until the whole transfer has landed.
  virtual void synchronize() const = 0;
  /// @brief True once it has landed (never blocks).
  [[nodiscard]] virtual bool done() const = 0;
};

/// @brief One backend instance (its buffers and descriptor ring live as long as it does).
class gpu_copier_api {
 public:
  virtual ~gpu_copier_api() = default;
  [[nodiscard]] virtual char const* name() const = 0;
  /**
   * @brief Validates, then enqueues a plan on `stream`. One side must be `page_first` (the host
   *        tier's records); `staged` needs the records on the host side of its direction.
   * @throw strata::invalid_argument before anything is enqueued for a bad plan or a pair of layouts
   *        the backend does not move (nothing changed)
   */
  virtual std::unique_ptr<gpu_transfer_api> copy(gpu_layout const& src, gpu_layout const& dst,
                                                 std::span<page_pair const> pages, layer_range layers,
                                                 std::uintptr_t stream, bool per_layer) = 0;
};

/// @brief A backend; `ctas` sizes `gpu_assisted`'s launch (ignored by the others).
std::unique_ptr<gpu_copier_api> make_gpu_copier(copier_kind kind, int ctas);

/// @brief A `pinned_host_pool` in one chunk: pinned, device-mapped page-first records.
class pinned_pool_api {
 public:
  virtual ~pinned_pool_api() = default;
  [[nodiscard]] virtual std::byte* data() const = 0;
  [[nodiscard]] virtual std::int64_t pages() const = 0;
  [[nodiscard]] virtual kv_geometry geometry() const = 0;
};

/// @brief `pinned_host_pool{geometry, pages}` (`registered`: mmap + cudaHostRegister), one chunk.
std::unique_ptr<pinned_pool_api> make_pinned_pool(kv_geometry const& geometry, std::int64_t pages, bool registered);

}  // namespace strata::python
