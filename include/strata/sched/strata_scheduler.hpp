/**
 * @file sched/strata_scheduler.hpp
 * @brief Strata's cache-aware strategy: delay-hit deferral, balanced batch formation, bubble filling.
 */
#pragma once

#include <strata/sched/scheduler.hpp>

#include <algorithm>

namespace strata {

/// @brief Switches and limits of `strata_scheduler`.
struct strata_options {
  bool delay_hits = true;  ///< defer a request whose prefix another is computing; it runs as a hit
  bool balance = true;     ///< pair load-heavy with compute-heavy requests so loads hide under compute
  bool bubbles = true;     ///< run decode steps while a load-bound batch waits for its loads
  int max_postponements = 2;  ///< rounds a load-heavy request may be passed over for balance
  std::size_t window = 128;   ///< oldest waiting requests considered per round
};

/**
 * @brief The Strata strategy.
 *
 * Each round: chunked prefills under way continue; then, oldest first (requests deferred for a
 * delay hit go first: they now run as hits),
 * - a request whose prefix matches another request's transient prefix of at least the index's
 *   delay-hit threshold is deferred (delay hit) instead of computing the same prefix twice;
 * - a request whose load would make the batch load-bound is postponed (at most
 *   `max_postponements` rounds) while compute-heavy requests later in the queue are added; then
 *   postponed ones are added if their load now hides under the batch's compute;
 * - if the batch stays load-bound, decode steps of running requests fill the predicted stall.
 * The token budget and device memory bound the batch as for the baselines.
 */
class strata_scheduler {
 public:
  static constexpr char const* name = "strata";  ///< for reports

  /**
   * @param options switches and limits
   * @throw strata::invalid_argument for a negative postponement limit or an empty window
   */
  explicit strata_scheduler(strata_options options = {}) : options_{options}
  {
    STRATA_EXPECTS(options.max_postponements >= 0, "strata_scheduler: max_postponements must not be negative, got ",
                   options.max_postponements);
    STRATA_EXPECTS(options.window > 0, "strata_scheduler: window must be positive");
  }

  /// @brief The options.
  [[nodiscard]] strata_options const& options() const noexcept { return options_; }
  /// @brief Delay hits need the engine to mark waiting prefixes as transient.
  [[nodiscard]] bool uses_transient_nodes() const noexcept { return options_.delay_hits; }

  /// @brief The next batch.
  [[nodiscard]] batch_plan schedule(scheduler_view const& v) const
  {
    batch_plan plan;
    std::int64_t budget = v.token_budget, memory = v.device_pages_available;
    std::array<std::int64_t, tier_count> loads{};
    for (std::size_t i = 0; i < v.waiting.size() && budget > 0; ++i) {
      if (v.waiting[i].started) { detail::add_item(v, plan, detail::size_item(v, i, budget), budget, memory, loads); }
    }
    // Candidates: the oldest `window` not started, those deferred for a delay hit first.
    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < v.waiting.size() && order.size() < options_.window; ++i) {
      if (!v.waiting[i].started) { order.push_back(i); }
    }
    std::stable_partition(order.begin(), order.end(), [&](std::size_t i) { return v.waiting[i].delay_hit_deferred; });

    std::vector<prefill_item> postponed;
    bool memory_full = false;
    for (std::size_t i : order) {
      waiting_request const& r = v.waiting[i];
      if (budget <= 0 || memory_full) {
        plan.deferred.push_back({i, r.id, memory_full ? deferral_reason::memory : deferral_reason::budget, {}});
        continue;
      }
      match_result const m = v.tree->match(r.tokens);
      if (options_.delay_hits && m.delay_hit && m.transient_owner != r.id) {
        plan.deferred.push_back({i, r.id, deferral_reason::delay_hit, m.transient_owner});
        continue;
      }
      prefill_item const it = detail::size_item(v, i, budget, &m);
      if (it.new_pages > memory) {
        memory_full = true;
        plan.deferred.push_back({i, r.id, deferral_reason::memory, {}});
        continue;
      }
      double const l = detail::item_load_s(v, it), c = detail::item_compute_s(v, it);
      bool const load_heavy = options_.balance && l > c;
      if (load_heavy && !hides(v, plan, loads, it) && r.deferrals < options_.max_postponements) {
        postponed.push_back(it);
        continue;
      }
      detail::add_item(v, plan, it, budget, memory, loads);
    }
    // Postponed load-heavy requests: in if their load now hides (or nothing else runs).
    for (std::size_t n = 0; n < postponed.size(); ++n) {
      prefill_item it = postponed[n];
      bool const fits = it.new_pages <= memory && budget > 0;
      if (fits && (plan.prefills.empty() || hides(v, plan, loads, it))) {
        if (it.chunk_tokens > budget) { it = detail::size_item(v, it.index, budget); }
        detail::add_item(v, plan, it, budget, memory, loads);
      } else {
        plan.deferred.push_back({it.index, it.id, fits ? deferral_reason::balance : deferral_reason::memory, {}});
      }
    }
    // Bubble filling: decode steps in the stall of a load-bound batch.
    if (options_.bubbles && v.running_sequences > 0 && !plan.prefills.empty()) {
      double const compute = plan.predicted_compute_s * (1 + v.costs->io().prefill_slowdown);
      double const stall = plan.predicted_load_s - compute;
      double const step = v.costs->decode_s(v.running_sequences, v.running_context_tokens) *
                          (1 + v.costs->io().decode_slowdown);
      if (stall > 0 && step > 0) {
        plan.bubble_decode_steps = std::min<std::int64_t>(static_cast<std::int64_t>(stall / step), v.running_max_remaining);
      }
    }
    return plan;
  }

 private:
  /// Whether the batch with `it` added still loads no longer than it computes.
  static bool hides(scheduler_view const& v, batch_plan const& plan, std::array<std::int64_t, tier_count> loads,
                    prefill_item const& it)
  {
    for (std::size_t t = 0; t < tier_count; ++t) { loads[t] += it.load_pages[t]; }
    return v.costs->load_s(loads) <= plan.predicted_compute_s + detail::item_compute_s(v, it);
  }

  strata_options options_;
};
static_assert(scheduler_strategy<strata_scheduler>);

}  // namespace strata
