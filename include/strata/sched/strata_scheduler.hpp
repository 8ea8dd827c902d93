/**
 * @file sched/strata_scheduler.hpp
 * @brief Strata's cache-aware strategy: least remaining work first with deadlines, delay-hit
 *        deferral, a balanced budget, bubble filling.
 */
#pragma once

#include <strata/detail/radix_sort.hpp>
#include <strata/sched/toolkit.hpp>

#include <algorithm>
#include <limits>
#include <unordered_map>

namespace strata {

/// @brief The order `strata_scheduler` forms batches in, before its three ideas act.
enum class strata_order {
  /// Least predicted remaining work first (load of the cached prefix from lower tiers plus compute
  /// of the uncached tokens: cache-aware SRPT), with a deadline per request so that none starves.
  remaining_work,
  /// longest_prefix's order (SGLang's default, arrival order beyond `max_sorted` waiting) among the
  /// oldest `window`: the strategy before issue 11, kept for comparison.
  longest_prefix,
};

/// @brief Switches and limits of `strata_scheduler`.
struct strata_options {
  strata_order order = strata_order::remaining_work;  ///< the base order
  /// With `remaining_work`: when first seen, a request gets a deadline `deadline_slack` times the
  /// predicted prefill work of every request then waiting that arrived no later (its own
  /// included) ahead on the strategy's own clock, the predicted work of the plans it made (with 1:
  /// when first-come-first-served would have finished it). A request past its deadline goes first
  /// (earliest deadline first, within half the budget while others wait), so the remaining-work order
  /// never holds a prompt beyond `deadline_slack` times its first-come-first-served wait (0: no
  /// deadlines). A starvation guard, not a tail optimizer: measured in docs/simulation.md, deadlines
  /// that bind (1, 2, 4) turn transient overloads into first-come-first-served (multi-turn at 95%:
  /// p90 8x, p99 2-3x those without) and buy long documents' p99 only with their mean; the default,
  /// 64, binds on none of the measured workloads but bounds any wait.
  double deadline_slack = 64.0;
  bool delay_hits = true;  ///< defer a request whose prefix another is computing; it runs as a hit
  /// Balanced batches: short prefills (hits and short prompts: with `remaining_work`, those that
  /// complete within half the budget; with `longest_prefix` order, see `short_percent`) ride beside
  /// chunked prefills under way, within half the budget, instead of waiting for all their chunks
  /// (a hit's load then hides under the chunk's compute); with `longest_prefix` order also beside
  /// long prompts not yet started. Off: chunked prefills under way take the budget first.
  bool balance = true;
  bool bubbles = true;  ///< run decode steps while a batch waits for its loads (`cost_model::stall_s`)
  /// With balance on, load trimming: rounds a load-heavy request may be passed over while the batch
  /// loads longer than it computes (0, the default: never; measured in docs/simulation.md, it moved
  /// mean TTFT by under 1% and raised multi-turn's p90 by 2.3%: it postpones loads, it hides none).
  int max_postponements = 0;
  /// Oldest waiting requests considered per round (with `longest_prefix` order; `remaining_work`
  /// ranks every waiting request, it would otherwise not be SRPT).
  std::size_t window = 128;
  /// Longest queue ordered by cached prefix; beyond it, arrival order (longest_prefix's fallback,
  /// so that what strata adds to longest_prefix is its three ideas only).
  std::size_t max_sorted = 128;
  /// With balance on: prefills of at most this share of the token budget (hits and short prompts)
  /// go before chunked prefills under way, using at most half the budget while long ones wait
  /// (0: none do; balance is then load trimming alone, if `max_postponements` allows it). The
  /// share's size is this with `longest_prefix` order; with `remaining_work`, whatever completes
  /// within half the budget is short (0 still switches the share off).
  std::int64_t short_percent = 25;
};

/**
 * @brief The Strata strategy.
 *
 * By default (`strata_order::remaining_work`) built on cache-aware least-remaining-work order: each
 * waiting request is probed and ranked by its predicted load from lower tiers plus the compute of
 * its uncached tokens, divided by the number of requests it serves (itself and the delay hits
 * waiting for its prefix: Smith's rule, so a prompt whose prefix others wait on carries them);
 * requests past their deadline (`deadline_slack`) go first, earliest deadline first, within half
 * the budget while others wait, so that none starves. Chunked prefills under way go before every
 * request not yet started (they hold their device pages); with `balance`, short prefills ride
 * beside them within half the budget.
 *
 * With `strata_order::longest_prefix` (the strategy before issue 11), built on longest_prefix's
 * order (SGLang's default: longest cached prefix first, arrival order beyond `max_sorted`
 * waiting), among the oldest `window` waiting requests, with balance as below.
 *
 * On either order:
 * - delay hits: a request whose prefix matches another request's transient prefix of at least the
 *   index's delay-hit threshold is deferred instead of computing the same prefix twice, and goes
 *   first in a later round, when it runs as a hit;
 * - balance: short prefills (cache hits, short prompts: with the remaining-work order, those that
 *   complete within half the budget; with longest_prefix's, up to `short_percent` of it) go
 *   before chunked prefills under way, taking at most half the budget, so that a hit rides with a
 *   long prompt's compute instead of waiting for all its chunks; optionally (`max_postponements`
 *   > 0), while the batch loads longer than it computes, load-heavy requests beyond the first wait
 *   for a later batch (at most `max_postponements` rounds);
 * - bubbles: decode steps of running requests fill the time the batch waits for its loads
 *   (`cost_model::stall_s`: in practice load-bound batches; a compute-bound one stalls only for
 *   its first layer's load, shorter than a decode step).
 * The token budget and device memory bound the batch as for the baselines.
 */
class strata_scheduler {
  /// What the strategy keeps of a waiting request between rounds.
  struct request_memo {
    std::uint64_t submission = 0;  // which submission of the id it is kept for
    probe_memo probe;              // its last probe, reused while its path is unchanged
    double deadline = 0;           // remaining_work order
    std::uint64_t dated = 0;  // the last round that ranked it by deadline, 0: none (the deadline holds while it stays)
    std::uint64_t seen = 0;   // the last round that looked at it
  };

