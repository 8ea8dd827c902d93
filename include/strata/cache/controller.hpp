// SPDX-License-Identifier: Apache-2.0
/**
 * @file cache/controller.hpp
 * @brief `cache_controller<Policies>`: the one object an engine instantiates. It owns the prefix
 *        index and the tiers' bookkeeping, asks the scheduler strategy what to run, and hands the
 *        index's copy orders to an executor — the request lifecycle an engine would otherwise write
 *        against `hiradix_tree` by hand.
 *
 * The engine loop:
 * ```
 * cache.submit({id, tokens, max_new_tokens});
 * batch_plan plan = cache.schedule({token_budget, running...});
 * load_handle loads = cache.begin_loads(plan, stream);     // device pages held, loads submitted
 * for (layer l) { cache.wait_layer(loads, l, stream); attention(l, cache.page_table(id)); }
 * cache.complete(loads);                                    // or poll(): landed copies
 * cache.finish_prefill(id, stream);                         // prompt pages into the index, backups
 * ... decode ...
 * cache.release(id);                                        // pages back, locks dropped
 * ```
 * Host-only: the executor hides CUDA. Thread safety: every public member may be called from any
 * thread; calls are serialised on one internal mutex, so completions (`poll`) can progress on a
 * helper thread while the engine thread schedules. Handles (`load_handle`) are values: waiting on
 * one never takes the lock.
 */
#pragma once

#include <strata/cache/executor.hpp>
#include <strata/index/hiradix_tree.hpp>
#include <strata/presets/h200.hpp>
#include <strata/sched/cost_model.hpp>
#include <strata/sched/strata_scheduler.hpp>
#include <strata/sched/toolkit.hpp>
#include <strata/tier/device_pool.hpp>
#include <strata/tier/host_pool.hpp>
#include <strata/tier/tier_stack.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

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

/// @brief The defaults of a CPU engine: the engine's pool in `Layout` (host memory), a `host_pool`
///        tier, the Strata strategy, `host_executor`.
template <kv_layout Layout>
struct host_policies {
  using tiers = tier_stack<device_pool<Layout>, host_pool>;  ///< device and host tiers
  using scheduler = strata_scheduler;                        ///< delay hits, balance, bubbles
  using executor = host_executor;                            ///< memcpy on the calling thread
};

/// @brief What a waiting request does while its prefix moves from the file (or remote) tier up to
///        the host (`controller_options::prefetch`).
enum class prefetch_policy {
  off,            ///< no prefetch: a load reads the lower tier when the request starts
  best_effort,    ///< prefetch at `submit`; the scheduler may start the request at once (what has
                  ///< not landed then is read from below)
  wait_complete,  ///< prefetch at `submit`; the scheduler sees the request only once it has landed
  timeout,        ///< as `wait_complete`, for at most `prefetch_timeout_s`
};

/// @brief Settings of a `cache_controller` (defaults work out of the box).
struct controller_options {
  write_policy policy = write_policy::write_through;  ///< when device pages are backed up to the host
  /// When host pages are copied to the file tier: on host eviction (`write_back`, the default), as
  /// soon as they are on the host (`write_through`: what the host holds survives a restart), or
  /// after `selective_hits` hits.
  write_policy file_policy = write_policy::write_back;
  /// Prefetch of a submitted request's prefix from the file or remote tier into the host tier.
  prefetch_policy prefetch = prefetch_policy::best_effort;
  double prefetch_timeout_s = 0.05;  ///< how long `prefetch_policy::timeout` holds a request back
  /// Seconds on the engine's clock, for the prefetch timeout (empty: `std::chrono::steady_clock`;
  /// the simulator passes virtual time).
  std::function<double()> clock{};
  std::int64_t selective_hits = 2;     ///< hits before a `write_through_selective` backup
  std::int64_t delay_hit_tokens = 64;  ///< shortest prefix worth waiting for (delay hits)
  /// The scheduler's cost model (empty: `h200::costs_for(geometry)`, H200 figures).
  cost_model costs{};
  /// Tokens given to `submit` are one id per page (the simulator's compact index), not token ids.
  bool page_ids = false;
};

/// @brief A request for `submit`.
struct cache_request {
  request_id id{};                       ///< the engine's id (unique among live requests)
  std::span<std::int32_t const> tokens;  ///< prompt token ids (page ids with `page_ids`); copied
  /// Prompt tokens: 0 means `tokens.size()` (token ids); with page ids, the prompt's length (its
  /// partial last page, which is never cached, included).
  std::int64_t prompt_tokens = 0;
  std::int64_t max_new_tokens = 1;  ///< output tokens the page table reserves room for
  double arrival_s = 0;             ///< for strategies that age requests
};

/// @brief What `schedule` may use, and what runs beside it.
struct schedule_budget {
  std::int64_t tokens = 8192;               ///< most prefill tokens in the batch
  std::int64_t running_sequences = 0;       ///< requests decoding (for bubble filling)
  std::int64_t running_context_tokens = 0;  ///< their context
  std::int64_t running_max_remaining = 0;   ///< most decode steps any of them still needs
};

/// @brief A request whose first chunk `begin_loads` started.
struct started_request {
  request_id id{};
  /// Prompt pages found cached, by the tier they came from ([device]: already there).
  std::array<std::int64_t, tier_count> cached_pages{};
};

/**
 * @brief The loads of one batch and what the batch runs. Wait per layer with
 *        `cache_controller::wait_layer`; finish with `complete` (or `poll`).
 * @tparam Handle the executor's handle type
 */
template <class Handle>
struct load_handle {
  std::uint64_t round = 0;                              ///< the plan it executes
  std::vector<prefill_item> ran;                        ///< items that run (started or continued)
  std::vector<prefill_item> skipped;                    ///< first chunks that could not start (see `begin_loads`)
  std::vector<started_request> started;                 ///< first chunks started, with their hits
  std::array<std::int64_t, tier_count> loaded_pages{};  ///< pages the loads bring, per source tier
  std::optional<Handle> transfer;                       ///< the executor's submission (none: no loads)
  /// Earlier batches' loads still filling pages this batch reads (their prefixes were on their way
  /// to the device): wait for them as for `transfer`.
  std::vector<Handle> after;
  std::uint64_t submission = 0;  ///< the controller's number for it
  [[nodiscard]] bool has_loads() const noexcept { return transfer.has_value(); }
};

/**
 * @brief The CPU engine's counterpart of the GPU `wait_layer` (`cache/gpu_executor.cuh`), so that
 *        engine code reads alike on both: `host_executor` copies at once, so nothing is left to
 *        wait for. @return false when the batch's loads, or an earlier batch's it reads, failed (call
 *        `complete`/`poll`: the controller sends the requests back to wait)
 * @throw strata::invalid_argument for a negative layer
 */
inline bool wait_layer(load_handle<host_executor::handle_type> const& loads, std::int64_t layer,
                       host_executor::stream_type = {})
{
  STRATA_EXPECTS(layer >= 0, "wait_layer: layer must not be negative, got ", layer);
  auto const ok = [](host_executor::handle_type const& h) { return !h.failed; };
  return std::all_of(loads.after.begin(), loads.after.end(), ok) && (!loads.transfer || ok(*loads.transfer));
}

/// @brief What `finish_prefill` found.
/// @tparam Handle the executor's handle type
template <class Handle>
struct prefill_result {
  /// Whole-page positions of the prompt that the request computed although the index already held
  /// them when it committed (another request computed the same pages meanwhile): the page table now
  /// points at the index's copy and the request's own page was freed.
  std::vector<std::int64_t> duplicate_positions;
  /// Loads still filling pages the page table now points at (duplicates swapped for pages another
  /// batch is loading): wait for them before reading the table.
  std::vector<Handle> after;
};

