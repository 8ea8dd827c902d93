// SPDX-License-Identifier: Apache-2.0
/**
 * @file sched/toolkit.hpp
 * @brief The pieces strategies build plans from: sizing a request's next chunk from a probe of the
 *        index, adding it to a plan under the budget and device memory, and the in-order fill the
 *        baselines share; and what runs a strategy against the index it reads (`plan_batch`:
 *        propose, then match the final plan, the only place a decision counts as a use of the
 *        cache). A user's own strategy needs nothing else.
 *
 * ```
 * batch_plan schedule(scheduler_view const& v) {   // a strategy's proposal
 *   batch_plan plan;
 *   std::int64_t budget = v.token_budget, memory = v.device_pages_available;
 *   std::int64_t unreserved = v.device_pages_unreserved;
 *   std::array<std::int64_t, tier_count> loads{};
 *   for (std::size_t i : my_order) {  // prefills under way first: they hold pages already
 *     prefill_item it = size_item(v, i, budget, nullptr, memory);
 *     if (it.chunk_tokens == 0 || !fits(v, it, memory, unreserved)) break;
 *     unreserved -= reserved_pages(v, it);
 *     add_item(v, plan, it, budget, memory, loads);
 *   }
 *   return plan;
 * }
 * ```
 */
#pragma once

#include <strata/sched/scheduler.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace strata {

/// @brief Prompt tokens of waiting request `i` found cached by match `m`: at least the last token is
///        computed (it produces the first output token), and a prompt cached whole computes its
///        whole last page (into a page of its own: `size_item`).
inline std::int64_t cached_tokens_of(scheduler_view const& v, std::size_t i, match_result const& m)
{
  std::int64_t const prompt = v.waiting[i].prompt_tokens;
  return m.tokens >= prompt ? (prompt - 1) / v.page_tokens * v.page_tokens : m.tokens;
}

/// @brief Pages match `m` brings onto the device, from the fastest lower tier holding each: a page
///        whose fastest copy is in the file tier is costed (`cost_model::load_s`) at the file's
///        read rate plus the PCIe leg, never at the host's.
inline std::array<std::int64_t, tier_count> load_pages_of(scheduler_view const& v, match_result const& m)
{
  std::array<std::int64_t, tier_count> pages{};
  for (std::size_t t = 1; t < tier_count; ++t) {
    pages[t] = m.fastest_tokens[t] / v.page_tokens;
  }
  return pages;
}

/// @brief Which part of a request's cached prefix to use: `match` (what the index finds for it) and
///        the whole pages it is taken from (`prefix_pages`, -1: all).
struct prefix_choice {
  match_result match;
  std::int64_t prefix_pages = -1;
};

/**
 * @brief The cheaper way to a request's first token: load its whole cached prefix, or load only
 *        the part above the record tiers (device and host: `match_result::upper_prefix_tokens`) and
 *        recompute the rest. Reading a slow disk can cost more than recomputing the same tokens
 *        (at 1.92 GB/s a 4 MiB Llama-3.1-8B page takes 2.2 ms to read, its 32 tokens about 0.7 ms
 *        to prefill at a short context); the predicted batch time of the request alone
 *        (`cost_model::batch_s` of its loads and its whole remaining compute) decides.
 * @param m the request's match (a probe)
 */
inline prefix_choice choose_prefix(scheduler_view const& v, std::size_t i, match_result const& m)
{
  if (m.fastest_tokens[std::size_t(tier::file)] + m.fastest_tokens[std::size_t(tier::remote)] == 0) { return {m, -1}; }
  waiting_request const& r = v.waiting[i];
  std::int64_t const pages = m.upper_prefix_tokens / v.page_tokens;
  std::size_t const ids = std::size_t(pages * v.tree->config().page_tokens);
  match_result const upper = v.tree->probe(r.tokens.first(std::min(ids, r.tokens.size())));
  auto cost = [&](match_result const& x) {
    auto const loads = load_pages_of(v, x);
    std::int64_t const cached = cached_tokens_of(v, i, x);
    return v.costs->batch_s(v.costs->load_s(loads), v.costs->prefill_s(r.prompt_tokens - cached, cached),
                            v.costs->serial_load_s(loads));
  };
  if (cost(upper) < cost(m)) { return {upper, pages}; }
  return {m, -1};
}

