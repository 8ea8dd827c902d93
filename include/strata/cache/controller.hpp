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
 * cache.submit({id, tokens, 0, max_new_tokens});
 * batch_plan plan = cache.schedule({token_budget, running...});
 * auto loads = cache.begin_loads(plan, stream);             // device pages held, loads submitted
 * for (layer l) { strata::wait_layer(loads, l, stream); attention(l, cache.page_table(id)); }
 * cache.complete(loads);                                    // or poll(): landed copies
 * cache.finish_prefill(id, stream);                         // prompt pages into the index, backups
 * ... decode ...
 * cache.release(id);                                        // pages back, locks dropped
 * ```
 * `wait_layer` is the executor's free function (`cache/policies.hpp` on the CPU,
 * `cache/gpu_policies.cuh` on the GPU). Host-only: the executor hides CUDA.
 *
 * Thread safety: every public member may be called from any thread; calls are serialised on one
 * internal mutex, so completions (`poll`) can progress on a helper thread while the engine thread
 * schedules. Handles (`load_handle`) are values: waiting on one never takes the lock.
 *
 * This header is the face. The controller's state lives in small components with invariants of
 * their own (`cache/detail/`: the submission log, the compute registry, restart restore, the
 * per-request state); the member definitions are in `cache/detail/controller*.inl`.
 */
#pragma once

#include <strata/cache/detail/compute_registry.hpp>
#include <strata/cache/detail/request_state.hpp>
#include <strata/cache/detail/restore.hpp>
#include <strata/cache/detail/submission_log.hpp>
#include <strata/cache/executor.hpp>
#include <strata/cache/policies.hpp>
#include <strata/cache/remote_tier.hpp>
#include <strata/cache/requests.hpp>
#include <strata/index/hiradix_tree.hpp>
#include <strata/presets/h200.hpp>
#include <strata/sched/cost_model.hpp>
#include <strata/sched/toolkit.hpp>
#include <strata/tier/device_pool.hpp>
#include <strata/tier/tier_stack.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace strata {

/**
 * @brief The cache controller. See the file comment for the loop; each member says what it
 *        checks. Every rejected call throws `strata::invalid_argument` and changes nothing.
 * @tparam Policies a `cache_policies` bundle (`cpu_policies`, `gpu_policies`, `sim::sim_policies`)
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
  using prefill_result_type = prefill_result<handle_type>;  ///< what `finish_prefill` found

  /**
   * @param tiers the stores, fastest first (moved in)
   * @param options policies, thresholds, cost model
   * @param scheduler the strategy
   * @param executor the copy executor
   * @throw strata::invalid_argument for a cost model of another page size, a prefetch timeout out
   *        of range, a page too large for the file tier's records, or what the index rejects
   */
  explicit cache_controller(tiers_type tiers, controller_options options = {},
                            scheduler_type scheduler = scheduler_type{}, executor_type executor = executor_type{});

  /**
   * @brief The common two-tier case: the engine's pool (`engine_pool`, a layout over its KV
   *        memory) and a host tier of `host_pages` pages, built here — `cache_controller
   *        cache{layout, host_pages};` for `cpu_policies<L>` or `gpu_policies<L>`.
   * @throw as the other constructor, or what the host tier rejects (a non-positive size; memory)
   */
  template <kv_layout Layout>
  requires(tiers_type::size == 2 &&
           std::constructible_from<tiers_type, device_pool<Layout>, typename tiers_type::template store_type<1>> &&
           std::constructible_from<typename tiers_type::template store_type<1>, kv_geometry, std::int64_t>)
  cache_controller(Layout const& engine_pool, std::int64_t host_pages, controller_options options = {},
                   scheduler_type scheduler = scheduler_type{}, executor_type executor = executor_type{})
      : cache_controller(tiers_type{device_pool<Layout>{engine_pool},
                                    typename tiers_type::template store_type<1>{engine_pool.geometry(), host_pages}},
                         std::move(options), std::move(scheduler), std::move(executor))
  {
  }

  cache_controller(cache_controller const&) = delete;
  cache_controller& operator=(cache_controller const&) = delete;

  // --- the engine loop ----------------------------------------------------------------------------

  /**
   * @brief A request arrives: it waits for `schedule`. With a strategy that uses delay hits, its
   *        uncached prefix is marked as about to be computed. When its cached prefix lies in the
   *        file (or remote) tier, a prefetch copies it up to the host tier
   *        (`controller_options::prefetch`; copies submitted on `stream`).
   * @throw strata::invalid_argument for a live id, no tokens, `max_new_tokens < 1`, a prompt
   *        shorter than its whole pages, or a stream the executor refuses
   */
  void submit(cache_request const& r, stream_type stream = {});

  /**
   * @brief The next batch: the strategy's plan over the waiting requests, matched against the
   *        index (`plan_batch`). Pass it to `begin_loads` before the next `schedule` (a plan is only
   *        valid until then). Its positions are those of the requests the strategy saw.
   * @throw strata::invalid_argument for a non-positive token budget or negative running figures
   */
  [[nodiscard]] batch_plan schedule(schedule_budget const& budget);

  /**
   * @brief Carries out `plan` (the last `schedule`'s): holds device pages for each first chunk
   *        (with `controller_options::device_pages_by_chunk`, for every chunk: later chunks first;
   *        evicting under pressure), locks cached prefixes, submits the loads of the whole batch in
   *        one executor submission on `stream`, and advances every item's prefill. Chunks that
   *        find no device memory, first chunks whose prefix another request began computing since
   *        the plan was made or whose cached node is gone, are skipped (they wait for a later round).
   * @throw strata::invalid_argument for a plan that is not the last one scheduled, or one already
   *        begun, or a stream the executor refuses (another device's); nothing changes then
   */
  [[nodiscard]] load_handle_type begin_loads(batch_plan const& plan, stream_type stream = {});

  /**
   * @brief Completes the batch's loads in the index if they landed (or failed: its first chunks
   *        then wait again, their cached pages to be recomputed). True once nothing is pending.
   */
  bool complete(load_handle_type const& h);

  /**
   * @brief Completes every landed copy (loads, backups, demotions, prefetches) in the index, freeing
   *        demoted device pages; a failed one is cancelled (a failed load sends its requests back to
   *        wait). Copies that landing made due (a host page written through to the file tier) are
   *        submitted on `stream`.
   * @return submissions still pending
   * @throw strata::invalid_argument for a stream the executor refuses
   */
  std::size_t poll(stream_type stream = {});

  /**
   * @brief The request's device pages: one per whole prompt page (cached, loaded or to compute),
   *        then pages for the partial last page and `max_new_tokens`. Valid from `begin_loads`
   *        on; `finish_prefill` may swap computed duplicates for the index's equal pages. With
   *        `controller_options::device_pages_by_chunk` it holds the pages of the chunks begun so
   *        far (all of them once the last chunk began): read it after every `begin_loads`.
   * @throw strata::invalid_argument for an unknown request or one not started
   */
  [[nodiscard]] std::vector<std::int64_t> page_table(request_id id) const;

  /**
   * @brief The request's prompt is computed: its pages enter the index (its own transient prefix is
   *        committed; pages another request committed meanwhile are swapped for the index's and
   *        freed), backups follow the write policy (submitted on `stream`, after the work there).
   * @throw strata::invalid_argument for an unknown request, one whose last chunk has not run, or a
   *        stream the executor refuses
   */
  prefill_result_type finish_prefill(request_id id, stream_type stream = {});

  /**
   * @brief The request is done (or abandoned): its locks go and its own pages return to the pool.
   *        `cache_tokens`, when given, are the tokens to keep for a later turn — the prompt followed
   *        by the output (ids in the same form as `submit`'s): their whole pages enter the index
   *        from the request's page table first (only after `finish_prefill`). Give only tokens
   *        whose KV the page table holds: the last sampled token's KV is never computed (it was
   *        not fed back), and a whole page ending with it would be cached with one row unwritten.
   *
   * Releasing a request that has not finished its prefill aborts it (its transient prefix is dropped).
   * @throw strata::invalid_argument for a stream the executor refuses, an unknown request,
   *        `cache_tokens` before `finish_prefill`, tokens that do not extend the prompt, or more
   *        whole pages than its page table holds
   */
  void release(request_id id, std::span<std::int32_t const> cache_tokens = {}, stream_type stream = {});

  // --- explicit control and state ----------------------------------------------------------------

  /**
   * @brief Evicts `pages` pages of tier `t` as `hiradix_tree::evict` does (least recently used
   *        tier-leaves first; demotions submitted on `stream`; a demoted leaf's parent is taken by a
   *        later call, once the demotion landed). @return pages leaving the tier
   * @throw strata::invalid_argument for a negative count, a tier the stack lacks, or a stream the
   *        executor refuses
   */
  std::int64_t evict(tier t, std::int64_t pages, stream_type stream = {});

  /// @brief What `schedule` would find cached for `tokens` (no side effects).
  [[nodiscard]] match_result probe(std::span<std::int32_t const> tokens) const;
  /// @brief Free device pages plus those eviction could free.
  [[nodiscard]] std::int64_t device_pages_available() const;
  /// @brief Requests in the waiting list (not started, or with prompt chunks left).
  [[nodiscard]] std::size_t waiting() const;
  /// @brief Whether a load the request had already computed on failed, or a load still filling pages
  ///        its page table points at after `finish_prefill` (`prefill_result::after`, the moment
  ///        `wait_after` returns false): its output is wrong and it should be aborted (`release`)
  ///        and resubmitted. @throw strata::invalid_argument for an unknown request
  [[nodiscard]] bool failed(request_id id) const;
  /// @brief Whether the request's last chunk ran and `finish_prefill` is due: false while chunks
  ///        are left, after `finish_prefill`, and once a failed load of its batch sent it back to
  ///        wait (`complete`/`poll`: what the engine computed from that batch must be dropped; it
  ///        runs again when scheduled). @throw strata::invalid_argument for an unknown request
  [[nodiscard]] bool prefilled(request_id id) const;
  /// @brief Live requests (submitted, not released).
  [[nodiscard]] std::size_t live_requests() const;
  /// @brief Executor submissions not yet settled.
  [[nodiscard]] std::size_t pending_submissions() const;
  /// @brief Counters.
  [[nodiscard]] cache_stats stats() const;
  /// @brief The index's counters and residency.
  [[nodiscard]] hiradix_stats index_stats() const;
  /// @brief Checks the index's and the controller's invariants (for tests): every device page is
  ///        free, held by the index, or owned by one live request — never two of these.
  void check_invariants() const;

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
  // The machinery: defined in cache/detail/controller*.inl, never part of the API.
  using state = detail::request_state;
  using stage = detail::request_stage;
  using log_type = detail::submission_log<executor_type>;
  using submission = typename log_type::entry;

  /// The options with the cost model defaulted (H200 figures for the tiers' geometry), checked.
  static controller_options checked_options(controller_options o, tiers_type const& tiers);
  [[nodiscard]] hiradix_config index_config() const;
  state& live(request_id id, char const* what) const;
  [[nodiscard]] std::int64_t ids_per_page() const noexcept { return options_.ids_are_pages ? 1 : page_tokens(); }
  [[nodiscard]] std::int64_t whole_pages(state const& s) const noexcept
  { return std::int64_t(s.tokens.size()) / ids_per_page(); }
  [[nodiscard]] std::int64_t device_pages_available_locked() const
  { return tiers_.device().slots().available() + tree_.reclaimable_pages(tier::device); }
  [[nodiscard]] double now() const;
  /// Refuses a stream the executor cannot order its copies with, before anything changes.
  void check_stream(stream_type const& stream) const;

  // -- device pages and starting a request --
  /// Device pages for `n`, evicting under pressure (demotions queued). None: no room.
  std::optional<std::vector<std::int64_t>> allocate(std::int64_t n);
  void release_device(std::span<std::int64_t const> pages);
  /// Starts a first chunk: holds its pages, orders its loads. False without memory.
  bool start(prefill_item const& it, stream_type stream, load_handle_type& h, std::vector<copy_order>& loads);
  /// A later chunk's pages (`device_pages_by_chunk`). False without memory.
  bool extend(prefill_item const& it, stream_type stream);
  void hold(state& s, waiting_request& w, std::span<std::int64_t const> pages);

  // -- prefetch --
  void prefetch(state& s, stream_type stream);
  [[nodiscard]] bool worth_reading(match_result const& m, std::int64_t prompt_tokens) const;
  [[nodiscard]] bool reading_pays(std::array<std::int64_t, tier_count> const& pages, std::int64_t upper,
                                  std::int64_t end, std::int64_t prompt_tokens) const;
  bool held_for_prefetch(std::vector<std::size_t>& shown);

  // -- remote lookups (a remote tier over a shared store: `prompt_lookup_store`) --
  void start_lookup(state& s);
  /// Settles the lookups that answered: adopts the pages found, then prefetches them (`stream`) or
  /// leaves that to the next `poll`.
  void settle_lookups(stream_type const* stream);

  // -- settling submissions --
  /// Settles in-flight submission `i` if it is no longer pending (removing it); false while it is.
  bool settle(std::size_t i);
  void landed(submission const& sub);
  void failed_copy(submission const& sub);
  void requeue(request_id id);

  // -- transient marks --
  void mark(request_id id, state& s);
  void unblock(request_id owner);
  /// Content keys of a request's whole pages from page `from` on (`chain_key` over its prefix).
  [[nodiscard]] std::vector<std::uint64_t> page_keys(state const& s, std::int64_t from) const;

  // -- giving up what a request holds --
  void unhold(request_id id, state& s);
  void drop(request_id id, state& s);

  tiers_type tiers_;
  controller_options options_;
  scheduler_type scheduler_;
  executor_type executor_;
  detail::recovered_records recovered_;  // records kept across a restart, until the index adopted them
  hiradix_tree tree_;
  mutable std::mutex m_;
  std::unordered_map<request_id, std::unique_ptr<state>, request_hash> requests_;
  std::vector<waiting_request> waiting_;  // the strategy's view
  std::vector<state*> waiting_state_;     // the same requests, in the same order
  log_type log_;
  detail::compute_registry registry_;
  std::uint64_t round_ = 0;
  std::uint64_t begun_ = 0;
  std::uint64_t submissions_ = 0;
  std::vector<std::pair<request_id, std::uint64_t>> planned_;  // the last plan's prefills: id, submission
  std::size_t lookups_pending_ = 0;                            // waiting requests with a remote lookup
  std::vector<std::uint64_t> orphan_lookups_;                  // lookups of requests released meanwhile
  cache_stats stats_{};
};

}  // namespace strata

#include <strata/cache/detail/controller.inl>
#include <strata/cache/detail/controller_internals.inl>