/// @brief Counters since construction.
struct cache_stats {
  std::array<std::int64_t, tier_count> hit_tokens{};  ///< prompt tokens found cached, by the tier they came from
  std::int64_t computed_tokens = 0;                   ///< prompt tokens planned for compute
  /// Bytes moved, [from][to] tier.
  std::array<std::array<std::int64_t, tier_count>, tier_count> bytes_moved{};
  std::array<std::int64_t, 5> deferrals{};               ///< by `deferral_reason`
  std::array<std::int64_t, tier_count> evicted_pages{};  ///< pages evicted from each tier
  std::int64_t submitted = 0;                            ///< requests submitted
  std::int64_t released = 0;                             ///< requests released (finished or aborted)
  std::int64_t failed_transfers = 0;                     ///< submissions that failed (their pages recomputed)
  std::int64_t requeued = 0;                             ///< requests sent back to wait by a failed load
  /// Pages whose copy in a record store (file, remote) failed to read back: dropped from the index,
  /// with every page cached only below them (their prefixes are recomputed).
  std::int64_t discarded_pages = 0;
  std::int64_t prefetched_pages = 0;  ///< pages copied up to the host tier for waiting requests (submitted)
  std::int64_t prefetch_waits = 0;    ///< rounds a request was held back for its prefetch
  /// File-tier pages the index learned at construction from records kept across a restart
  /// (`file_store::open`); `restore_dropped` counts the records it could not place (no chain to a
  /// first page, another page size, a duplicate): their slots are reused.
  std::int64_t restored_pages = 0;
  std::int64_t restore_dropped = 0;
};

/**
 * @brief The cache controller. See the file comment for the loop; each member says what it
 *        checks. Every rejected call throws `strata::invalid_argument` and changes nothing.
 * @tparam Policies a `cache_policies` bundle
 */
template <cache_policies Policies>
class cache_controller {
 public:
  using tiers_type = typename Policies::tiers;              ///< the tier stack
  using scheduler_type = typename Policies::scheduler;      ///< the strategy
  using executor_type = typename Policies::executor;        ///< the copy executor
  using stream_type = typename executor_type::stream_type;  ///< what orders copies
  using handle_type = typename executor_type::handle_type;  ///< one submission
  using load_handle_type = load_handle<handle_type>;        ///< one batch's loads

  /**
   * @param tiers the stores, fastest first (moved in)
   * @param options policy, thresholds, cost model
   * @param scheduler the strategy
   * @param executor the copy executor
   * @throw strata::invalid_argument for a cost model of another page size, or what the index rejects
   */
  explicit cache_controller(tiers_type tiers, controller_options options = {},
                            scheduler_type scheduler = scheduler_type{}, executor_type executor = executor_type{})
      : tiers_{std::move(tiers)},
        options_{std::move(options)},
        scheduler_{std::move(scheduler)},
        executor_{std::move(executor)},
        recovered_{take_recovered(tiers_)},
        tree_{tree_config(), tiers_.slots()}
  {
    if (options_.costs.page_bytes() == 0) { options_.costs = h200::costs_for(tiers_.geometry()); }
    STRATA_EXPECTS(options_.costs.page_tokens() == page_tokens(), "cache_controller: the cost model's pages hold ",
                   options_.costs.page_tokens(), " tokens, the tiers' ", page_tokens());
    STRATA_EXPECTS(options_.prefetch_timeout_s >= 0 && options_.prefetch_timeout_s < 1e9,
                   "cache_controller: prefetch_timeout_s must be in [0, 1e9) seconds, got ",
                   options_.prefetch_timeout_s);
    restore();
  }
  cache_controller(cache_controller const&) = delete;
  cache_controller& operator=(cache_controller const&) = delete;

  // --- the engine loop ----------------------------------------------------------------------------

  /**
   * @brief A request arrives: it waits for `schedule`. With a strategy that uses delay hits, its
   *        uncached prefix is marked as about to be computed.
   *        When its cached prefix lies in the file (or remote) tier, a prefetch copies it up to the
   *        host tier (`controller_options::prefetch`; copies submitted on `stream`).
   * @throw strata::invalid_argument for a live id, no tokens, `max_new_tokens < 1`, a prompt
   *        shorter than its whole pages, or a stream the executor refuses
   */
  void submit(cache_request const& r, stream_type stream = {})
  {
    std::lock_guard lock{m_};
    check_stream(stream);
    std::int64_t const ids = std::int64_t(r.tokens.size());
    std::int64_t const prompt = r.prompt_tokens > 0 ? r.prompt_tokens : (options_.page_ids ? 0 : ids);
    STRATA_EXPECTS(requests_.count(r.id) == 0, "cache_controller::submit: request ", r.id.value, " is already live");
    // With page ids a prompt shorter than a page has no id at all: it is computed, never cached.
    STRATA_EXPECTS((ids > 0 || options_.page_ids) && prompt > 0, "cache_controller::submit: request ", r.id.value,
                   " has no tokens (page-id mode needs prompt_tokens)");
    STRATA_EXPECTS(r.max_new_tokens >= 1, "cache_controller::submit: request ", r.id.value,
                   " must generate at least one token, got ", r.max_new_tokens);
    std::int64_t const whole = options_.page_ids ? ids : ids / page_tokens();
    STRATA_EXPECTS(whole <= prompt / page_tokens() && (options_.page_ids || prompt == ids),
                   "cache_controller::submit: request ", r.id.value, " has ", prompt, " prompt tokens for ", ids,
                   options_.page_ids ? " page ids" : " token ids");
    auto s = std::make_unique<state>();
    s->tokens.assign(r.tokens.begin(), r.tokens.end());
    s->prompt_tokens = prompt;
    s->max_new_tokens = r.max_new_tokens;
    mark(r.id, *s);
    waiting_request w;
    w.id = r.id;
    w.arrival_s = r.arrival_s;
    w.tokens = s->tokens;
    w.prompt_tokens = prompt;
    w.output_tokens = r.max_new_tokens;
    waiting_.push_back(w);
    waiting_state_.push_back(s.get());
    state& st = *s;
    requests_.emplace(r.id, std::move(s));
    ++stats_.submitted;
    try {  // best effort: the request is in, whatever becomes of its prefetch
      prefetch(st, stream);
    } catch (std::exception const&) {
      st.prefetch_retry = false;
    }
  }

  /**
   * @brief The next batch: the strategy's plan over the waiting requests. Pass it to `begin_loads`
   *        before the next `schedule` (a plan is only valid until then).
   * @throw strata::invalid_argument for a non-positive token budget or negative running figures
   */
  [[nodiscard]] batch_plan schedule(schedule_budget const& budget)
  {
    std::lock_guard lock{m_};
    STRATA_EXPECTS(budget.tokens > 0, "cache_controller::schedule: token budget must be positive, got ", budget.tokens);
    STRATA_EXPECTS(
        budget.running_sequences >= 0 && budget.running_context_tokens >= 0 && budget.running_max_remaining >= 0,
        "cache_controller::schedule: running figures must not be negative");
    batch_plan plan;
    plan.round = ++round_;
    if (waiting_.empty()) { return plan; }
    // Requests whose prefetch holds them back (wait_complete, timeout) are left out of the view;
    // the plan's positions are the view's (begin_loads finds its requests by id).
    std::vector<std::size_t> shown;
    std::vector<waiting_request> visible;
    bool const hiding = held_for_prefetch(shown);
    if (hiding) {
      if (shown.empty()) { return plan; }
      for (auto i : shown) {
        visible.push_back(waiting_[i]);
      }
    }
    scheduler_view v;
    v.waiting = hiding ? std::span<waiting_request const>{visible} : std::span<waiting_request const>{waiting_};
    v.tree = &tree_;
    v.costs = &options_.costs;
    v.page_tokens = page_tokens();
    v.token_budget = budget.tokens;
    v.device_pages_available = device_pages_available_locked();
    v.running_sequences = budget.running_sequences;
    v.running_context_tokens = budget.running_context_tokens;
    v.running_max_remaining = budget.running_max_remaining;
    plan = plan_batch(scheduler_, v, tree_);
    plan.round = round_;
    for (auto const& d : plan.deferred) {
      waiting_request& w = waiting_[hiding ? shown[d.index] : d.index];
      ++w.deferrals;
      w.delay_hit_deferred = d.reason == deferral_reason::delay_hit;
      ++stats_.deferrals[std::size_t(d.reason)];
    }
    return plan;
  }