/// @brief Predicted seconds of work left before a request's first token: the loads and compute of
///        `choose_prefix`'s way (the remaining-work order of `srpt` and `strata_scheduler`).
inline double remaining_work_s(scheduler_view const& v, std::size_t i, match_result const& m)
{
  match_result const& c = choose_prefix(v, i, m).match;
  std::int64_t const cached = cached_tokens_of(v, i, c);
  return v.costs->load_s(load_pages_of(v, c)) + v.costs->prefill_s(v.waiting[i].prompt_tokens - cached, cached);
}

/// @brief Pages that hold `tokens` tokens (the partial tail included); no overflow for any
///        non-negative count.
inline std::int64_t pages_for(std::int64_t tokens, std::int64_t page_tokens)
{ return tokens / page_tokens + (tokens % page_tokens != 0 ? 1 : 0); }

/// @brief Device pages a request's first chunk takes when it takes all of them
///        (`scheduler_view::pages_by_chunk` false): its uncached prompt pages (the partial tail
///        included), the cached pages loaded from lower tiers, and its output's pages.
inline std::int64_t first_chunk_pages(std::int64_t prompt_tokens, std::int64_t output_tokens, std::int64_t cached_pages,
                                      std::int64_t loaded_pages, std::int64_t page_tokens)
{ return pages_for(prompt_tokens, page_tokens) - cached_pages + loaded_pages + pages_for(output_tokens, page_tokens); }

/// @brief Pages of a request's whole page table: every prompt page (the partial tail included) and
///        its output's. What it reserves once started (`scheduler_view::device_pages_unreserved`).
inline std::int64_t table_pages(std::int64_t prompt_tokens, std::int64_t output_tokens, std::int64_t page_tokens)
{ return pages_for(prompt_tokens, page_tokens) + pages_for(output_tokens, page_tokens); }

/// @brief Pages a chunk that computes the prompt up to token `end` adds to a page table of `held`
///        pages (its cached prefix and earlier chunks' pages): the prompt pages up to `end` it lacks,
///        and at the last chunk (`end == prompt_tokens`) the output's.
inline std::int64_t chunk_pages(std::int64_t prompt_tokens, std::int64_t output_tokens, std::int64_t held,
                                std::int64_t end, std::int64_t page_tokens)
{
  return std::max<std::int64_t>(0, pages_for(end, page_tokens) - held) +
         (end == prompt_tokens ? pages_for(output_tokens, page_tokens) : 0);
}

/**
 * @brief Sizes a request's next chunk (at most `budget` tokens) from a probe of the index (`known`
 *        if the caller already probed): no use is counted until `match_plan`.
 *
 * A chunked prefill under way takes no loads; with `scheduler_view::pages_by_chunk` its chunk also
 * stops where its new pages would pass `memory` (0 tokens: none fit). A first chunk is sized by the
 * budget alone: whether its pages fit is the caller's check (`fits`).
 */
