/**
 * @file sched/baselines.hpp
 * @brief The baseline strategies: `fifo`; `longest_prefix` (SGLang's default ordering, with its
 *        fallback to arrival order past 128 waiting) and `longest_prefix_sorted` (without it); and the
 *        classic queueing orders `sjf` (shortest prompt first, cache-blind) and `srpt` (shortest
 *        remaining uncached work first, from a probe of the index and the cost model).
 */
#pragma once

#include <strata/sched/toolkit.hpp>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <numeric>

namespace strata {

/// @brief First come, first served.
struct fifo {
  static constexpr char const* name = "fifo";  ///< for reports
  /// @brief The baselines do not mark transient prefixes.
  [[nodiscard]] static constexpr bool uses_transient_nodes() noexcept { return false; }
  /// @brief Waiting requests in arrival order, under the budget and the device memory.
  [[nodiscard]] batch_plan schedule(scheduler_view const& v) const
  {
    std::vector<std::size_t> order(v.waiting.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    return fill_in_order(v, order);
  }
};
static_assert(scheduler_strategy<fifo>);

/**
 * @brief SGLang's default order: most cached tokens first (arrival order breaks ties); with more
 *        than `max_sorted` waiting it falls back to arrival order, as SGLang does (its scheduler
 *        stops matching prefixes when the queue is long, to bound the time a round takes). Under
 *        heavy load this fallback, not the order itself, decides its TTFT: see docs/simulation.md
 *        and `longest_prefix_sorted`. No delay-hit handling, no balancing.
 */
struct longest_prefix {
  static constexpr char const* name = "longest_prefix";  ///< for reports
  std::size_t max_sorted = 128;                          ///< longest queue that is matched and sorted each round
  /// @brief The baselines do not mark transient prefixes.
  [[nodiscard]] static constexpr bool uses_transient_nodes() noexcept { return false; }
  /// @brief Waiting requests by cached prefix length, under the budget and the device memory.
  [[nodiscard]] batch_plan schedule(scheduler_view const& v) const
  {
    std::vector<std::size_t> order(v.waiting.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    if (v.waiting.size() <= max_sorted) {
      std::vector<std::int64_t> cached(v.waiting.size(), 0);
      for (std::size_t i = 0; i < v.waiting.size(); ++i) {
        if (!v.waiting[i].started) { cached[i] = v.tree->peek(v.waiting[i].tokens); }
      }
      std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return cached[a] > cached[b]; });
    }
    return fill_in_order(v, order);
  }
};
static_assert(scheduler_strategy<longest_prefix>);

/// @brief `longest_prefix` without the fallback: most cached tokens first at any queue length.
struct longest_prefix_sorted : longest_prefix {
  static constexpr char const* name = "longest_prefix_sorted";  ///< for reports
  longest_prefix_sorted() noexcept { max_sorted = std::numeric_limits<std::size_t>::max(); }
};
static_assert(scheduler_strategy<longest_prefix_sorted>);

/**
 * @brief Shortest job first: fewest prompt tokens first (arrival order breaks ties), blind to the
 *        cache. The classic queueing order that minimizes mean waiting when job sizes are known;
 *        it starves long prompts under heavy load (no aging).
 */
struct sjf {
  static constexpr char const* name = "sjf";  ///< for reports
  /// @brief The baselines do not mark transient prefixes.
  [[nodiscard]] static constexpr bool uses_transient_nodes() noexcept { return false; }
  /// @brief Waiting requests by prompt length, under the budget and the device memory.
  [[nodiscard]] batch_plan schedule(scheduler_view const& v) const
  {
    std::vector<std::size_t> order(v.waiting.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return v.waiting[a].prompt_tokens < v.waiting[b].prompt_tokens;
    });
    return fill_in_order(v, order);
  }
};
static_assert(scheduler_strategy<sjf>);

/**
 * @brief Shortest remaining processing time first, cache-aware: each waiting request is probed
 *        against the index (no use counted) and ranked by its predicted remaining work, the load
 *        of its cached prefix from lower tiers plus the compute of its uncached tokens
 *        (`cost_model::load_s`, `prefill_s`); arrival order breaks ties. Chunked prefills under way
 *        go first (they hold device memory), as for every baseline. No aging: long prompts can
 *        starve under heavy load.
 */
struct srpt {
  static constexpr char const* name = "srpt";  ///< for reports
  /// @brief The baselines do not mark transient prefixes.
  [[nodiscard]] static constexpr bool uses_transient_nodes() noexcept { return false; }
  /// @brief Predicted seconds of work left for waiting request `i` (load plus compute).
  [[nodiscard]] static double remaining_s(scheduler_view const& v, std::size_t i)
  {
    waiting_request const& r = v.waiting[i];
    if (r.started) { return v.costs->prefill_s(r.prompt_tokens - r.prefilled_tokens, r.prefilled_tokens); }
    return remaining_work_s(v, i, v.tree->probe(r.tokens));
  }
  /// @brief Waiting requests by predicted remaining work, under the budget and the device memory.
  [[nodiscard]] batch_plan schedule(scheduler_view const& v) const
  {
    std::vector<std::size_t> order(v.waiting.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::vector<double> rest(v.waiting.size());
    for (std::size_t i = 0; i < rest.size(); ++i) {
      rest[i] = remaining_s(v, i);
    }
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return rest[a] < rest[b]; });
    return fill_in_order(v, order);
  }
};
static_assert(scheduler_strategy<srpt>);

}  // namespace strata