  /**
   * @brief Carries out `plan` (the last `schedule`'s): holds device pages for each first chunk
   *        (evicting under pressure), locks cached prefixes, submits the loads of the whole batch in
   *        one executor submission on `stream`, and advances every item's prefill. First chunks that
   *        find no device memory, whose prefix another request began computing since the plan was
   *        made, or whose cached node is gone, are skipped (they wait for a later round).
   * @throw strata::invalid_argument for a plan that is not the last one scheduled, or one already
   *        begun, or a stream the executor refuses (another device's); nothing changes then
   */
  [[nodiscard]] load_handle_type begin_loads(batch_plan const& plan, stream_type stream = {})
  {
    std::lock_guard lock{m_};
    check_stream(stream);
    STRATA_EXPECTS(plan.round == round_ && plan.round != begun_, "cache_controller::begin_loads: plan of round ",
                   plan.round, " is not the last one scheduled (", round_, ") or was begun already");
    begun_ = plan.round;
    load_handle_type h;
    h.round = plan.round;
    // The plan's positions in the waiting list, by id: a call from another thread since `schedule`
    // (a `poll` that sent a failed load's requests back to wait, a `release`) may have moved them.
    // Items whose request is gone, or was sent back to wait with a later chunk planned, are dropped.
    std::vector<prefill_item> items;
    for (prefill_item it : plan.prefills) {
      if (it.index >= waiting_.size() || waiting_[it.index].id != it.id) {
        auto const f = std::find_if(waiting_.begin(), waiting_.end(), [&](auto const& w) { return w.id == it.id; });
        if (f == waiting_.end()) { continue; }
        it.index = std::size_t(f - waiting_.begin());
      }
      if (it.first_chunk == waiting_[it.index].started) { continue; }
      items.push_back(it);
    }
    // Hold every cached prefix of the batch first, so that one request's allocation cannot evict
    // another's. A first chunk whose cached node is gone (a strategy that sized it from a probe and
    // did not `match_plan`) is skipped: it is sized again next round.
    for (auto const& it : items) {
      if (it.first_chunk && tree_.alive(it.cached_node)) { tree_.lock(it.cached_node, tier::device); }
    }
    std::vector<copy_order> loads;
    for (auto const& it : items) {
      if (it.first_chunk && !tree_.alive(it.cached_node)) {
        h.skipped.push_back(it);
        continue;
      }
      if (it.first_chunk && !start(it, stream, h, loads)) {
        tree_.unlock(it.cached_node, tier::device);
        h.skipped.push_back(it);
        continue;
      }
      h.ran.push_back(it);
    }
    std::vector<std::size_t> done;
    for (auto const& it : h.ran) {
      waiting_request& w = waiting_[it.index];
      w.prefilled_tokens += it.chunk_tokens;
      stats_.computed_tokens += it.chunk_tokens;
      if (w.prefilled_tokens >= w.prompt_tokens) { done.push_back(it.index); }
    }
    std::sort(done.begin(), done.end(), std::greater<>());
    for (auto i : done) {
      waiting_state_[i]->at = stage::prefilled;
      waiting_.erase(waiting_.begin() + std::ptrdiff_t(i));
      waiting_state_.erase(waiting_state_.begin() + std::ptrdiff_t(i));
    }
    // Pages this batch reads that an earlier batch's loads are still filling: the engine waits for
    // those loads too.
    std::vector<std::int64_t> read;
    for (auto const& st : h.started) {
      auto const& prefix = requests_.at(st.id)->prefix;
      read.insert(read.end(), prefix.begin(), prefix.end());
    }
    h.after = pending_loads_under(read);
    if (!loads.empty()) {
      h.transfer = submit_orders(std::move(loads), copy_kind::load, stream, &h.started);
      h.submission = inflight_.back().id;
      for (auto const& o : inflight_.back().orders) {
        for (auto p : o.to_pages) {
          arriving_[p] = h.submission;
        }
      }
    }
    return h;
  }

  /**
   * @brief Completes the batch's loads in the index if they landed (or failed: its first chunks
   *        then wait again, their cached pages to be recomputed). True once nothing is pending.
   */
  bool complete(load_handle_type const& h)
  {
    std::lock_guard lock{m_};
    if (!h.transfer) { return true; }
    for (std::size_t i = 0; i < inflight_.size(); ++i) {
      if (inflight_[i].id == h.submission) { return settle(i); }
    }
    return true;  // settled already (by `poll`)
  }

  /**
   * @brief Completes every landed copy (loads, backups, demotions, prefetches) in the index, freeing
   *        demoted device pages; a failed one is cancelled (a failed load sends its requests back to
   *        wait). Copies that landing made due (a host page written through to the file tier) are
   *        submitted on `stream`.
   * @return submissions still pending
   * @throw strata::invalid_argument for a stream the executor refuses
   */
  std::size_t poll(stream_type stream = {})
  {
    std::lock_guard lock{m_};
    check_stream(stream);
    for (std::size_t i = 0; i < inflight_.size();) {
      if (!settle(i)) { ++i; }
    }
    submit_queued(stream, /*device_sources=*/false);
    for (std::size_t i = 0; i < inflight_.size();) {  // what an executor copied at once
      if (!settle(i)) { ++i; }
    }
    for (auto* s : waiting_state_) {  // prefetches that found the host full, once room was made
      if (s->prefetch != 0 && !in_flight(s->prefetch)) { s->prefetch = 0; }
      bool const room_landed = std::none_of(s->prefetch_room.begin(), s->prefetch_room.end(),
                                            [&](std::uint64_t id) { return in_flight(id); });
      if (s->prefetch_retry && s->prefetch == 0 && room_landed && s->at == stage::waiting) { prefetch(*s, stream); }
    }
    return inflight_.size();
  }

  /**
   * @brief The request's device pages: one per whole prompt page (cached, loaded or to compute),
   *        then pages for the partial last page and `max_new_tokens`. Valid from `begin_loads`
   *        on; `finish_prefill` may swap computed duplicates for the index's equal pages.
   * @throw strata::invalid_argument for an unknown request or one not started
   */
  [[nodiscard]] std::vector<std::int64_t> page_table(request_id id) const
  {
    std::lock_guard lock{m_};
    state const& s = live(id, "page_table");
    STRATA_EXPECTS(s.at != stage::waiting, "cache_controller::page_table: request ", id.value, " has not started");
    std::vector<std::int64_t> t = s.prefix;
    t.insert(t.end(), s.computed.begin(), s.computed.end());
    t.insert(t.end(), s.extra.begin(), s.extra.end());
    return t;
  }