inline prefill_item size_item(scheduler_view const& v, std::size_t i, std::int64_t budget,
                              match_result const* known = nullptr,
                              std::int64_t memory = std::numeric_limits<std::int64_t>::max())
{
  waiting_request const& r = v.waiting[i];
  prefill_item it;
  it.index = i;
  it.id = r.id;
  if (r.started) {  // a chunked prefill under way: no loads
    std::int64_t end = r.prefilled_tokens + std::min(budget, r.prompt_tokens - r.prefilled_tokens);
    if (v.pages_by_chunk) {
      auto const pages = [&](std::int64_t e) {
        return chunk_pages(r.prompt_tokens, r.output_tokens, r.table_pages, e, v.page_tokens);
      };
      if (pages(end) > memory) {  // as far as the pages it can have; the last token waits for the output's
        std::int64_t const reach =
            std::min(r.table_pages + memory, std::numeric_limits<std::int64_t>::max() / v.page_tokens);
        end = std::max(r.prefilled_tokens, std::min({end, r.prompt_tokens - 1, reach * v.page_tokens}));
      }
      it.new_pages = pages(end);
    }
    it.chunk_tokens = end - r.prefilled_tokens;
    it.context_tokens = r.prefilled_tokens;
    it.last_chunk = end == r.prompt_tokens;
    return it;
  }
  prefix_choice choice = choose_prefix(v, i, known != nullptr ? *known : v.tree->probe(r.tokens));
  if (choice.match.tokens >= r.prompt_tokens) {
    // The whole prompt is cached: the prefix stops a page short, and the last page is computed
    // into a page of the request's own (its last token has to be: it gives the first output
    // token). Written into the index's page instead, it would change KV that other requests read
    // and copies back up, wherever the kernels are not bitwise deterministic.
    std::int64_t const pages = (r.prompt_tokens - 1) / v.page_tokens;
    std::size_t const ids = std::size_t(pages * v.tree->config().page_tokens);
    choice = {v.tree->probe(r.tokens.first(std::min(ids, r.tokens.size()))), pages};
  }
  match_result const& m = choice.match;
  it.prefix_pages = choice.prefix_pages;
  it.cached_tokens = cached_tokens_of(v, i, m);
  it.first_chunk = true;
  it.context_tokens = it.cached_tokens;
  it.chunk_tokens = std::min(budget, r.prompt_tokens - it.cached_tokens);
  it.last_chunk = it.cached_tokens + it.chunk_tokens == r.prompt_tokens;
  std::int64_t const cached_pages = m.tokens / v.page_tokens;
  it.load_pages = load_pages_of(v, m);
  std::int64_t loads = 0;
  for (auto p : it.load_pages) {
    loads += p;
  }
  it.new_pages = v.pages_by_chunk
                     ? loads + chunk_pages(r.prompt_tokens, r.output_tokens, cached_pages,
                                           it.cached_tokens + it.chunk_tokens, v.page_tokens)
                     : first_chunk_pages(r.prompt_tokens, r.output_tokens, cached_pages, loads, v.page_tokens);
  return it;
}

/// @brief Pages of the waiting request's whole page table, reserved when it starts (0 when it
///        has started already, or without `scheduler_view::pages_by_chunk`).
inline std::int64_t reserved_pages(scheduler_view const& v, prefill_item const& it)
{
  waiting_request const& r = v.waiting[it.index];
  return it.first_chunk && v.pages_by_chunk ? table_pages(r.prompt_tokens, r.output_tokens, v.page_tokens) : 0;
}

/// @brief Whether a plan with `memory` device pages left and `unreserved` pages not reserved can
///        take item `it`: its new pages fit, and a first chunk's whole page table fits what no
///        prefill under way has reserved (so that every started prefill can finish).
inline bool fits(scheduler_view const& v, prefill_item const& it, std::int64_t memory, std::int64_t unreserved)
{ return it.new_pages <= memory && reserved_pages(v, it) <= unreserved; }

/// @brief Predicted compute seconds of a plan item.
inline double item_compute_s(scheduler_view const& v, prefill_item const& it)
{ return v.costs->prefill_s(it.chunk_tokens, it.context_tokens); }

/// @brief Predicted load seconds of a plan item (its first chunk's loads; 0 for later chunks).
inline double item_load_s(scheduler_view const& v, prefill_item const& it)
{ return it.first_chunk ? v.costs->load_s(it.load_pages) : 0.0; }

/// @brief Adds an item to the plan, updating budget, memory and predictions.
inline void add_item(scheduler_view const& v, batch_plan& plan, prefill_item const& it, std::int64_t& budget,
                     std::int64_t& memory, std::array<std::int64_t, tier_count>& loads)
{
  plan.prefills.push_back(it);
  budget -= it.chunk_tokens;
  memory -= it.new_pages;
  for (std::size_t t = 0; t < tier_count; ++t) {
    loads[t] += it.first_chunk ? it.load_pages[t] : 0;
  }
  plan.predicted_compute_s += item_compute_s(v, it);
  plan.predicted_load_s = v.costs->load_s(loads);
  plan.predicted_serial_load_s = v.costs->serial_load_s(loads);
}

/**
 * @brief Matches the final plan's first chunks against the index: a use of each cached prefix (hits,
 *        LRU, selective backups) and the split that makes `cached_node` end where the prefix ends.
 *        Called once the plan is final, so requests ranked or passed over are never counted as uses.
 *
 * A match can change what a later item finds (a selective backup may evict host pages another item
 * was to load): an item whose match no longer agrees with its probe leaves the plan
 * (`deferral_reason::changed`) and is sized afresh next round; the predictions are recomputed.
 * @param tree the index `v.tree` reads (the caller owns it: `plan_batch`, the cache controller)
 */
