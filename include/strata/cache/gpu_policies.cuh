// SPDX-License-Identifier: Apache-2.0
/**
 * @file cache/gpu_policies.cuh
 * @brief The bundle of a GPU engine (`gpu_policies`) and the GPU `wait_layer` and `wait_after`:
 *        what an engine names to run `cache_controller` on CUDA.
 *
 * ```
 * using controller = strata::cache_controller<strata::gpu_policies<strata::layer_first_table>>;
 * controller cache{layout, host_pages};                     // the engine's pool + a pinned host tier
 * ...
 * auto loads = cache.begin_loads(plan, compute_stream);     // copies start after the work already there
 * for (layer l) { strata::wait_layer(loads, l, compute_stream); attention(l); }
 * ```
 */
#pragma once

#include <strata/cache/controller.hpp>
#include <strata/cache/gpu_executor.cuh>
#include <strata/cache/policies.hpp>
#include <strata/layout/layer_first.hpp>
#include <strata/tier/file_store.hpp>
#include <strata/tier/pinned_host_pool.cuh>

#include <cuda/stream_ref>

#include <cstdint>
#include <optional>

namespace strata {

/**
 * @brief The bundle of a GPU engine: the engine's pool in `Layout` (device memory), a pinned host
 *        tier, optionally record stores below it, the strategy `Scheduler`, `gpu_executor`.
 * @tparam Layout the engine's `kv_layout` (`layer_first`, `layer_first_table` from `sglang_layout`,
 *         `vllm_layout`, ...)
 * @tparam Scheduler a `scheduler_strategy` (default: `strata_scheduler`: delay hits, balance, bubbles)
 * @tparam Lower tiers below the host, slower in order: e.g. `file_store&` (the NVMe tier, held by
 *         reference; records move on the stores' queues and the executor's record threads)
 */
template <kv_layout Layout, scheduler_strategy Scheduler = strata_scheduler, class... Lower>
struct gpu_policies {
  using tiers = tier_stack<device_pool<Layout>, pinned_host_pool, Lower...>;  ///< device, pinned host, lower
  using scheduler = Scheduler;                                                ///< the strategy
  using executor = gpu_executor;                                              ///< GPU transfers, chosen per transfer
};
static_assert(cache_policies<gpu_policies<layer_first>>);
static_assert(cache_policies<gpu_policies<layer_first, strata_scheduler, file_store&>>);

namespace detail {
/// Makes `stream` wait for `layer` of `h` (none: all of it); false when `h` failed.
inline bool wait_transfer(transfer_handle const& h, std::optional<std::int64_t> layer, cuda::stream_ref stream)
{
  if (!h.valid()) { return true; }  // nothing in flight (copies the executor finished on its thread)
  if (h.failed()) { return false; }
  try {
    if (layer) {
      h.wait_layer(*layer, stream);
    } else {
      h.wait(stream);
    }
  } catch (...) {
    if (h.failed()) { return false; }  // enqueueing failed on the submit thread meanwhile
    throw;
  }
  return true;
}
}  // namespace detail

/**
 * @brief Makes `stream` wait until `layer` of a batch's loads has landed, and of the earlier loads
 *        still filling pages the batch reads (`load_handle::after`); nothing to wait for when there
 *        are none.
 * @return false when one of them failed: the batch's started requests must not read their cached
 *         pages (call `complete`/`poll`: the controller sends them back to wait)
 * @throw strata::invalid_argument for a layer outside the model; strata::cuda_error from CUDA
 */
inline bool wait_layer(load_handle<transfer_handle> const& loads, std::int64_t layer, cuda::stream_ref stream)
{
  for (auto const& h : loads.after) {
    if (!detail::wait_transfer(h, layer, stream)) { return false; }
  }
  return !loads.transfer || detail::wait_transfer(*loads.transfer, layer, stream);
}

/**
 * @brief Makes `stream` wait for the loads still filling pages the finished request's page table
 *        now points at (`prefill_result::after`: duplicates swapped for pages another batch is
 *        loading). Call it before anything on `stream` reads the table (decode).
 * @return false when one of them failed: those pages hold garbage, `failed(id)` is already true;
 *         release the request and submit it again
 * @throw strata::cuda_error from CUDA
 */
inline bool wait_after(prefill_result<transfer_handle> const& r, cuda::stream_ref stream)
{
  for (auto const& h : r.after) {
    if (!detail::wait_transfer(h, std::nullopt, stream)) { return false; }
  }
  return true;
}

}  // namespace strata