  /**
   * @brief The request's prompt is computed: its pages enter the index (its own transient prefix is
   *        committed; pages another request committed meanwhile are swapped for the index's and
   *        freed), backups follow the write policy (submitted on `stream`, after the work there).
   * @throw strata::invalid_argument for an unknown request, one whose last chunk has not run, or a
   *        stream the executor refuses
   */
  prefill_result<handle_type> finish_prefill(request_id id, stream_type stream = {})
  {
    std::lock_guard lock{m_};
    check_stream(stream);
    state& s = live(id, "finish_prefill");
    STRATA_EXPECTS(s.at == stage::prefilled, "cache_controller::finish_prefill: request ", id.value,
                   s.at == stage::running ? " finished its prefill already" : " has prompt chunks left to run");
    prefill_result<handle_type> out;
    std::int64_t const n = whole_pages(s);
    std::vector<std::int64_t> table = tree_.path_pages(s.node, tier::device, /*arriving_too=*/true);
    table.insert(table.end(), s.computed.begin(), s.computed.end());
    if (s.transient_pages > 0) {
      (void)tree_.commit(id, std::span<std::int64_t const>{s.computed}.last(std::size_t(s.transient_pages)));
    }
    insert_result const r = tree_.insert(prompt_ids(s), table);
    // Unused pages inside the cached path duplicate another request's: freed now, the request reads
    // the index's. Past it (another request computes that prefix) the request keeps its own.
    std::int64_t const path = tree_.path_length(r.node);
    std::int64_t const duplicates = std::int64_t(r.unused_device_pages.size()) - (n - path);
    if (duplicates > 0) {
      auto const held = tree_.path_pages(r.node, tier::device);
      for (std::size_t p = std::size_t(s.cached_pages); p < held.size(); ++p) {
        if (held[p] != table[p]) { out.duplicate_positions.push_back(std::int64_t(p)); }
      }
    }
    std::int64_t const dup = std::max<std::int64_t>(0, duplicates);
    release_device({r.unused_device_pages.begin(), r.unused_device_pages.begin() + dup});
    std::vector<std::int64_t> kept(r.unused_device_pages.begin() + dup, r.unused_device_pages.end());
    kept.insert(kept.end(), s.extra.begin(), s.extra.end());
    s.extra = std::move(kept);
    s.computed.clear();
    tree_.lock(r.node, tier::device);
    tree_.unlock(s.node, tier::device);
    s.node = r.node;
    s.prefix = tree_.path_pages(r.node, tier::device, /*arriving_too=*/true);
    out.after = pending_loads_under(s.prefix);
    s.at = stage::running;
    for (auto k : s.computing_keys) {
      unmarked_computing_.erase(k);
    }
    s.computing_keys.clear();
    unblock(id);
    submit_queued(stream);
    return out;
  }

  /**
   * @brief The request is done (or abandoned): its locks go and its own pages return to the pool.
   *        `cache_tokens`, when given, are the tokens to keep for a later turn — the prompt followed
   *        by the output (ids in the same form as `submit`'s): their whole pages enter the index
   *        from the request's page table first (only after `finish_prefill`).
   *
   * Releasing a request that has not finished its prefill aborts it (its transient prefix is dropped).
   * @throw strata::invalid_argument for a stream the executor refuses, an unknown request,
   *        `cache_tokens` before `finish_prefill`,
   *        tokens that do not extend the prompt, or more whole pages than its page table holds
   */
  void release(request_id id, std::span<std::int32_t const> cache_tokens = {}, stream_type stream = {})
  {
    std::lock_guard lock{m_};
    check_stream(stream);
    state& s = live(id, "release");
    if (!cache_tokens.empty()) {
      STRATA_EXPECTS(s.at == stage::running, "cache_controller::release: request ", id.value,
                     " can cache its tokens only after finish_prefill");
      std::span<std::int32_t const> const prompt = prompt_ids(s);
      STRATA_EXPECTS(
          cache_tokens.size() >= prompt.size() && std::equal(prompt.begin(), prompt.end(), cache_tokens.begin()),
          "cache_controller::release: request ", id.value, "'s cache_tokens do not extend its prompt");
      std::vector<std::int64_t> table = tree_.path_pages(s.node, tier::device, /*arriving_too=*/true);
      std::size_t const pages = std::size_t(options_.page_ids ? std::int64_t(cache_tokens.size())
                                                              : std::int64_t(cache_tokens.size()) / page_tokens());
      std::size_t const need = pages > table.size() ? pages - table.size() : 0;
      STRATA_EXPECTS(need <= s.extra.size(), "cache_controller::release: request ", id.value, " caches ", pages,
                     " whole pages but its page table holds ", table.size() + s.extra.size());
      table.insert(table.end(), s.extra.begin(), s.extra.begin() + std::ptrdiff_t(need));
      table.resize(pages);
      insert_result const r =
          tree_.insert(cache_tokens.first(options_.page_ids ? pages : pages * std::size_t(page_tokens())), table);
      s.extra.erase(s.extra.begin(), s.extra.begin() + std::ptrdiff_t(need));
      s.extra.insert(s.extra.end(), r.unused_device_pages.begin(), r.unused_device_pages.end());
      submit_queued(stream);
    }
    drop(id, s);
  }

  // --- explicit control and state ----------------------------------------------------------------

  /**
   * @brief Frees at least `pages` pages of tier `t` (least recently used first; demotions submitted
   *        on `stream`). @return pages leaving the tier
   * @throw strata::invalid_argument for a negative count, a tier the stack lacks, or a stream the
   *        executor refuses
   */
  std::int64_t evict(tier t, std::int64_t pages, stream_type stream = {})
  {
    std::lock_guard lock{m_};
    check_stream(stream);
    eviction_result r = tree_.evict(t, pages);
    if (t == tier::device) { release_device(r.freed); }
    queued_.insert(queued_.end(), std::make_move_iterator(r.demotions.begin()),
                   std::make_move_iterator(r.demotions.end()));
    submit_queued(stream);
    return r.pages;
  }

  /// @brief What `schedule` would find cached for `tokens` (no side effects).
  [[nodiscard]] match_result probe(std::span<std::int32_t const> tokens) const
  {
    std::lock_guard lock{m_};
    return tree_.probe(tokens);
  }
  /// @brief Free device pages plus those eviction could free.
  [[nodiscard]] std::int64_t device_pages_available() const
  {
    std::lock_guard lock{m_};
    return device_pages_available_locked();
  }
  /// @brief Requests in the waiting list (not started, or with prompt chunks left).
  [[nodiscard]] std::size_t waiting() const
  {
    std::lock_guard lock{m_};
    return waiting_.size();
  }
  /// @brief Whether a load the request had already computed on failed: its output is wrong and it
  ///        should be aborted (`release`) and resubmitted. @throw strata::invalid_argument for an unknown request
  [[nodiscard]] bool failed(request_id id) const
  {
    std::lock_guard lock{m_};
    return live(id, "failed").failed;
  }
  /// @brief Live requests (submitted, not released).
  [[nodiscard]] std::size_t live_requests() const
  {
    std::lock_guard lock{m_};
    return requests_.size();
  }
  /// @brief Executor submissions not yet settled.
  [[nodiscard]] std::size_t pending_submissions() const
  {
    std::lock_guard lock{m_};
    return inflight_.size();
  }
  /// @brief Counters.
  [[nodiscard]] cache_stats stats() const
  {
    std::lock_guard lock{m_};
    cache_stats s = stats_;
    s.evicted_pages = tree_.stats().evicted_pages;
    return s;
  }
  /// @brief The index's counters and residency.
  [[nodiscard]] hiradix_stats index_stats() const
  {
    std::lock_guard lock{m_};
    return tree_.stats();
  }
  /// @brief Checks the index's and the controller's invariants (for tests): every device page is
  ///        free, held by the index, or owned by one live request — never two of these.
  void check_invariants() const
  {
    std::lock_guard lock{m_};
    tree_.check_invariants();
    auto const& slots = tiers_.device().slots();
    std::vector<std::uint8_t> use(std::size_t(slots.capacity()), 0);
    auto claim = [&](std::int64_t p, char const* who) {
      STRATA_EXPECTS_AS(error, p >= 0 && p < slots.capacity() && slots.is_allocated(p),
                        "cache_controller invariant: ", who, " holds device page ", p, ", which is free");
      STRATA_EXPECTS_AS(error, use[std::size_t(p)]++ == 0, "cache_controller invariant: device page ", p,
                        " is held twice (", who, ")");
    };
    for (auto const& [id, s] : requests_) {
      for (auto p : s->computed) {
        claim(p, "a request's computed pages");
      }
      for (auto p : s->extra) {
        claim(p, "a request's own pages");
      }
    }
    for (std::int64_t p = 0; p < slots.capacity(); ++p) {
      if (tree_.holds(tier::device, p)) { claim(p, "the index"); }
    }
    for (std::int64_t p = 0; p < slots.capacity(); ++p) {
      STRATA_EXPECTS_AS(error, !slots.is_allocated(p) || use[std::size_t(p)] == 1,
                        "cache_controller invariant: device page ", p, " is allocated but nobody holds it (a leak)");
    }
  }

