// SPDX-License-Identifier: Apache-2.0
/**
 * @file python/ext/controller_api.hpp
 * @brief One non-template face for every `cache_controller` instantiation the Python module offers.
 *
 * The binding (g++, nanobind) and the CUDA part (nvcc, no nanobind) meet here: both see only this
 * header and host-only strata headers. Each instantiation (`cpu_policies<layer_first_table>`,
 * `gpu_policies<layer_first_table, strata_scheduler, file_store&>`, ...) is wrapped by `controller_impl<C>`
 * (`controller_impl.hpp`); the GPU ones are built in `gpu.cu`, so nanobind never goes through nvcc.
 * Streams cross as integers (a `cudaStream_t`'s value; 0 is the legacy default stream), executor
 * handles as type-erased pointers owned by the returned records.
 */
#pragma once

#include <strata/cache/controller.hpp>
#include <strata/tier/keyed_store.hpp>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace strata::python {

class controller_api;

/// @brief What `begin_loads` returned, without the executor's handle type.
struct loads_info {
  std::uint64_t round = 0;
  std::vector<prefill_item> ran;
  std::vector<prefill_item> skipped;
  std::vector<started_request> started;
  std::array<std::int64_t, tier_count> loaded_pages{};
  bool has_loads = false;
  std::size_t after = 0;                  ///< earlier batches' loads this batch also waits for
  controller_api const* owner = nullptr;  ///< the controller that made it
  std::shared_ptr<void> native;           ///< `load_handle<Handle>`
};

/// @brief What `finish_prefill` returned, without the executor's handle type.
struct prefill_info {
  std::vector<std::int64_t> duplicate_positions;
  std::size_t after = 0;
  controller_api const* owner = nullptr;
  std::shared_ptr<void> native;  ///< `prefill_result<Handle>`
};

/// @brief The GPU executor's counters, as plain numbers.
struct executor_stats {
  std::array<std::array<std::int64_t, 3>, 2> transfers{};  ///< [load, copy][gpu_assisted, dma_batch, staged]
  std::array<std::array<std::int64_t, 3>, 2> bytes{};
  std::int64_t failed_submissions = 0;
  double dma_descriptor_us = 0;  ///< the GPU executor's observed cost of a DMA descriptor (µs; 0: host executor)
};

/// @brief `gpu_calibration` in host-only terms (zeros: nothing measured, the host executor).
struct executor_calibration {
  std::array<double, 3> load_gbps{};  ///< [gpu_assisted, dma_batch, staged]
  std::array<double, 3> copy_gbps{};
  double dma_descriptor_us = 0;
};

/**
 * @brief A shared keyed store (the remote tier) behind a virtual face: the GPU controllers
 *        (`gpu.cu`, nvcc) reach `redis_store` through it and never compile hiredis code; the
 *        binding wraps the store (`module.cpp`).
 */
class keyed_store_api {
 public:
  virtual ~keyed_store_api() = default;
  [[nodiscard]] virtual std::int64_t page_bytes() const = 0;
  virtual std::int64_t exists(std::span<content_key const> keys) = 0;
  virtual std::int64_t get(std::span<keyed_page const> pages, std::span<std::byte* const> dests,
                           std::span<bool> intact) = 0;
  virtual std::int64_t set(std::span<keyed_page const> pages, std::span<std::byte const* const> sources,
                           std::span<bool> written) = 0;
  virtual io_ticket submit_exists(std::span<content_key const> keys) = 0;
  virtual io_ticket submit_get(std::span<keyed_page const> pages, std::span<std::byte* const> dests) = 0;
  virtual io_ticket submit_set(std::span<keyed_page const> pages, std::span<std::byte const* const> sources) = 0;
  virtual io_status poll(io_ticket t, std::span<bool> flags) = 0;
  virtual io_status wait(io_ticket t, std::span<bool> flags) = 0;
};
static_assert(async_keyed_page_store<keyed_store_api>);

/**
 * @brief The controller's members, streams as integers. Every member may throw what the
 *        controller throws (`strata::invalid_argument` for rejected input, nothing changed).
 */
class controller_api {
 public:
  virtual ~controller_api() = default;

  virtual void submit(cache_request const& r, std::uintptr_t stream) = 0;
  virtual batch_plan schedule(schedule_budget const& budget) = 0;
  virtual loads_info begin_loads(batch_plan const& plan, std::uintptr_t stream) = 0;
  /// @brief Makes `stream` wait for one layer of the loads (GPU); the host executor copies at once.
  /// @return false when the loads failed
  virtual bool wait_layer(loads_info const& loads, std::int64_t layer, std::uintptr_t stream) = 0;
  virtual bool complete(loads_info const& loads) = 0;
  virtual std::size_t poll(std::uintptr_t stream) = 0;
  virtual std::vector<std::int64_t> page_table(request_id id) const = 0;
  virtual prefill_info finish_prefill(request_id id, std::uintptr_t stream) = 0;
  /// @brief Makes `stream` wait for the loads a finished prefill's page table still depends on.
  virtual bool wait_after(prefill_info const& r, std::uintptr_t stream) = 0;
  virtual void release(request_id id, std::span<std::int32_t const> cache_tokens, std::uintptr_t stream) = 0;
  virtual std::int64_t evict(tier t, std::int64_t pages, std::uintptr_t stream) = 0;
  virtual match_result probe(std::span<std::int32_t const> tokens) const = 0;
  virtual std::int64_t device_pages_available() const = 0;
  virtual std::size_t waiting() const = 0;
  virtual bool failed(request_id id) const = 0;
  virtual bool prefilled(request_id id) const = 0;
  virtual std::size_t live_requests() const = 0;
  virtual std::size_t pending_submissions() const = 0;
  virtual cache_stats stats() const = 0;
  virtual hiradix_stats index_stats() const = 0;
  virtual void check_invariants() const = 0;
  virtual std::int64_t page_tokens() const = 0;
  virtual kv_geometry geometry() const = 0;
  virtual controller_options const& options() const = 0;
  /// @brief Tier kinds in the stack, fastest first.
  virtual std::vector<tier> tiers() const = 0;
  virtual std::int64_t capacity(tier t) const = 0;
  /// @brief "host" or "gpu": which executor copies.
  virtual std::string executor_name() const = 0;
  /// @brief `gpu_executor::set_activity` (ignored by the host executor). activity: 0 idle, 1 prefill, 2 decode.
  virtual void set_activity(int activity, double compute_ms) = 0;
  /// @brief Waits for every copy the executor issued (GPU; nothing to wait for on the host).
  virtual void synchronize() = 0;
  virtual executor_stats stats_of_executor() const = 0;
  /// @brief `gpu_executor::warm_up` over the controller's tiers (the host executor: nothing to do).
  virtual executor_calibration warm_up() = 0;
};

}  // namespace strata::python
