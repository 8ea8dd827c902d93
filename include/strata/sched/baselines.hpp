/**
 * @file sched/baselines.hpp
 * @brief The baseline strategies: `fifo`, and `longest_prefix` (SGLang's default ordering).
 */
#pragma once

#include <strata/sched/toolkit.hpp>

#include <algorithm>

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
    for (std::size_t i = 0; i < order.size(); ++i) {
      order[i] = i;
    }
    return fill_in_order(v, order);
  }
};
static_assert(scheduler_strategy<fifo>);

/**
 * @brief SGLang's default order: most cached tokens first (arrival order breaks ties); with more
 *        than `max_sorted` waiting it falls back to arrival order, as SGLang does. No delay-hit
 *        handling, no balancing.
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
    for (std::size_t i = 0; i < order.size(); ++i) {
      order[i] = i;
    }
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

}  // namespace strata