  /// @brief The tiers.
  [[nodiscard]] tiers_type& tiers() noexcept { return tiers_; }
  /// @brief The tiers.
  [[nodiscard]] tiers_type const& tiers() const noexcept { return tiers_; }
  /// @brief The executor (the simulator advances its clock).
  [[nodiscard]] executor_type& executor() noexcept { return executor_; }
  /// @brief The executor.
  [[nodiscard]] executor_type const& executor() const noexcept { return executor_; }
  /// @brief The strategy.
  [[nodiscard]] scheduler_type const& scheduler() const noexcept { return scheduler_; }
  /// @brief The settings (with the cost model in use).
  [[nodiscard]] controller_options const& options() const noexcept { return options_; }
  /// @brief Real tokens per page.
  [[nodiscard]] std::int64_t page_tokens() const { return tiers_.geometry().page_tokens; }

 private:
  enum class stage { waiting, prefilling, prefilled, running };
  struct state {
    std::vector<std::int32_t> tokens;
    std::int64_t prompt_tokens = 0;
    std::int64_t max_new_tokens = 1;
    stage at = stage::waiting;
    bool failed = false;  // a load it already computed on failed: its output is wrong
    node_ref node{};
    bool locked = false;
    std::int64_t cached_pages = 0;
    std::int64_t transient_pages = 0;
    std::vector<std::int64_t> prefix;           // device pages of the cached path when it started
    std::vector<std::int64_t> computed;         // device pages of the computed whole pages
    std::vector<std::int64_t> extra;            // pages the index does not hold: uncached, partial tail, output
    std::vector<std::uint64_t> computing_keys;  // its pages in `unmarked_computing_`
    std::uint64_t prefetch = 0;                 // submission of its pending prefetch (0: none)
    bool prefetch_retry = false;                // its prefetch found the host full and made room: try again
    int prefetch_tries = 0;                     // prefetches started for it (retries are bounded)
    std::vector<std::uint64_t> prefetch_room;   // the demotions making room for it: retry once they landed
    std::optional<double> prefetch_at;          // when its first prefetch started (`now()`)
  };
  /// A record a record store kept across a restart, as the index needs it.
  struct kept_record {
    std::int64_t slot;
    std::uint64_t key, parent_key;
    std::vector<std::int32_t> ids;
  };
  struct submission {
    std::uint64_t id;
    handle_type handle;
    std::vector<copy_order> orders;
    copy_kind kind;
    std::vector<request_id> requests;  // loads: the requests reading them
  };

  hiradix_config tree_config() const
  {
    hiradix_config c;
    kv_geometry const g = tiers_.geometry();
    c.page_tokens = options_.page_ids ? 1 : g.page_tokens;
    c.tokens_per_id = options_.page_ids ? g.page_tokens : 1;
    c.page_bytes = g.page_bytes();
    for (std::size_t t = 0; t < tier_count; ++t) {
      c.capacity[t] = tiers_.capacity(tier(t));
    }
    c.policy = options_.policy;
    c.file_policy = options_.file_policy;
    c.selective_hits = options_.selective_hits;
    c.delay_hit_tokens = options_.delay_hit_tokens;
    return c;
  }

  state& live(request_id id, char const* what) const
  {
    auto const it = requests_.find(id);
    STRATA_EXPECTS(it != requests_.end(), "cache_controller::", what, ": unknown or released request ", id.value);
    return *it->second;
  }
  [[nodiscard]] std::int64_t whole_pages(state const& s) const noexcept
  { return options_.page_ids ? std::int64_t(s.tokens.size()) : std::int64_t(s.tokens.size()) / page_tokens(); }
  [[nodiscard]] std::span<std::int32_t const> prompt_ids(state const& s) const noexcept { return s.tokens; }
  [[nodiscard]] std::int64_t device_pages_available_locked() const
  { return tiers_.device().slots().available() + tree_.reclaimable_pages(tier::device); }

  /// Device pages for `n`, evicting under pressure (demotions and backups queued). None: no room.
  std::optional<std::vector<std::int64_t>> allocate(std::int64_t n)
  {
    auto& slots = tiers_.device().slots();
    if (slots.available() < n) {
      eviction_result r = tree_.evict(tier::device, n - slots.available());
      release_device(r.freed);
      queued_.insert(queued_.end(), std::make_move_iterator(r.demotions.begin()),
                     std::make_move_iterator(r.demotions.end()));
    }
    (void)tree_.take_internal_evictions();
    for (auto& o : tree_.take_copies()) {
      queued_.push_back(std::move(o));
    }
    if (slots.available() < n) { return std::nullopt; }
    if (n == 0) { return std::vector<std::int64_t>{}; }
    return slots.allocate(n);
  }
  void release_device(std::span<std::int64_t const> pages)
  {
    if (!pages.empty()) { tiers_.device().slots().release(pages); }
  }