 public:
  static constexpr char const* name = "strata";  ///< for reports

  /// @brief The defaults (`strata_options{}`); implicit, so that `scheduler = {}` default arguments work.
  strata_scheduler() : strata_scheduler(strata_options{}) {}
  /**
   * @param options switches and limits
   * @throw strata::invalid_argument for a negative postponement limit, an empty window or a short
   *        share outside [0, 100]
   */
  explicit strata_scheduler(strata_options options) : options_{options}
  {
    STRATA_EXPECTS(options.max_postponements >= 0, "strata_scheduler: max_postponements must not be negative, got ",
                   options.max_postponements);
    STRATA_EXPECTS(options.window > 0, "strata_scheduler: window must be positive");
    STRATA_EXPECTS(options.short_percent >= 0 && options.short_percent <= 100,
                   "strata_scheduler: short_percent must be in [0, 100], got ", options.short_percent);
    STRATA_EXPECTS(options.deadline_slack >= 0 && options.deadline_slack < std::numeric_limits<double>::infinity(),
                   "strata_scheduler: deadline_slack must be finite and not negative, got ", options.deadline_slack);
  }

  /// @brief The options.
  [[nodiscard]] strata_options const& options() const noexcept { return options_; }
  /// @brief Delay hits need the engine to mark waiting prefixes as transient.
  [[nodiscard]] bool uses_transient_nodes() const noexcept { return options_.delay_hits; }

