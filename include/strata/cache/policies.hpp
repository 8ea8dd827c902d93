// SPDX-License-Identifier: Apache-2.0
/**
 * @file cache/policies.hpp
 * @brief What a `cache_controller` is composed of: the `cache_policies` concept (tiers, scheduler,
 *        executor), the bundle of a CPU engine (`cpu_policies`), and the CPU `wait_layer` and
 *        `wait_after`.
 *
 * A bundle names three types; the controller owns one of each. GPU engines use `gpu_policies`
 * (`cache/gpu_policies.cuh`), the simulator `sim::sim_policies`.
 */
#pragma once

#include <strata/cache/executor.hpp>
#include <strata/cache/requests.hpp>
#include <strata/error.hpp>
#include <strata/layout/layer_first.hpp>
#include <strata/layout/layout.hpp>
#include <strata/sched/scheduler.hpp>
#include <strata/sched/strata_scheduler.hpp>
#include <strata/tier/device_pool.hpp>
#include <strata/tier/host_pool.hpp>
#include <strata/tier/tier_stack.hpp>

#include <algorithm>
#include <cstdint>

namespace strata {

/**
 * @brief A policy bundle: `P::tiers` (a `tier_stack`), `P::scheduler` (a `scheduler_strategy`),
 *        `P::executor` (a `copy_executor` over the tiers).
 */
template <class P>
concept cache_policies = requires {
  typename P::tiers;
  typename P::scheduler;
  typename P::executor;
} && scheduler_strategy<typename P::scheduler> && copy_executor<typename P::executor, typename P::tiers>;

/**
 * @brief The bundle of a CPU engine: the engine's pool in `Layout` (host memory), a `host_pool`
 *        tier, the strategy `Scheduler`, `cpu_executor` (copies on the calling thread, record I/O
 *        on the stores' queues and the executor's record threads).
 * @tparam Layout the engine's `kv_layout`
 * @tparam Scheduler a `scheduler_strategy` (default: `strata_scheduler`: delay hits, balance, bubbles)
 */
template <kv_layout Layout, scheduler_strategy Scheduler = strata_scheduler>
struct cpu_policies {
  using tiers = tier_stack<device_pool<Layout>, host_pool>;  ///< device and host tiers
  using scheduler = Scheduler;                               ///< the strategy
  using executor = cpu_executor;                             ///< memcpy; record I/O off the caller's thread
};
static_assert(cache_policies<cpu_policies<layer_first>>);

namespace detail {
/// Whether a `cpu_executor` submission landed, waiting for records read in place on a store's I/O
/// queues that may still be moving.
inline bool cpu_landed(cpu_executor::handle_type const& h)
{ return !h.failed && (!h.io || h.io->poll(true) == io_status::succeeded); }
}  // namespace detail

/**
 * @brief The CPU engine's counterpart of the GPU `wait_layer` (`cache/gpu_policies.cuh`), so that
 *        engine code reads alike on both: it returns once the batch's loads landed (`cpu_executor`
 *        copies at once, except records read in place on a store's I/O queues). @return false when the batch's loads,
 * or an earlier batch's it reads, failed (call `complete`/`poll`: the controller sends the requests back to wait)
 * @throw strata::invalid_argument for a negative layer
 */
inline bool wait_layer(load_handle<cpu_executor::handle_type> const& loads, std::int64_t layer,
                       cpu_executor::stream_type = {})
{
  STRATA_EXPECTS(layer >= 0, "wait_layer: layer must not be negative, got ", layer);
  return std::all_of(loads.after.begin(), loads.after.end(), detail::cpu_landed) &&
         (!loads.transfer || detail::cpu_landed(*loads.transfer));
}

/**
 * @brief The CPU engine's counterpart of the GPU `wait_after`: returns once the loads still filling
 *        pages the finished request's page table points at (`prefill_result::after`) landed. Call it
 *        before reading the table (decode).
 * @return false when one of them failed: those pages hold garbage, `failed(id)` is already true;
 *         release the request and submit it again
 */
inline bool wait_after(prefill_result<cpu_executor::handle_type> const& r, cpu_executor::stream_type = {})
{ return std::all_of(r.after.begin(), r.after.end(), detail::cpu_landed); }

}  // namespace strata