  /// Starts a first chunk: holds its pages, orders its loads. False without memory.
  bool start(prefill_item const& it, stream_type stream, load_handle_type& h, std::vector<copy_order>& loads)
  {
    waiting_request& w = waiting_[it.index];
    state& s = *waiting_state_[it.index];
    std::int64_t const to_load = tree_.pages_to_load(it.cached_node);
    std::int64_t const cached = tree_.path_length(it.cached_node);
    std::vector<std::uint64_t> keys;
    if (scheduler_.uses_transient_nodes()) {
      // Another request of this batch (or one started since the plan was made) now computes this
      // prefix: this one waits for it rather than compute it twice.
      if (s.transient_pages == 0) {
        match_result const m = tree_.probe(s.tokens);
        if (m.delay_hit && m.transient_owner != w.id) { return false; }
      }
      keys = page_keys(s, cached);
      if (computed_elsewhere(keys)) { return false; }
      mark(w.id, s);
    }
    std::int64_t const computed = whole_pages(s) - cached;
    // Loaded pages, then computed whole pages, then the partial tail and the output (`extra`).
    auto pages = allocate(first_chunk_pages(s.prompt_tokens, s.max_new_tokens, cached, to_load, page_tokens()));
    submit_queued(stream);
    if (!pages) { return false; }
    if (scheduler_.uses_transient_nodes()) {
      // Pages it computes that no mark covers: all of them when it could not mark, and the cached
      // pages below its prefix that the plan chose to recompute (`prefill_item::prefix_pages`: a
      // slow tier), so that a request extending them waits instead of computing them too.
      std::size_t const unmarked =
          s.transient_pages == 0
              ? keys.size()
              : std::size_t(std::max<std::int64_t>(0, tree_.probe(s.tokens).tokens / page_tokens() - cached));
      for (std::size_t k = 0; k < std::min(unmarked, keys.size()); ++k) {
        if (unmarked_computing_.emplace(keys[k], w.id).second) { s.computing_keys.push_back(keys[k]); }
      }
    }
    started_request st{w.id, {}};
    for (auto& o : tree_.load(it.cached_node, std::span<std::int64_t const>{*pages}.first(std::size_t(to_load)))) {
      std::int64_t const count = std::int64_t(o.from_pages.size());
      st.cached_pages[std::size_t(o.from)] += count;
      h.loaded_pages[std::size_t(o.from)] += count;
      loads.push_back(std::move(o));
    }
    st.cached_pages[0] = cached - to_load;
    for (std::size_t t = 0; t < tier_count; ++t) {
      stats_.hit_tokens[t] += st.cached_pages[t] * page_tokens();
    }
    h.started.push_back(st);
    s.cached_pages = cached;
    s.computed.assign(pages->begin() + to_load, pages->begin() + to_load + computed);
    s.extra.assign(pages->begin() + to_load + computed, pages->end());
    s.node = it.cached_node;
    s.locked = true;
    s.at = stage::prefilling;
    s.prefix = tree_.path_pages(it.cached_node, tier::device, /*arriving_too=*/true);
    if (s.transient_pages > 0) { tree_.mark_in_flight(w.id); }
    w.started = true;
    w.cached_tokens = it.cached_tokens;
    w.prefilled_tokens = it.cached_tokens;  // the chunks compute the rest
    w.delay_hit_deferred = false;
    return true;
  }

  /// The pending load submissions filling any of `pages`.
  std::vector<handle_type> pending_loads_under(std::span<std::int64_t const> pages) const
  {
    std::set<std::uint64_t> ids;
    for (auto p : pages) {
      if (auto const it = arriving_.find(p); it != arriving_.end()) { ids.insert(it->second); }
    }
    std::vector<handle_type> out;
    for (auto const& sub : inflight_) {
      if (ids.count(sub.id) != 0) { out.push_back(sub.handle); }
    }
    return out;
  }

  /// A stream the executor cannot order its copies with is refused before anything changes
  /// (executors that can tell, e.g. `gpu_executor::check_stream` for a stream of another device).
  void check_stream(stream_type const& stream) const
  {
    if constexpr (requires { executor_.check_stream(stream); }) { executor_.check_stream(stream); }
  }

  [[nodiscard]] double now() const
  {
    if (options_.clock) { return options_.clock(); }
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }

  /// Starts copying the part of a request's cached prefix that lies below the host (file, remote)
  /// up to the host tier, per `options_.prefetch`. When the host has no room, the demotions that
  /// make it are submitted and the prefetch is tried again (by `poll`) once they have landed, at
  /// most three times in all.
  void prefetch(state& s, stream_type stream)
  {
    s.prefetch_retry = false;
    if (options_.prefetch == prefetch_policy::off || !tree_.has_tier(tier::host)) { return; }
    match_result const m = tree_.probe(s.tokens);
    std::int64_t const below = m.fastest_tokens[std::size_t(tier::file)] + m.fastest_tokens[std::size_t(tier::remote)];
    if (below == 0 || !worth_reading(m, s.prompt_tokens)) { return; }
    for (auto& o : tree_.take_copies()) {  // copies queued before: not this prefetch's
      queued_.push_back(std::move(o));
    }
    ++s.prefetch_tries;
    std::vector<copy_order> orders = tree_.prefetch(m.node);
    (void)tree_.take_internal_evictions();  // host and file slots: the index's own
    std::int64_t got = 0;
    for (auto const& o : orders) {
      got += std::int64_t(o.to_pages.size()) * page_tokens();
    }
    // The demotions that make room on the host, each its own submission (settles when it lands).
    s.prefetch_room.clear();
    for (auto& o : tree_.take_copies()) {
      std::vector<copy_order> one;
      one.push_back(std::move(o));
      (void)submit_orders(std::move(one), copy_kind::copy, stream, nullptr);
      s.prefetch_room.push_back(inflight_.back().id);
    }
    s.prefetch_retry = got < below && !s.prefetch_room.empty() && s.prefetch_tries < 3;
    if (!orders.empty()) {
      for (auto const& o : orders) {
        stats_.prefetched_pages += std::int64_t(o.to_pages.size());
      }
      handle_type const h = submit_orders(std::move(orders), copy_kind::copy, stream, nullptr);
      s.prefetch = inflight_.back().id;
      if (!s.prefetch_at) { s.prefetch_at = now(); }
      if (executor_.status(h) != copy_status::pending) {  // an executor that copies at once
        (void)settle(inflight_.size() - 1);
        s.prefetch = 0;
      }
    }
    submit_queued(stream, /*device_sources=*/false);
  }

  /// Whether submission `id` is still in flight.
  [[nodiscard]] bool in_flight(std::uint64_t id) const
  {
    return std::any_of(inflight_.begin(), inflight_.end(), [&](submission const& sub) { return sub.id == id; });
  }

  /// Whether reading the part of `m` that lies below the host is predicted faster than computing it
  /// (the cost model; a slow disk can lose to recompute): else it is not prefetched, and the
  /// scheduler's `choose_prefix` recomputes it too.
  [[nodiscard]] bool worth_reading(match_result const& m, std::int64_t prompt_tokens) const
  {
    std::array<std::int64_t, tier_count> pages{};
    for (std::size_t t = 2; t < tier_count; ++t) {
      pages[t] = m.fastest_tokens[t] / page_tokens();
    }
    std::int64_t const upper = std::min(m.upper_prefix_tokens, prompt_tokens - 1);
    std::int64_t const below = std::min(m.tokens, prompt_tokens - 1) - upper;
    return below > 0 && options_.costs.load_s(pages) < options_.costs.prefill_s(below, upper);
  }

  /// Under `wait_complete` / `timeout`: settles the prefetches that landed, and lists in `shown` the
  /// waiting positions not held back by one. True when some request is held back.
  bool held_for_prefetch(std::vector<std::size_t>& shown)
  {
    if (options_.prefetch != prefetch_policy::wait_complete && options_.prefetch != prefetch_policy::timeout) {
      return false;
    }
    auto pending_at = [&](std::uint64_t id) -> std::optional<std::size_t> {
      for (std::size_t i = 0; i < inflight_.size(); ++i) {
        if (inflight_[i].id == id) { return i; }
      }
      return std::nullopt;
    };
    double const t = options_.prefetch == prefetch_policy::timeout ? now() : 0;
    bool held = false;
    for (std::size_t i = 0; i < waiting_.size(); ++i) {
      state& s = *waiting_state_[i];
      if (s.prefetch != 0) {
        auto const at = pending_at(s.prefetch);
        if (!at || settle(*at) ||
            (options_.prefetch == prefetch_policy::timeout && s.prefetch_at &&
             t - *s.prefetch_at >= options_.prefetch_timeout_s)) {
          s.prefetch = 0;  // landed, failed (its pages are read from below, or recomputed), or timed out
        }
      }
      if (s.prefetch != 0) {
        held = true;
        ++stats_.prefetch_waits;
      } else {
        shown.push_back(i);
      }
    }
    return held;
  }