  /// @brief The next batch.
  [[nodiscard]] batch_plan schedule(scheduler_view const& v) const
  {
    batch_plan plan;
    plan.deferred.reserve(v.waiting.size());
    std::int64_t budget = v.token_budget, memory = v.device_pages_available;
    std::array<std::int64_t, tier_count> loads{};
    // Candidates: chunked prefills under way (they hold memory: always), and the oldest `window`
    // new requests, probed (no side effects) and matched (a use of their prefix) only when they
    // join the batch.
    // Probes go through a memo per request, kept across rounds: a request whose path did not
    // change since the last round is not walked again (`hiradix_tree::probe(tokens, memo)`).
    ++round_;
    std::vector<std::size_t> fresh, started;
    std::vector<match_result> matches(v.waiting.size());
    std::vector<request_memo*> kept(v.waiting.size(), nullptr);  // stable: the map's nodes stay put
    auto const memo_of = [&](std::size_t i) -> request_memo& {
      request_memo& e = requests_[v.waiting[i].id.value];
      if (e.submission != v.waiting[i].submission) {  // the id came back with another prompt: a new request
        e = request_memo{};
        e.submission = v.waiting[i].submission;
      }
      e.seen = round_;
      kept[i] = &e;
      return e;
    };
    auto const probe = [&](std::size_t i) { matches[i] = v.tree->probe(v.waiting[i].tokens, memo_of(i).probe); };
    for (std::size_t i = 0; i < v.waiting.size(); ++i) {
      if (v.waiting[i].started) {
        started.push_back(i);
        (void)memo_of(i);
      } else if (fresh.size() < options_.window || options_.order == strata_order::remaining_work) {
        fresh.push_back(i);
        probe(i);
      }
    }
    // A delay hit waits for the request computing its prefix: that request must be a candidate,
    // even from outside the window (a younger request may own the prefix an older one needs), or
    // a window full of delay hits would stall.
    std::unordered_map<std::uint64_t, std::size_t> at;  // request id -> position in the view, once delay hits need it
    auto const positions = [&]() -> std::unordered_map<std::uint64_t, std::size_t> const& {
      if (at.empty()) {
        at.reserve(v.waiting.size());
        for (std::size_t i = 0; i < v.waiting.size(); ++i) {
          at.emplace(v.waiting[i].id.value, i);
        }
      }
      return at;
    };
    if (options_.delay_hits) {
      std::vector<request_id> owners;
      for (auto i : fresh) {
        if (matches[i].delay_hit && matches[i].transient_owner != v.waiting[i].id) {
          owners.push_back(matches[i].transient_owner);
        }
      }
      if (!owners.empty()) {  // linear in the waiting requests, whatever the number of delay hits
        auto const& where = positions();
        std::vector<char> in_fresh(v.waiting.size(), 0);
        for (auto i : fresh) {
          in_fresh[i] = 1;
        }
        for (auto const id : owners) {
          auto const it = where.find(id.value);
          if (it == where.end()) { continue; }
          std::size_t const i = it->second;
          if (!v.waiting[i].started && !in_fresh[i]) {
            in_fresh[i] = 1;
            fresh.push_back(i);
            probe(i);
          }
        }
      }
    }
    // Short: with the remaining-work order, a prefill that completes within balance's share (half
    // the budget), so that the share starts no second chunked prefill; with longest_prefix's order,
    // `short_percent` of the budget (as before issue 11).
    // (Written so that any budget up to INT64_MAX, "unlimited", cannot overflow.)
    std::int64_t const short_share = std::max<std::int64_t>(1, v.token_budget / 2 + v.token_budget % 2);
    std::int64_t const short_tokens =
        options_.order == strata_order::remaining_work
            ? short_share
            : std::max<std::int64_t>(1, v.token_budget / 100 * options_.short_percent +
                                            v.token_budget % 100 * options_.short_percent / 100);
    std::vector<std::size_t> order;
    std::vector<char> overdue(v.waiting.size(), 0);  // remaining_work order: past their deadline
    auto rank = [&](std::size_t i) {
      if (v.waiting[i].delay_hit_deferred) { return 0; }
      std::int64_t const rest = v.waiting[i].prompt_tokens - cached_tokens_of(v, i, matches[i]);
      return options_.balance && options_.short_percent > 0 && rest <= short_tokens ? 1 : 3;
    };
    if (options_.order == strata_order::remaining_work) {
      // Chunked prefills under way first (they hold their device pages and their first token waits
      // on them); with balance, short prefills before them within half the budget (below).
      std::vector<std::size_t> const ranked =
          remaining_work_order(v, fresh, started, matches, kept, overdue, positions);
      bool const share = options_.balance && options_.short_percent > 0 && !started.empty();
      for (std::size_t i : ranked) {
        if (share && !v.waiting[i].started && rank(i) < 3) { order.push_back(i); }
      }
      for (std::size_t i : ranked) {
        if (v.waiting[i].started) { order.push_back(i); }
      }
      for (std::size_t i : ranked) {
        if (!v.waiting[i].started && !(share && rank(i) < 3)) { order.push_back(i); }
      }
    } else {
      // Order: delay-hit deferrals (they now run as hits), then short prefills (hits and short
      // prompts), then chunked prefills under way, then long ones; longest cached prefix first within.
      bool const by_prefix = v.waiting.size() <= options_.max_sorted;
      std::stable_sort(fresh.begin(), fresh.end(), [&](std::size_t a, std::size_t b) {
        if (rank(a) != rank(b)) { return rank(a) < rank(b); }
        return by_prefix && matches[a].tokens > matches[b].tokens;
      });
      std::size_t f = 0;
      while (f < fresh.size() && rank(fresh[f]) < 3) {
        order.push_back(fresh[f++]);
      }
      order.insert(order.end(), started.begin(), started.end());
      order.insert(order.end(), fresh.begin() + std::ptrdiff_t(f), fresh.end());
    }

    // One class of requests takes at most half the budget while the others wait, so that neither
    // starves. Balance: short prefills (hits, short prompts) beside the long ones (longest_prefix's
    // order) or beside the chunked prefills under way (remaining-work order, where short work
    // otherwise goes first anyway): a hit's load then hides under the chunk's compute, and neither
    // waits for the other. With the remaining-work order also: requests past their deadline beside
    // the rest (SRPT keeps half).
    bool const by_work = options_.order == strata_order::remaining_work;
    std::int64_t short_used = 0, overdue_used = 0;
    bool long_waiting = !started.empty();
    std::size_t n_overdue = 0;
    for (std::size_t i : fresh) {
      long_waiting = long_waiting || (!by_work && rank(i) == 3);
    }
    for (std::size_t i : order) {
      n_overdue += overdue[i] != 0;
    }
    bool const others_waiting = long_waiting;                   // for the balance share
    bool const not_overdue_waiting = n_overdue < order.size();  // for the deadline share
    // Pages the chunked prefills under way will take this round (at most a full budget's chunk
    // each), kept from the new requests ordered before them: freed pages go to them first.
    std::int64_t unreserved = v.device_pages_unreserved, owed = 0;
    std::vector<std::int64_t> owes;  // by position; only with pages by chunk (this runs every step)
    if (v.pages_by_chunk) {
      owes.assign(v.waiting.size(), 0);
      for (std::size_t i : started) {
        owes[i] = size_item(v, i, v.token_budget).new_pages;
        owed += owes[i];
      }
    }
    bool memory_full = false;
    std::vector<std::size_t> capped;
    for (std::size_t i : order) {
      waiting_request const& r = v.waiting[i];
      if (!r.started) {
        match_result const& m = matches[i];
        if (options_.delay_hits && m.delay_hit && m.transient_owner != r.id) {
          plan.deferred.push_back({i, r.id, deferral_reason::delay_hit, m.transient_owner});
          continue;
        }
      }
      if (budget <= 0 || (memory_full && !r.started)) {  // a chunked prefill under way holds its memory
        if (!r.started) {
          plan.deferred.push_back({i, r.id, budget <= 0 ? deferral_reason::budget : deferral_reason::memory, {}});
        }
        continue;
      }
      // A chunked prefill under way is never capped (it holds its memory: capping could leave it
      // neither planned nor progressing).
      bool const is_short = !r.started && options_.balance && rank(i) < 3;
      bool const is_overdue = by_work && !r.started && overdue[i] != 0;
      std::int64_t cap = budget;
      if (is_short && others_waiting) { cap = std::min(cap, short_share - short_used); }
      if (is_overdue && not_overdue_waiting) { cap = std::min(cap, short_share - overdue_used); }
      if (cap <= 0) {
        capped.push_back(i);  // may still get what the long ones leave
        continue;
      }
      if (r.started) {  // sized by the pages it can have; short of them, new requests wait
        prefill_item const it = size_item(v, i, cap, nullptr, memory);
        owed -= owes.empty() ? 0 : owes[i];
        memory_full = memory_full || it.chunk_tokens < std::min(cap, r.prompt_tokens - r.prefilled_tokens);
        if (it.chunk_tokens > 0) { add_item(v, plan, it, budget, memory, loads); }
        continue;
      }
      prefill_item it = size_item(v, i, cap, &matches[i]);
      it.probe = &kept[i]->probe;
      if (!fits(v, it, memory - owed, unreserved)) {
        memory_full = true;
        plan.deferred.push_back({i, r.id, deferral_reason::memory, {}});
        continue;
      }
      if (is_short) { short_used += it.chunk_tokens; }
      if (is_overdue) { overdue_used += it.chunk_tokens; }
      unreserved -= reserved_pages(v, it);
      add_item(v, plan, it, budget, memory, loads);
    }
    // Budget the long ones left unused goes to the short ones that were capped.
    for (std::size_t i : capped) {
      waiting_request const& r = v.waiting[i];
      prefill_item it = budget > 0 && !memory_full ? size_item(v, i, budget, &matches[i]) : prefill_item{};
      it.probe = &kept[i]->probe;
      if (budget <= 0 || memory_full || !fits(v, it, memory, unreserved)) {
        memory_full = memory_full || budget > 0;
        plan.deferred.push_back({i, r.id, budget <= 0 ? deferral_reason::budget : deferral_reason::memory, {}});
        continue;
      }
      unreserved -= reserved_pages(v, it);
      add_item(v, plan, it, budget, memory, loads);
    }
    if (options_.balance) { trim_loads(v, plan, loads); }
    // Forget the requests that left (now and then: their memos cost nothing until then).
    if (requests_.size() > 2 * v.waiting.size() + 64) {
      std::erase_if(requests_, [&](auto const& e) { return e.second.seen != round_; });
    }
    return plan;
  }

