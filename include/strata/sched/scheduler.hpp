/**
 * @file sched/scheduler.hpp
 * @brief What a scheduler strategy sees (waiting requests, the prefix index, running decodes, costs)
 *        and what it returns (a batch plan); the `scheduler_strategy` concept.
 */
#pragma once

#include <strata/index/hiradix_tree.hpp>
#include <strata/sched/cost_model.hpp>

#include <algorithm>
#include <array>
#include <concepts>
#include <cstdint>
#include <span>
#include <vector>

namespace strata {

/// @brief A request waiting for (the rest of) its prefill.
struct waiting_request {
  request_id id{};
  double arrival_s = 0;                  ///< arrival time
  std::span<std::int32_t const> tokens;  ///< what the index holds: token ids, or one id per page
  std::int64_t prompt_tokens = 0;        ///< tokens to prefill in all
  std::int64_t output_tokens = 0;        ///< tokens to generate
  std::int64_t prefilled_tokens = 0;     ///< tokens already cached or computed (prefill under way)
  std::int64_t cached_tokens = 0;        ///< tokens found cached when its prefill started
  bool started = false;                  ///< its first chunk ran (loads done, device pages held)
  int deferrals = 0;                     ///< rounds it was passed over
  bool delay_hit_deferred = false;       ///< last passed over for a delay hit: goes first next round
};

/// @brief Why a request was passed over this round.
enum class deferral_reason {
  delay_hit,  ///< another request computes its prefix: it runs as a hit once that commits
  balance,    ///< its load would make the batch load-bound: waits for compute to hide it under
  memory,     ///< not enough device pages now
  budget,     ///< the token budget is spent
  changed,    ///< what it found cached changed while the batch was formed: sized again next round
};

/// @brief One prefill (or one chunk of it) in a batch.
struct prefill_item {
  std::size_t index = 0;                              ///< position in the view's waiting list
  request_id id{};                                    ///< the request
  std::int64_t chunk_tokens = 0;                      ///< tokens computed this round
  std::int64_t context_tokens = 0;                    ///< tokens before the chunk (cached or computed)
  std::int64_t cached_tokens = 0;                     ///< prefix found cached (first chunk)
  std::array<std::int64_t, tier_count> load_pages{};  ///< pages to load from each tier (first chunk)
  std::int64_t new_pages = 0;                         ///< device pages the request needs (first chunk)
  bool first_chunk = false;                           ///< its loads run now
  bool last_chunk = false;                            ///< its first token comes out of this batch
  node_ref cached_node{};  ///< deepest cached node (first chunk), ending where the prefix ends: set by the final match
};

/// @brief A request passed over.
struct deferral {
  std::size_t index = 0;  ///< position in the view's waiting list
  request_id id{};
  deferral_reason reason{};
  request_id waiting_for{};  ///< the request computing its prefix (delay hits)
};

/// @brief What runs next.
struct batch_plan {
  std::vector<prefill_item> prefills;
  std::vector<deferral> deferred;
  std::int64_t bubble_decode_steps = 0;  ///< decode steps to run while the batch waits for its loads
  double predicted_load_s = 0;           ///< loads of the batch's first chunks
  double predicted_compute_s = 0;        ///< compute of all its chunks
  [[nodiscard]] std::int64_t tokens() const noexcept
  {
    std::int64_t n = 0;
    for (auto const& p : prefills) {
      n += p.chunk_tokens;
    }
    return n;
  }
};

/**
 * @brief The state a strategy decides on. The engine (or the simulator) fills it each round.
 */
struct scheduler_view {
  std::span<waiting_request> waiting;       ///< in arrival order
  hiradix_tree* tree = nullptr;             ///< the prefix index (strategies `probe`, and `match` the final plan)
  cost_model const* costs = nullptr;        ///< predictions
  std::int64_t index_scale = 1;             ///< real tokens per index token (page_tokens when the index holds page ids)
  std::int64_t page_tokens = 32;            ///< real tokens per page
  std::int64_t token_budget = 8192;         ///< most tokens computed per batch
  std::int64_t device_pages_available = 0;  ///< free device pages plus those eviction could free
  std::int64_t running_sequences = 0;       ///< requests decoding
  std::int64_t running_context_tokens = 0;  ///< their context
  std::int64_t running_max_remaining = 0;   ///< most decode steps any of them still needs
};

/**
 * @brief A scheduling policy: `s.schedule(view)` returns the next batch plan; `S::name` names it;
 *        `s.uses_transient_nodes()` says whether the engine marks waiting requests' prefixes as
 *        transient in the index (needed for delay hits).
 */
template <class S>
concept scheduler_strategy = requires(S& s, scheduler_view const& v)
{
  {
    s.schedule(v)
    } -> std::same_as<batch_plan>;
  {
    S::name
    } -> std::convertible_to<char const*>;
  {
    s.uses_transient_nodes()
    } -> std::convertible_to<bool>;
};

namespace detail {

/// @brief Prompt tokens of waiting request `i` found cached by match `m`: at least the last token is
///        computed (it produces the first output token).
inline std::int64_t cached_tokens_of(scheduler_view const& v, std::size_t i, match_result const& m)
{
  return std::min(m.tokens * v.index_scale, v.waiting[i].prompt_tokens - 1);
}

/// @brief Pages match `m` brings onto the device, from the fastest lower tier holding each.
inline std::array<std::int64_t, tier_count> load_pages_of(scheduler_view const& v, match_result const& m)
{
  std::array<std::int64_t, tier_count> pages{};
  for (std::size_t t = 1; t < tier_count; ++t) {
    pages[t] = m.fastest_tokens[t] * v.index_scale / v.page_tokens;
  }
  return pages;
}

/// @brief Device pages a request's first chunk takes: its uncached prompt pages (the partial tail
///        included), the cached pages loaded from lower tiers, and its output's pages.
inline std::int64_t first_chunk_pages(std::int64_t prompt_tokens, std::int64_t output_tokens, std::int64_t cached_pages,
                                      std::int64_t loaded_pages, std::int64_t page_tokens)
{
  return (prompt_tokens + page_tokens - 1) / page_tokens - cached_pages + loaded_pages +
         (output_tokens + page_tokens - 1) / page_tokens;
}

/// @brief Sizes a request's next chunk (at most `budget` tokens) from a probe of the index (`known`
///        if the caller already probed): no use is counted until `match_plan`.
inline prefill_item size_item(scheduler_view const& v, std::size_t i, std::int64_t budget,
                              match_result const* known = nullptr)
{
  waiting_request const& r = v.waiting[i];
  prefill_item it;
  it.index = i;
  it.id = r.id;
  if (r.started) {  // a chunked prefill under way: no loads, no new pages
    it.chunk_tokens = std::min(budget, r.prompt_tokens - r.prefilled_tokens);
    it.context_tokens = r.prefilled_tokens;
    it.last_chunk = r.prefilled_tokens + it.chunk_tokens == r.prompt_tokens;
    return it;
  }
  match_result const m = known != nullptr ? *known : v.tree->probe(r.tokens);
  it.cached_tokens = cached_tokens_of(v, i, m);
  it.first_chunk = true;
  it.context_tokens = it.cached_tokens;
  it.chunk_tokens = std::min(budget, r.prompt_tokens - it.cached_tokens);
  it.last_chunk = it.cached_tokens + it.chunk_tokens == r.prompt_tokens;
  std::int64_t const cached_pages = m.tokens * v.index_scale / v.page_tokens;
  it.load_pages = load_pages_of(v, m);
  std::int64_t loads = 0;
  for (auto p : it.load_pages) {
    loads += p;
  }
  it.new_pages = first_chunk_pages(r.prompt_tokens, r.output_tokens, cached_pages, loads, v.page_tokens);
  return it;
}

inline double item_compute_s(scheduler_view const& v, prefill_item const& it)
{
  return v.costs->prefill_s(it.chunk_tokens, it.context_tokens);
}

inline double item_load_s(scheduler_view const& v, prefill_item const& it)
{
  return it.first_chunk ? v.costs->load_s(it.load_pages) : 0.0;
}

/// @brief Adds an item to the plan, updating budget, memory and predictions.
inline void add_item(scheduler_view const& v, batch_plan& plan, prefill_item const& it, std::int64_t& budget,
                     std::int64_t& memory, std::array<std::int64_t, tier_count>& loads)
{
  plan.prefills.push_back(it);
  budget -= it.chunk_tokens;
  memory -= it.first_chunk ? it.new_pages : 0;
  for (std::size_t t = 0; t < tier_count; ++t) {
    loads[t] += it.first_chunk ? it.load_pages[t] : 0;
  }
  plan.predicted_compute_s += item_compute_s(v, it);
  plan.predicted_load_s = v.costs->load_s(loads);
}

/**
 * @brief Matches the final plan's first chunks against the index: a use of each cached prefix (hits,
 *        LRU, selective backups) and the split that makes `cached_node` end where the prefix ends.
 *        Called once the plan is final, so requests ranked or passed over are never counted as uses.
 *
 * A match can change what a later item finds (a selective backup may evict host pages another item
 * was to load): an item whose match no longer agrees with its probe leaves the plan
 * (`deferral_reason::changed`) and is sized afresh next round; the predictions are recomputed.
 */
inline batch_plan match_plan(scheduler_view const& v, batch_plan plan)
{
  std::vector<prefill_item> kept;
  std::array<std::int64_t, tier_count> loads{};
  plan.predicted_compute_s = 0;
  for (auto& it : plan.prefills) {
    if (it.first_chunk) {
      match_result const m = v.tree->match(v.waiting[it.index].tokens);
      if (cached_tokens_of(v, it.index, m) != it.cached_tokens || load_pages_of(v, m) != it.load_pages) {
        plan.deferred.push_back({it.index, it.id, deferral_reason::changed, {}});
        continue;
      }
      it.cached_node = m.node;
      for (std::size_t t = 0; t < tier_count; ++t) {
        loads[t] += it.load_pages[t];
      }
    }
    plan.predicted_compute_s += item_compute_s(v, it);
    kept.push_back(it);
  }
  plan.prefills = std::move(kept);
  plan.predicted_load_s = v.costs->load_s(loads);
  return plan;
}

/**
 * @brief The fill both baselines use: chunked prefills under way first, then `order`; stops at the
 *        first request that does not fit in memory (head-of-line, as SGLang's prefill adder does)
 *        or when the budget is spent (the last request may get a partial chunk).
 */
inline batch_plan fill_in_order(scheduler_view const& v, std::vector<std::size_t> const& order)
{
  batch_plan plan;
  std::int64_t budget = v.token_budget, memory = v.device_pages_available;
  std::array<std::int64_t, tier_count> loads{};
  for (std::size_t i = 0; i < v.waiting.size() && budget > 0; ++i) {
    if (v.waiting[i].started) { add_item(v, plan, size_item(v, i, budget), budget, memory, loads); }
  }
  for (std::size_t n = 0; n < order.size(); ++n) {
    std::size_t const i = order[n];
    if (v.waiting[i].started) { continue; }
    if (budget <= 0) {
      plan.deferred.push_back({i, v.waiting[i].id, deferral_reason::budget, {}});
      continue;
    }
    prefill_item const it = size_item(v, i, budget);
    if (it.new_pages > memory) {
      for (std::size_t m = n; m < order.size(); ++m) {
        if (!v.waiting[order[m]].started) {
          plan.deferred.push_back({order[m], v.waiting[order[m]].id, deferral_reason::memory, {}});
        }
      }
      break;
    }
    add_item(v, plan, it, budget, memory, loads);
  }
  return match_plan(v, std::move(plan));
}

}  // namespace detail
}  // namespace strata