  /// Takes the records a record store (the file tier) kept across a restart, and gives their
  /// slots back to its allocator: the index adopts the ones it can place (`restore`).
  std::vector<kept_record> take_recovered(tiers_type& tiers) const
  {
    std::vector<kept_record> out;
    if constexpr (tiers_type::has(tier::file)) {
      auto& store = tiers.template get<tier::file>();
      using store_type = std::remove_cvref_t<decltype(store)>;
      if constexpr (requires { store_type::max_record_ids; }) {  // checked before anything changes
        std::int64_t const ids = options_.page_ids ? 1 : tiers.geometry().page_tokens;
        STRATA_EXPECTS(ids <= store_type::max_record_ids, "cache_controller: a page of ", ids,
                       " ids does not fit a file-tier record's header (at most ", store_type::max_record_ids, ")");
      }
      if constexpr (requires {
                      store.recovered()[0].ids;
                      store.recovered()[0].parent_key;
                      store.key(0);
                    }) {
        std::vector<std::int64_t> slots;
        for (auto const& r : store.recovered()) {
          // Only records the store still holds as recovered (a store reused by a second controller
          // has moved on since).
          if (!store.slots().is_allocated(r.slot) || store.key(r.slot) != std::optional<std::uint64_t>{r.key}) {
            continue;
          }
          out.push_back({r.slot, r.key, r.parent_key, {r.ids.begin(), r.ids.end()}});
          slots.push_back(r.slot);
        }
        if (!slots.empty()) { store.slots().release(slots); }
      }
    }
    return out;
  }

  /// The index learns the prefixes whose pages the file tier kept: records chain to their prefix
  /// through their parent keys; every chain from a first page is adopted, leaf by leaf. Records that
  /// chain to no first page, hold another page size, or repeat a key, are left (their slots are free).
  void restore()
  {
    std::vector<kept_record> records = std::move(recovered_);
    recovered_ = {};
    if (records.empty()) { return; }
    std::int64_t const per_page = options_.page_ids ? 1 : page_tokens();
    std::unordered_map<std::uint64_t, std::size_t> by_key;
    std::unordered_map<std::uint64_t, std::vector<std::size_t>> children;  // parent key -> records
    for (std::size_t i = 0; i < records.size(); ++i) {
      kept_record const& r = records[i];
      if (std::int64_t(r.ids.size()) != per_page || tree_.page_key(r.ids, r.parent_key) != r.key ||
          !by_key.emplace(r.key, i).second) {
        continue;
      }
      children[r.parent_key].push_back(i);
    }
    std::vector<std::int32_t> tokens;
    std::vector<std::int64_t> slots;
    std::vector<std::pair<std::size_t, std::size_t>> path;  // (record, next child to visit)
    std::vector<char> placed(records.size(), 0);
    auto kids = [&](std::size_t i) -> std::vector<std::size_t> const* {
      auto const it = children.find(records[i].key);
      return it == children.end() ? nullptr : &it->second;
    };
    if (auto const roots = children.find(0); roots != children.end()) {
      for (auto root : roots->second) {
        path.push_back({root, 0});
        tokens.insert(tokens.end(), records[root].ids.begin(), records[root].ids.end());
        slots.push_back(records[root].slot);
        placed[root] = 1;
        while (!path.empty()) {
          auto& [i, next] = path.back();
          auto const* k = kids(i);
          if (k != nullptr && next < k->size()) {
            std::size_t const c = (*k)[next++];
            if (placed[c] != 0) { continue; }  // a cycle only a hash collision could make
            placed[c] = 1;
            path.push_back({c, 0});
            tokens.insert(tokens.end(), records[c].ids.begin(), records[c].ids.end());
            slots.push_back(records[c].slot);
            continue;
          }
          if (k == nullptr) { stats_.restored_pages += tree_.adopt(tier::file, tokens, slots).pages; }
          path.pop_back();
          tokens.resize(tokens.size() - std::size_t(per_page));
          slots.pop_back();
        }
      }
    }
    stats_.restore_dropped = std::int64_t(records.size()) - stats_.restored_pages;
  }

  /// Hands queued backups and demotions to the executor. Without `device_sources` (calls that may
  /// come from any thread with any stream: `poll`, `submit`) copies that read device pages stay
  /// queued for a call on the engine's stream, which orders them after the compute writing those pages.
  void submit_queued(stream_type stream, bool device_sources = true)
  {
    for (auto& o : tree_.take_copies()) {
      queued_.push_back(std::move(o));
    }
    // One submission per order: each backup or demotion settles (and frees its source) as soon as
    // it lands, not when the slowest of a group does.
    std::vector<copy_order> kept;
    for (auto& o : std::exchange(queued_, {})) {
      if (!device_sources && o.from == tier::device) {
        kept.push_back(std::move(o));
        continue;
      }
      std::vector<copy_order> one;
      one.push_back(std::move(o));
      (void)submit_orders(std::move(one), copy_kind::copy, stream, nullptr);
    }
    queued_ = std::move(kept);
  }
  handle_type submit_orders(std::vector<copy_order> orders, copy_kind kind, stream_type stream,
                            std::vector<started_request> const* readers)
  {
    for (auto const& o : orders) {
      stats_.bytes_moved[std::size_t(o.from)][std::size_t(o.to)] +=
          std::int64_t(o.from_pages.size()) * tiers_.geometry().page_bytes();
    }
    submission sub{++submissions_,
                   executor_.submit(tiers_, std::span<copy_order const>{orders}, kind, stream),
                   std::move(orders),
                   kind,
                   {}};
    if (readers != nullptr) {
      for (auto const& r : *readers) {
        sub.requests.push_back(r.id);
      }
    }
    handle_type h = sub.handle;
    inflight_.push_back(std::move(sub));
    return h;
  }

  /// Settles submission `i` if it is no longer pending (removing it); false while it is.
  bool settle(std::size_t i)
  {
    copy_status const st = executor_.status(inflight_[i].handle);
    if (st == copy_status::pending) { return false; }
    submission sub = std::move(inflight_[i]);
    inflight_.erase(inflight_.begin() + std::ptrdiff_t(i));
    if (st == copy_status::done) {
      for (auto const& o : sub.orders) {
        release_device(tree_.complete(o.id));
        if (o.to == tier::device) {
          for (auto p : o.to_pages) {
            arriving_.erase(p);
          }
        }
      }
      return true;
    }
    ++stats_.failed_transfers;
    std::set<std::int64_t> lost;  // device pages the failed copy was filling
    for (auto const& o : sub.orders) {
      release_device(tree_.cancel(o.id));
      if (o.to != tier::device) { continue; }
      for (auto p : o.to_pages) {
        lost.insert(p);
        arriving_.erase(p);
      }
    }
    // Every live request whose page table holds a lost page — the batch's, or a later one that found
    // the pages on their way — read garbage: a running one keeps those pages (freed with it) and is
    // marked failed; any other starts over, as does every first chunk of the failed batch.
    std::vector<request_id> again;
    for (auto& [id, r] : requests_) {
      bool const reads = std::any_of(r->prefix.begin(), r->prefix.end(), [&](auto p) { return lost.count(p) != 0; });
      bool const reader = std::find(sub.requests.begin(), sub.requests.end(), id) != sub.requests.end();
      if (!reads && !reader) { continue; }
      if (r->at != stage::running) {
        again.push_back(id);
        continue;
      }
      r->failed = true;
      for (auto p : r->prefix) {
        if (lost.erase(p) != 0) { r->extra.push_back(p); }
      }
    }
    for (auto p : lost) {
      tiers_.device().slots().release(std::span<std::int64_t const>{&p, 1});
    }
    std::sort(again.begin(), again.end());
    for (auto id : again) {  // locks and marks go first, so that the lost copies can go
      unhold(id, *requests_.at(id));
    }
    // What a record store failed to read back is not trusted again: those copies leave the index
    // (with the prefixes cached only below them), so the requests recompute rather than retry.
    // (Only reads from a record store into the device or the host: a failed write below it says
    // nothing of the source copy.)
    std::vector<request_id> unmarked;
    for (auto const& o : sub.orders) {
      if (o.from < tier::file || o.to >= tier::file || !tree_.alive(o.node)) { continue; }
      discard_result const d = tree_.discard(o.node, o.from);
      release_device(d.freed_device);
      for (auto n : d.pages) {
        stats_.discarded_pages += n;
      }
      unmarked.insert(unmarked.end(), d.unmarked.begin(), d.unmarked.end());
    }
    for (auto id : again) {
      requeue(id);
    }
    for (auto id : unmarked) {  // waiting requests whose marks hung below what went: they mark again
      auto const r = requests_.find(id);
      if (r == requests_.end() || tree_.transient_pages(id) > 0) { continue; }  // gone, or marked again already
      r->second->transient_pages = 0;
      unblock(id);
      mark(id, *r->second);
    }
    return true;
  }