  /**
   * @brief Once the plan is matched (`plan_batch`): counts the work it planned (the deadlines'
   *        clock) and fills a load-bound batch's stall with decode steps (bubble filling).
   */
  void finish_plan(scheduler_view const& v, batch_plan& plan) const
  {
    for (auto const& it : plan.prefills) {
      served_s_ += item_load_s(v, it) + item_compute_s(v, it);
    }
    // Bubble filling: decode steps in the batch's stall (the GPU waiting for loads).
    if (options_.bubbles && v.running_sequences > 0 && !plan.prefills.empty()) {
      double const stall =
          v.costs->stall_s(plan.predicted_load_s, plan.predicted_compute_s, plan.predicted_serial_load_s);
      double const step =
          v.costs->decode_s(v.running_sequences, v.running_context_tokens) * (1 + v.costs->io().decode_slowdown);
      if (stall > 0 && step > 0) {
        plan.bubble_decode_steps =
            static_cast<std::int64_t>(std::min(stall / step, static_cast<double>(v.running_max_remaining)));
      }
    }
  }

 private:
  /// Predicted seconds of work left for waiting request `i` whose probe is `m`: its load from lower
  /// tiers plus the compute of its uncached tokens (a chunked prefill under way: its rest). A delay
  /// hit counts the prefix another request computes as cached: that work is the other's.
  static double remaining_s(scheduler_view const& v, std::size_t i, match_result const& m)
  {
    waiting_request const& r = v.waiting[i];
    if (r.started) { return v.costs->prefill_s(r.prompt_tokens - r.prefilled_tokens, r.prefilled_tokens); }
    if (!m.delay_hit || m.transient_owner == r.id) { return remaining_work_s(v, i, m); }
    std::int64_t const cached = std::min(r.prompt_tokens - 1, cached_tokens_of(v, i, m) + m.transient_tokens);
    return v.costs->load_s(load_pages_of(v, m)) + v.costs->prefill_s(r.prompt_tokens - cached, cached);
  }