inline batch_plan match_plan(hiradix_tree& tree, scheduler_view const& v, batch_plan plan)
{
  std::vector<prefill_item> kept;
  std::array<std::int64_t, tier_count> loads{};
  plan.predicted_compute_s = 0;
  for (auto& it : plan.prefills) {
    if (it.first_chunk) {
      std::span<std::int32_t const> tokens = v.waiting[it.index].tokens;
      if (it.prefix_pages >= 0) {
        tokens = tokens.first(std::min(tokens.size(), std::size_t(it.prefix_pages * v.tree->config().page_tokens)));
      }
      match_result const m = it.probe != nullptr ? tree.match(tokens, *it.probe) : tree.match(tokens);
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
  plan.predicted_serial_load_s = v.costs->serial_load_s(loads);
  return plan;
}

/**
 * @brief The fill both baselines use: chunked prefills under way first, then `order`; stops at the
 *        first request that does not fit in memory (head-of-line, as SGLang's prefill adder does)
 *        or when the budget is spent (the last request may get a partial chunk). A prefill under
 *        way that lacks device pages for its chunk holds every new request back: pages that free
 *        up go to it first.
 */
inline batch_plan fill_in_order(scheduler_view const& v, std::vector<std::size_t> const& order)
{
  batch_plan plan;
  std::int64_t budget = v.token_budget, memory = v.device_pages_available, unreserved = v.device_pages_unreserved;
  std::array<std::int64_t, tier_count> loads{};
  bool blocked = false;
  for (std::size_t i = 0; i < v.waiting.size() && budget > 0; ++i) {
    waiting_request const& r = v.waiting[i];
    if (!r.started) { continue; }
    prefill_item const it = size_item(v, i, budget, nullptr, memory);
    blocked = blocked || it.chunk_tokens < std::min(budget, r.prompt_tokens - r.prefilled_tokens);
    if (it.chunk_tokens > 0) { add_item(v, plan, it, budget, memory, loads); }
  }
  for (std::size_t n = 0; n < order.size(); ++n) {
    std::size_t const i = order[n];
    if (v.waiting[i].started) { continue; }
    if (budget <= 0) {
      plan.deferred.push_back({i, v.waiting[i].id, deferral_reason::budget, {}});
      continue;
    }
    prefill_item const it = size_item(v, i, budget);
    if (blocked || !fits(v, it, memory, unreserved)) {
      for (std::size_t m = n; m < order.size(); ++m) {
        if (!v.waiting[order[m]].started) {
          plan.deferred.push_back({order[m], v.waiting[order[m]].id, deferral_reason::memory, {}});
        }
      }
      break;
    }
    unreserved -= reserved_pages(v, it);
    add_item(v, plan, it, budget, memory, loads);
  }
  return plan;
}

/**
 * @brief Runs a strategy on the index it reads: its proposal (`s.schedule(v)`), matched against
 *        `tree` (`match_plan`), then completed by the strategy where it does that
 *        (`plan_finishing_strategy`). What the cache controller's `schedule` does; tests and tools
 *        that drive a strategy on a bare index call it too.
 * @param tree the index `v.tree` points to
 * @throw strata::invalid_argument when `v.tree` is not `tree`
 */
template <scheduler_strategy S>
batch_plan plan_batch(S& s, scheduler_view const& v, hiradix_tree& tree)
{
  STRATA_EXPECTS(v.tree == &tree, "plan_batch: the view reads another index than the one given to match the plan");
  batch_plan plan = match_plan(tree, v, s.schedule(v));
  if constexpr (plan_finishing_strategy<S>) { s.finish_plan(v, plan); }
  return plan;
}
/// @brief `plan_batch` for a strategy given as a temporary (its state is discarded afterwards).
template <scheduler_strategy S>
batch_plan plan_batch(S&& s, scheduler_view const& v, hiradix_tree& tree)
requires(!std::is_lvalue_reference_v<S>)
{ return plan_batch(s, v, tree); }

}  // namespace strata