  /// A request whose load failed starts over (its pages went back with `unhold`): it waits, and its
  /// next start finds only what is really cached.
  void requeue(request_id id)
  {
    auto const it = requests_.find(id);
    if (it == requests_.end()) { return; }
    state& s = *it->second;
    bool const was_waiting = std::find(waiting_state_.begin(), waiting_state_.end(), &s) != waiting_state_.end();
    s.at = stage::waiting;
    unblock(id);
    mark(id, s);
    if (was_waiting) {
      for (auto& w : waiting_) {
        if (w.id == id) { w.started = false, w.prefilled_tokens = 0, w.cached_tokens = 0; }
      }
    } else {
      waiting_request w;
      w.id = id;
      w.tokens = s.tokens;
      w.prompt_tokens = s.prompt_tokens;
      w.output_tokens = s.max_new_tokens;
      waiting_.insert(waiting_.begin(), w);
      waiting_state_.insert(waiting_state_.begin(), &s);
    }
    ++stats_.requeued;
  }

  /// Marks a request's uncached prefix as about to be computed by it (delay hits need
  /// marks). When its prefix runs into another request's transient prefix, that request will
  /// compute it: this one is marked again once that one commits or goes (`unblock`), so that of
  /// several requests extending the same prefix one marks — and computes — the extension.
  void mark(request_id id, state& s)
  {
    if (!scheduler_.uses_transient_nodes() || s.transient_pages > 0) { return; }
    match_result const m = tree_.probe(s.tokens);
    if (m.transient_tokens > 0 && m.transient_owner != id) {
      blocked_[m.transient_owner].push_back(id);
      return;
    }
    s.transient_pages = tree_.mark_in_queue(id, s.tokens) / page_tokens();
    if (s.transient_pages > 0 && s.at == stage::prefilling) { tree_.mark_in_flight(id); }
  }
  /// `owner`'s transient prefix committed or went: the requests that ran into it and have not
  /// finished their prefill mark again (one computing already marks what it computes, so that
  /// later requests wait for it).
  void unblock(request_id owner)
  {
    auto const it = blocked_.find(owner);
    if (it == blocked_.end()) { return; }
    std::vector<request_id> const ids = std::move(it->second);
    blocked_.erase(it);
    for (auto id : ids) {
      auto const r = requests_.find(id);
      if (r != requests_.end() && (r->second->at == stage::waiting || r->second->at == stage::prefilling)) {
        mark(id, *r->second);
      }
    }
  }

  /// Content keys of a request's whole pages from page `from` on, chained over the prefix (equal
  /// keys, equal prefixes).
  [[nodiscard]] std::vector<std::uint64_t> page_keys(state const& s, std::int64_t from) const
  {
    std::int64_t const whole = whole_pages(s);
    std::int64_t const per_page = options_.page_ids ? 1 : page_tokens();
    std::vector<std::uint64_t> keys;
    std::uint64_t h = 0x243f6a8885a308d3ull;
    for (std::int64_t p = 0; p < whole; ++p) {
      for (std::int64_t i = p * per_page; i < (p + 1) * per_page; ++i) {
        h = (h ^ std::uint64_t(std::uint32_t(s.tokens[std::size_t(i)]))) * 0x100000001b3ull;
        h ^= h >> 29;
      }
      if (p >= from) { keys.push_back(h); }
    }
    return keys;
  }
  /// Whether a request computing pages no mark covers (its prefix ran into another request's
  /// transient prefix shorter than the delay-hit threshold, and nothing hangs below a transient
  /// node) is computing the first pages of `keys` — at least the delay-hit threshold of them.
  /// Such requests register their pages in `unmarked_computing_` when they start.
  [[nodiscard]] bool computed_elsewhere(std::vector<std::uint64_t> const& keys) const
  {
    std::int64_t shared = 0;
    request_id other{};
    for (auto k : keys) {
      auto const it = unmarked_computing_.find(k);
      if (it == unmarked_computing_.end() || (shared > 0 && it->second != other)) { break; }
      other = it->second;
      ++shared;
    }
    return shared > 0 && shared * page_tokens() >= options_.delay_hit_tokens;
  }

  /// Gives up what a request holds: transient prefix, locks, own pages.
  void unhold(request_id id, state& s)
  {
    for (auto k : s.computing_keys) {
      unmarked_computing_.erase(k);
    }
    s.computing_keys.clear();
    if (tree_.transient_pages(id) > 0) { tree_.abort(id); }
    s.transient_pages = 0;
    if (s.locked) { tree_.unlock(s.node, tier::device); }
    s.locked = false;
    release_device(s.computed);
    release_device(s.extra);
    s.computed.clear();
    s.extra.clear();
    s.prefix.clear();
  }

  void drop(request_id id, state& s)
  {
    unhold(id, s);
    unblock(id);
    for (std::size_t i = 0; i < waiting_state_.size(); ++i) {
      if (waiting_state_[i] == &s) {
        waiting_.erase(waiting_.begin() + std::ptrdiff_t(i));
        waiting_state_.erase(waiting_state_.begin() + std::ptrdiff_t(i));
        break;
      }
    }
    for (auto& sub : inflight_) {  // a pending load no longer requeues it
      sub.requests.erase(std::remove(sub.requests.begin(), sub.requests.end(), id), sub.requests.end());
    }
    requests_.erase(id);
    ++stats_.released;
  }

  tiers_type tiers_;
  controller_options options_;
  scheduler_type scheduler_;
  executor_type executor_;
  std::vector<kept_record> recovered_;  // until `restore`: records kept across a restart
  hiradix_tree tree_;
  mutable std::mutex m_;
  std::unordered_map<request_id, std::unique_ptr<state>, request_hash> requests_;
  std::vector<waiting_request> waiting_;
  std::vector<state*> waiting_state_;
  std::vector<submission> inflight_;
  std::vector<copy_order> queued_;
  std::unordered_map<request_id, std::vector<request_id>, request_hash> blocked_;  // owner -> waiting on its mark
  std::unordered_map<std::uint64_t, request_id> unmarked_computing_;               // see computed_elsewhere
  std::unordered_map<std::int64_t, std::uint64_t> arriving_;  // device page -> load submission filling it
  std::uint64_t round_ = 0;
  std::uint64_t begun_ = 0;
  std::uint64_t submissions_ = 0;
  cache_stats stats_{};
};

}  // namespace strata