  /**
   * The remaining-work order with deadlines: delay-hit deferrals first (they now run as hits), then
   * requests past their deadline (earliest first), then the rest by predicted remaining work per
   * request served (arrival order breaks ties); `overdue` marks the second group. The deadlines'
   * clock is the predicted work of the plans made so far, not time: the view carries no time, and
   * decode steps between batches would otherwise count as waiting that first-come-first-served
   * order would not have avoided. `started` and `fresh` hold every waiting request (this order
   * ranks them all), so `positions()` (id -> position in the view) finds any owner among them.
   */
  std::vector<std::size_t> remaining_work_order(scheduler_view const& v, std::vector<std::size_t> const& fresh,
                                                std::vector<std::size_t> const& started,
                                                std::vector<match_result> const& matches,
                                                std::vector<request_memo*>& kept, std::vector<char>& overdue,
                                                auto const& positions) const
  {
    std::vector<std::size_t> all = started;
    all.insert(all.end(), fresh.begin(), fresh.end());
    std::sort(all.begin(), all.end());  // arrival order
    std::vector<double> rest(v.waiting.size(), 0);
    for (std::size_t i : all) {
      rest[i] = remaining_s(v, i, matches[i]);
    }
    // Deadlines of requests seen for the first time (or not in the round before: they left).
    std::vector<double> deadline(v.waiting.size(), 0.0);
    double ahead = 0;  // predicted work of the requests waiting now that arrived no later
    for (std::size_t i : all) {
      ahead += rest[i];
      request_memo& e = *kept[i];
      if (e.dated == 0 || e.dated + 1 != round_) { e.deadline = served_s_ + options_.deadline_slack * ahead; }
      e.dated = e.seen = round_;
      deadline[i] = e.deadline;
    }
    // A request others wait on as delay hits carries them: its deadline is the earliest of theirs and
    // its own, and its rank is its work per request it serves (Smith's rule: the order that
    // minimizes mean completion time when finishing one job finishes several).
    std::vector<double> weight(v.waiting.size(), 1.0);
    for (std::size_t i : all) {
      match_result const& m = matches[i];
      if (v.waiting[i].started || !m.delay_hit || m.transient_owner == v.waiting[i].id) { continue; }
      auto const& position = positions();  // id -> position, built once a round when delay hits wait
      auto const owner = position.find(m.transient_owner.value);
      if (owner == position.end()) { continue; }
      weight[owner->second] += 1;
      deadline[owner->second] = std::min(deadline[owner->second], deadline[i]);
    }
    bool const aging = options_.deadline_slack > 0;
    struct ranked {
      std::uint64_t value;  // `detail::ordered_key` of the value within the group
      std::uint32_t i;
      std::uint8_t group;
    };
    std::vector<ranked> keys, scratch;
    keys.reserve(all.size());
    for (std::size_t i : all) {
      waiting_request const& r = v.waiting[i];
      if (r.delay_hit_deferred && !r.started) {
        keys.push_back({detail::ordered_key(0.0), std::uint32_t(i), 0});
      } else if (aging && deadline[i] <= served_s_) {
        keys.push_back({detail::ordered_key(deadline[i]), std::uint32_t(i), 1});
      } else {
        keys.push_back({detail::ordered_key(rest[i] / weight[i]), std::uint32_t(i), 2});
      }
    }
    // By group, then value, then arrival order (`all`'s): two stable radix sorts, least
    // significant first.
    detail::stable_radix_sort(keys, scratch, [](ranked const& k) { return k.value; });
    detail::stable_radix_sort<1>(keys, scratch, [](ranked const& k) { return std::uint64_t{k.group}; });
    for (std::size_t k = 0; k < keys.size(); ++k) {
      all[k] = keys[k].i;
      overdue[keys[k].i] = keys[k].group == 1;
    }
    return all;
  }

  /**
   * Load trimming: while the batch loads longer than it computes, the lowest-priority request that
   * loads more than it computes waits for a later batch (never the only one, never one already
   * passed over `max_postponements` times, for any reason): its load would delay the whole batch.
   */
  void trim_loads(scheduler_view const& v, batch_plan& plan, std::array<std::int64_t, tier_count>& loads) const
  {
    auto load_heavy = [&](prefill_item const& it) {
      return it.first_chunk && item_load_s(v, it) > item_compute_s(v, it);
    };
    for (;;) {
      if (plan.predicted_load_s <= plan.predicted_compute_s) { return; }
      std::size_t heavy = 0, victim = plan.prefills.size();
      for (std::size_t k = 0; k < plan.prefills.size(); ++k) {
        if (!load_heavy(plan.prefills[k])) { continue; }
        ++heavy;
        if (v.waiting[plan.prefills[k].index].deferrals < options_.max_postponements) { victim = k; }
      }
      if (heavy <= 1 || victim == plan.prefills.size()) { return; }
      prefill_item const it = plan.prefills[victim];
      plan.prefills.erase(plan.prefills.begin() + std::ptrdiff_t(victim));
      for (std::size_t t = 0; t < tier_count; ++t) {
        loads[t] -= it.load_pages[t];
      }
      plan.predicted_compute_s -= item_compute_s(v, it);
      plan.predicted_load_s = v.costs->load_s(loads);
      plan.predicted_serial_load_s = v.costs->serial_load_s(loads);
      plan.deferred.push_back({it.index, it.id, deferral_reason::balance, {}});
    }
  }

  strata_options options_;
  mutable double served_s_ = 0;      // predicted prefill work (load + compute) of every plan made: the deadlines' clock
  mutable std::uint64_t round_ = 0;  // schedule calls made
  mutable std::unordered_map<std::uint64_t, request_memo> requests_;  // request id -> what is kept of it
};
static_assert(plan_finishing_strategy<strata_scheduler>);

}  // namespace strata
