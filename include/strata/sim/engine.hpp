// SPDX-License-Identifier: Apache-2.0
/**
 * @file sim/engine.hpp
 * @brief Discrete-event simulation of engine instances in virtual time, driving the real
 *        `hiradix_tree` and the real scheduler strategies, with the cost model as the clock.
 *
 * One engine iteration is a prefill batch when one can be formed (its loads from lower tiers
 * overlapped layer by layer with its compute, or before it, as the transfer system does; decode
 * steps fill a load-bound batch's stall when the plan says so), else a decode step of the running
 * requests (SGLang's order; `decode_after_prefill` adds a decode step after every prefill batch). Backups and demotions
 * run on their own links (device -> host is the other direction of PCIe: it does not slow loads). Several engines
 * behind a router share one clock.
 */
#pragma once

#include <strata/cache/controller.hpp>
#include <strata/presets/h200.hpp>
#include <strata/sim/shared_remote.hpp>
#include <strata/sim/virtual_executor.hpp>
#include <strata/sim/workload.hpp>

#include <algorithm>
#include <array>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <queue>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace strata::sim {

/// @brief One engine instance's resources and limits.
struct engine_config {
  cost_model costs;               ///< the clock: loads, prefill, decode
  std::int64_t device_pages = 0;  ///< KV pages the GPU pool holds
  std::int64_t host_pages = 0;    ///< host tier (0: none)
  std::int64_t file_pages = 0;    ///< file tier (0: none)
  std::int64_t remote_pages = 0;  ///< remote tier (0: none)
  /// A remote store shared with other instances: pages one writes, others find at submit (`simulate`
  /// gives its engines one, empty at the start, when this is set). Null: the remote tier (if any)
  /// is this engine's alone.
  std::shared_ptr<shared_remote_pages> shared_remote;
  write_policy backup_policy = write_policy::write_through;  ///< device -> host backups
  std::int64_t token_budget = 8192;    ///< most prefill tokens per batch (longer prompts are chunked)
  std::int64_t delay_hit_tokens = 64;  ///< shortest transient match that is a delay hit
  /// After each prefill batch, one decode step of the running requests (false: a decode step only
  /// when no prefill batch can be formed, as SGLang's scheduler does).
  bool decode_after_prefill = false;
  /// Prefix prefetch from the file (remote) tier to the host at arrival (`controller_options::prefetch`).
  prefetch_mode prefetch = prefetch_mode::best_effort;
  double prefetch_timeout_s = 0.05;  ///< virtual seconds, for `prefetch_mode::timeout`
  /// Record tiers take only what a later read pays for, copied as pages reach the host, and drop
  /// writes past their backlog (`controller_options::records_by_cost`, `file_backup_policy`,
  /// `record_write_backlog_s`); false: every page, written back on host eviction, queued however
  /// long (the file tier before issue 20).
  bool record_rules = true;
  /// Device pages taken chunk by chunk (`controller_options::device_pages_by_chunk`); false (the
  /// controller's default): a request's first chunk takes all of its pages.
  bool pages_by_chunk = false;

  /// @throw strata::invalid_argument for an empty (default) cost model, a device pool of no pages,
  ///        negative tiers, or a non-positive budget
  void validate() const
  {
    STRATA_EXPECTS(costs.page_bytes() > 0,
                   "engine_config: costs is an empty cost_model: build one with "
                   "h200::costs(model, io) or cost_model(compute, io, page_bytes, page_tokens)");
    STRATA_EXPECTS(device_pages > 0, "engine_config: device_pages must be positive, got ", device_pages);
    STRATA_EXPECTS(host_pages >= 0 && file_pages >= 0 && remote_pages >= 0,
                   "engine_config: tier sizes must not be negative");
    STRATA_EXPECTS(token_budget > 0, "engine_config: token_budget must be positive, got ", token_budget);
    STRATA_EXPECTS(delay_hit_tokens >= 0, "engine_config: delay_hit_tokens must not be negative");
  }
};

/// @brief What happened to one request.
struct request_record {
  request_id id{};
  int instance = 0;
  double arrival_s = 0;
  double first_token_s = -1;  ///< -1: never served (rejected: larger than the device pool)
  double finish_s = -1;
  std::int64_t prompt_tokens = 0;
  std::int64_t output_tokens = 0;
  std::array<std::int64_t, tier_count> cached_tokens{};  ///< prompt tokens found in each tier (fastest holding it)
  std::int64_t computed_tokens = 0;                      ///< prompt tokens prefilled
  std::int64_t redundant_tokens = 0;                     ///< computed, then found cached by another request's prefill
  /// Computed, then found cached by an earlier turn's answer that finished meanwhile (multi-turn:
  /// the next turn raced the answer's caching; not a prefix two prefills computed together).
  std::int64_t answer_race_tokens = 0;
  /// Of `redundant_tokens`, those in an overlap with another request's transient prefix shorter than
  /// the delay-hit threshold (too short to be worth waiting for: not a delay hit).
  std::int64_t short_overlap_tokens = 0;
  int deferrals = 0;
  int delay_hit_deferrals = 0;
  [[nodiscard]] bool served() const noexcept { return first_token_s >= 0; }
  [[nodiscard]] double ttft_s() const noexcept { return first_token_s - arrival_s; }
};

/// @brief Time accounting of one engine.
struct engine_counters {
  double prefill_s = 0;        ///< time in prefill batches
  double decode_s = 0;         ///< time in decode steps outside prefill batches
  double io_stall_s = 0;       ///< prefill batch time not covered by compute (waiting for loads)
  double bubble_filled_s = 0;  ///< of that, decode steps run in the stall
  std::int64_t prefill_batches = 0;
  std::int64_t decode_steps = 0;
  std::int64_t bubble_steps = 0;
  std::int64_t loaded_pages = 0;
  std::array<std::int64_t, tier_count> loaded_from{};  ///< of `loaded_pages`, by the tier they came from
  double record_read_s = 0;  ///< prefill batch time reading file (and remote) records before compute
  std::int64_t backup_pages = 0;
  std::int64_t rejected = 0;
};

/// @brief The simulator's tiers: page ids only, every tier present (capacity 0: absent).
using virtual_tiers =
    tier_stack<virtual_pool<tier::device>, virtual_pool<tier::host>, virtual_pool<tier::file>, virtual_remote>;

/// @brief The policy bundle the simulator runs a strategy with: virtual tiers and time.
template <scheduler_strategy Strategy>
struct sim_policies {
  using tiers = virtual_tiers;        ///< page ids only
  using scheduler = Strategy;         ///< the strategy under test
  using executor = virtual_executor;  ///< copies land in virtual time
};

/**
 * @brief One engine instance: virtual time and accounting around a `cache_controller`, which owns
 *        the request lifecycle (the index, device pages, loads, backups) exactly as for a real engine.
 * @tparam Strategy the scheduler
 */
template <scheduler_strategy Strategy>
class engine {
 public:
  using controller_type = cache_controller<sim_policies<Strategy>>;  ///< what the engine drives

  /**
   * @throw strata::invalid_argument for a bad configuration
   */
  engine(engine_config config, Strategy strategy, int instance = 0)
      : config_{(config.validate(), config)},
        instance_{instance},
        cache_{tiers(config_), options(config_), std::move(strategy), virtual_executor{config_.costs}}
  {
  }

  /// @brief Virtual time of this engine.
  [[nodiscard]] double now() const noexcept { return now_; }
  /// @brief Whether requests are waiting or running.
  [[nodiscard]] bool busy() const noexcept { return waiting_ > 0 || !running_.empty(); }
  /// @brief When it next has something to do: now while requests wait or run; idle, sharing a
  ///        remote tier, when its next copy lands (copies must land, and be written on, for the
  ///        other instances to find them); else infinity.
  [[nodiscard]] double next_event()
  {
    if (busy()) { return now_; }
    if (!config_.shared_remote) { return std::numeric_limits<double>::infinity(); }
    return std::max(now_, cache_.executor().next_copy_landing());
  }
  /// @brief Requests waiting or running.
  [[nodiscard]] std::size_t outstanding() const noexcept { return waiting_ + running_.size(); }
  /// @brief The cache controller (its index answers the router's probes).
  [[nodiscard]] controller_type const& cache() const noexcept { return cache_; }
  /// @brief Time accounting.
  [[nodiscard]] engine_counters counters() const
  {
    engine_counters c = counters_;
    c.backup_pages = cache_.executor().backup_pages();
    return c;
  }

  /// @brief A request arrives at `at` (the clock moves there if the engine was idle before it).
  void arrive(sim_request const& r, request_record& rec, double at)
  {
    set_now(std::max(now_, at));
    auto a = std::make_unique<active>();
    a->req = &r;
    a->rec = &rec;
    a->tokens = r.pages();
    rec.id = r.id;
    rec.instance = instance_;
    rec.arrival_s = at;
    rec.prompt_tokens = r.prompt_tokens;
    rec.output_tokens = r.output_tokens;
    if (first_chunk_pages(r.prompt_tokens, r.output_tokens, 0, 0, config_.costs.page_tokens()) > config_.device_pages) {
      rec.finish_s = now_;  // larger than the device pool: the controller refuses it, turned away at once
      finished_.push_back(r.id);
      ++counters_.rejected;
      return;
    }
    cache_.submit({r.id, a->tokens, r.prompt_tokens, r.output_tokens, at});
    ++waiting_;
    actives_.emplace(r.id, std::move(a));
  }

  /// @brief One iteration.
  void step()
  {
    (void)cache_.poll();  // backups and demotions that landed by now
    if (!busy()) {
      if (double const next = cache_.executor().next_copy_landing();
          config_.shared_remote && next < std::numeric_limits<double>::infinity()) {
        set_now(std::max(now_, next));  // idle, sharing a remote tier: its copies go on
      }
      return;
    }
    batch_plan plan;
    if (waiting_ > 0) {
      schedule_budget b;
      b.tokens = config_.token_budget;
      running_stats(b.running_sequences, b.running_context_tokens, b.running_max_remaining);
      plan = cache_.schedule(b);
      for (auto const& d : plan.deferred) {
        request_record& rec = *actives_.at(d.id)->rec;
        ++rec.deferrals;
        if (d.reason == deferral_reason::delay_hit) { ++rec.delay_hit_deferrals; }
      }
    }
    if (!plan.prefills.empty() && run_prefill(plan)) { return; }
    if (!running_.empty()) {
      decode_step();
      return;
    }
    if (double const next = cache_.executor().next_copy_landing(); next < std::numeric_limits<double>::infinity()) {
      set_now(std::max(now_, next));  // memory comes back when demotions land
      return;
    }
    if (std::any_of(plan.deferred.begin(), plan.deferred.end(),
                    [](deferral const& d) { return d.reason == deferral_reason::changed; })) {
      return;  // the index changed while the plan was matched: the next round sizes those requests again
    }
    reject_one(plan);
  }

 private:
  struct active {
    sim_request const* req = nullptr;
    request_record* rec = nullptr;
    page_ids tokens;                 // whole pages of the prompt
    bool started = false;            // its first chunk ran (it holds device pages)
    std::int64_t short_overlap = 0;  // tokens of another request's transient prefix it shares, below the threshold
    bool cached_whole = false;       // its whole prompt was cached: its last page is computed again by design
    std::int64_t remaining = 0;
    std::int64_t context = 0;
  };

  virtual_tiers tiers(engine_config const& c)
  {
    // One layer, plane and head whose head row makes a page of the cost model's bytes: the
    // controller's byte counts are then the model's.
    std::int64_t const pt = c.costs.page_tokens();
    STRATA_EXPECTS(c.costs.page_bytes() % (16 * pt) == 0, "engine_config: page_bytes ", c.costs.page_bytes(),
                   " is not a multiple of 16 bytes per token");
    kv_geometry const g{1, pt, 1, c.costs.page_bytes() / pt, 1, 1};
    return virtual_tiers{virtual_pool<tier::device>{g, c.device_pages}, virtual_pool<tier::host>{g, c.host_pages},
                         virtual_pool<tier::file>{g, c.file_pages},
                         virtual_remote{g, c.remote_pages, c.shared_remote, [this] { return now_; }}};
  }
  controller_options options(engine_config const& c)
  {
    controller_options o;
    o.backup_policy = c.backup_policy;
    o.prefetch = c.prefetch;
    o.prefetch_timeout_s = c.prefetch_timeout_s;
    o.clock = [this] { return now_; };  // virtual time
    o.delay_hit_tokens = c.delay_hit_tokens;
    o.costs = c.costs;
    o.ids_are_pages = true;  // the index holds one id per page
    o.device_pages_by_chunk = c.pages_by_chunk;
    if (!c.record_rules) {  // the file tier before issue 20
      o.file_backup_policy = write_policy::write_back;
      o.records_by_cost = false;
      o.record_write_backlog_s = 0;
    }
    return o;
  }
  [[nodiscard]] std::int64_t page_tokens() const noexcept { return config_.costs.page_tokens(); }
  void set_now(double t)
  {
    now_ = t;
    cache_.executor().set_now(t);
  }

  void running_stats(std::int64_t& sequences, std::int64_t& context, std::int64_t& most) const
  {
    sequences = std::int64_t(running_.size());
    context = most = 0;
    for (auto const* a : running_) {
      context += a->context;
      most = std::max(most, a->remaining);
    }
  }

  /// Runs a batch; false if none of its requests could get device memory.
  bool run_prefill(batch_plan const& plan)
  {
    auto h = cache_.begin_loads(plan);
    if (h.ran.empty()) { return false; }
    for (auto const& st : h.started) {
      active& a = *actives_.at(st.id);
      a.started = true;
      for (std::size_t t = 0; t < tier_count; ++t) {
        a.rec->cached_tokens[t] += st.cached_pages[t] * page_tokens();
      }
      match_result const overlap = cache_.probe(a.tokens);
      a.short_overlap = overlap.transient_owner != a.req->id && !overlap.delay_hit ? overlap.transient_tokens : 0;
      a.cached_whole = overlap.tokens >= a.req->prompt_tokens;
    }
    double compute = 0;
    for (auto const& item : h.ran) {
      compute += config_.costs.prefill_s(item.chunk_tokens, item.context_tokens);
    }
    counters_.loaded_pages += h.loaded_pages[1] + h.loaded_pages[2] + h.loaded_pages[3];
    for (std::size_t t = 1; t < tier_count; ++t) {
      counters_.loaded_from[t] += h.loaded_pages[t];
    }
    // File pages: read into host records before the batch computes, then over PCIe layer by layer.
    double const load = config_.costs.load_s(h.loaded_pages);
    double const serial = config_.costs.serial_load_s(h.loaded_pages);
    double const batch = config_.costs.batch_s(load, compute, serial);
    double const stall = config_.costs.stall_s(load, compute, serial);
    counters_.record_read_s += config_.costs.record_read_s(h.loaded_pages);
    // Bubble filling: decode steps in the stall, as many as the plan asked for and fit.
    double used = 0;
    std::int64_t steps = 0;
    while (steps < plan.bubble_decode_steps && !running_.empty()) {
      std::int64_t n = 0, ctx = 0, most = 0;
      running_stats(n, ctx, most);
      double const dt = config_.costs.decode_s(n, ctx) * (1 + config_.costs.io().decode_slowdown);
      if (used + dt > stall) { break; }
      used += dt;
      ++steps;
      advance_decode(now_ + used);
    }
    counters_.bubble_steps += steps;
    counters_.bubble_filled_s += used;
    counters_.io_stall_s += stall;
    counters_.prefill_s += batch;
    ++counters_.prefill_batches;
    set_now(now_ + batch);
    if (h.transfer) { virtual_executor::land_at(*h.transfer, now_); }
    (void)cache_.complete(h);
    // Progress, first tokens, and the prompt's pages into the index.
    for (auto const& item : h.ran) {
      active& a = *actives_.at(item.id);
      a.rec->computed_tokens += item.chunk_tokens;
      if (item.last_chunk) { finish_prefill(a); }
    }
    if (config_.decode_after_prefill && steps == 0 && !running_.empty()) { decode_step(); }
    return true;
  }

  void finish_prefill(active& a)
  {
    a.rec->first_token_s = now_;
    --waiting_;
    auto const r = cache_.finish_prefill(a.req->id);
    // Pages computed although another request committed them meanwhile: redundant prefill, or an
    // earlier turn's answer cached while this turn computed (multi-turn).
    std::int64_t prefill_duplicates = 0;
    for (auto const p : r.duplicate_positions) {
      // A prompt cached whole computes its last page into a page of its own (the index's copy stays):
      // a duplicate by design, not work two requests did twice.
      if (a.cached_whole && p + 1 == std::int64_t(a.tokens.size())) { continue; }
      bool const answer = answer_pages_.count(a.tokens[std::size_t(p)]) != 0;
      (answer ? a.rec->answer_race_tokens : prefill_duplicates) += page_tokens();
    }
    a.rec->redundant_tokens += prefill_duplicates;
    a.rec->short_overlap_tokens += std::min(prefill_duplicates, a.short_overlap);
    a.remaining = a.req->output_tokens - 1;
    a.context = a.req->prompt_tokens + 1;
    running_.push_back(&a);
    if (a.remaining <= 0) { finish(a), running_.pop_back(); }
  }

  void decode_step()
  {
    std::int64_t n = 0, ctx = 0, most = 0;
    running_stats(n, ctx, most);
    double const dt = config_.costs.decode_s(n, ctx);
    counters_.decode_s += dt;
    ++counters_.decode_steps;
    set_now(now_ + dt);
    advance_decode(now_);
  }

  /// Every running request produces a token at time `t`.
  void advance_decode(double t)
  {
    std::vector<active*> still;
    for (auto* a : running_) {
      --a->remaining;
      ++a->context;
      if (a->remaining <= 0) {
        double const saved = now_;
        set_now(t);
        finish(*a);
        set_now(saved);
      } else {
        still.push_back(a);
      }
    }
    running_ = std::move(still);
  }

  void finish(active& a)
  {
    a.rec->finish_s = now_;
    request_id const id = a.req->id;
    std::span<std::int32_t const> keep;
    if (a.req->continuation) {  // the next turn reads this answer: cache prompt and answer pages
      page_ids const& next = *a.req->continuation;
      if (next.size() <= cache_.page_table(id).size()) {
        for (std::size_t p = a.tokens.size(); p < next.size(); ++p) {
          answer_pages_.insert(next[p]);
        }
        keep = next;
      }
    }
    cache_.release(id, keep);
    finished_.push_back(id);
    actives_.erase(id);
  }

 public:
  /// @brief Requests that finished since the last call (for closed-loop sessions).
  [[nodiscard]] std::vector<request_id> take_finished() { return std::exchange(finished_, {}); }

 private:
  /// Nothing can run and nothing will free memory: the oldest request that does not fit an empty
  /// pool is turned away.
  void reject_one(batch_plan const& plan)
  {
    // The request memory blocks: the first deferred for memory, else the first that failed to start.
    request_id victim{};
    for (auto const& d : plan.deferred) {
      if (d.reason == deferral_reason::memory) {
        victim = d.id;
        break;
      }
    }
    if (victim.value == 0 && !plan.prefills.empty()) { victim = plan.prefills.front().id; }
    if (victim.value == 0) {
      throw std::logic_error("strata::sim::engine: idle with requests waiting and none blocked by memory");
    }
    active& a = *actives_.at(victim);
    if (a.started) {  // a started prefill can always finish once nothing else holds pages
      throw std::logic_error("strata::sim::engine: a prefill under way is blocked with nothing running");
    }
    cache_.release(victim);  // drops its transient prefix
    a.rec->first_token_s = -1;
    a.rec->finish_s = now_;  // a session's next turn still comes
    finished_.push_back(victim);
    ++counters_.rejected;
    --waiting_;
    actives_.erase(victim);
  }

  engine_config config_;
  int instance_;
  controller_type cache_;
  double now_ = 0;
  std::size_t waiting_ = 0;  // submitted, prefill not finished
  std::vector<active*> running_;
  std::unordered_map<request_id, std::unique_ptr<active>, request_hash> actives_;
  std::vector<request_id> finished_;
  std::unordered_set<std::int32_t> answer_pages_;  // page ids cached from answers (multi-turn)
  engine_counters counters_;
};

/// @brief Outcome of a simulation.
struct simulation_result {
  std::string strategy;
  std::vector<request_record> records;    ///< by request, in arrival order
  std::vector<engine_counters> counters;  ///< by instance
  double makespan_s = 0;                  ///< last event
};

/**
 * @brief Simulates `w` on `instances` engines behind a cache-aware router (the instance with the
 *        longest prefix cached or being computed; the least loaded on ties). With
 *        `config.shared_remote` set, the engines share one remote store, empty at the start, and the
 *        router counts only what an instance holds itself (a shared page is as near to all).
 * @throw strata::invalid_argument for a bad configuration, a bad workload (`validate`) or no instances
 * @throw std::logic_error if an engine stalls with requests waiting and none blocked by memory
 *        (a strategy that defers every request for no reason the engine can resolve)
 */
template <scheduler_strategy Strategy>
simulation_result simulate(workload const& w, engine_config const& config, Strategy const& strategy, int instances = 1,
                           std::function<void(std::int64_t done, std::int64_t total)> const& progress = {})
{
  STRATA_EXPECTS(instances > 0, "simulate: instances must be positive, got ", instances);
  config.validate();  // before comparing its cost model with the workload
  validate(w);
  STRATA_EXPECTS(config.costs.page_tokens() == w.page_tokens, "simulate: the cost model's pages hold ",
                 config.costs.page_tokens(), " tokens, the workload's ", w.page_tokens);
  std::vector<std::unique_ptr<engine<Strategy>>> engines;
  engine_config shared = config;  // a shared remote store starts each simulation empty
  if (config.shared_remote) { shared.shared_remote = std::make_shared<shared_remote_pages>(); }
  for (int i = 0; i < instances; ++i) {
    engines.push_back(std::make_unique<engine<Strategy>>(shared, strategy, i));
  }
  simulation_result result;
  result.strategy = Strategy::name;
  result.records.resize(w.requests.size());
  // Arrivals: requests without a predecessor at their time; a closed-loop turn a think time after
  // its predecessor finishes.
  std::unordered_map<std::uint64_t, std::size_t> index_of;
  std::unordered_map<std::uint64_t, std::vector<std::size_t>> successors;
  for (std::size_t i = 0; i < w.requests.size(); ++i) {
    index_of.emplace(w.requests[i].id.value, i);
    if (w.requests[i].after.value != 0) { successors[w.requests[i].after.value].push_back(i); }
  }
  using arrival = std::pair<double, std::size_t>;
  std::priority_queue<arrival, std::vector<arrival>, std::greater<>> arrivals;
  for (std::size_t i = 0; i < w.requests.size(); ++i) {
    if (w.requests[i].after.value == 0) { arrivals.push({w.requests[i].arrival_s, i}); }
  }
  std::int64_t arrived = 0;
  for (;;) {
    engine<Strategy>* soonest = nullptr;
    double soonest_at = std::numeric_limits<double>::infinity();
    for (auto& e : engines) {
      if (double const at = e->next_event(); at < soonest_at) {
        soonest = e.get();
        soonest_at = at;
      }
    }
    if (!arrivals.empty() && (soonest == nullptr || arrivals.top().first <= soonest_at)) {
      auto const [at, i] = arrivals.top();
      arrivals.pop();
      sim_request const& r = w.requests[i];
      engine<Strategy>* target = engines[0].get();
      if (instances > 1) {
        page_ids const pages = r.pages();
        std::int64_t best = -1;
        for (auto& e : engines) {
          // Cached, or being computed there (transient): either way the prefix is cheapest there. A
          // page only in a shared remote tier is as near to every instance: it does not count.
          match_result const m = e->cache().probe(pages);
          std::int64_t const cached =
              m.tokens - (config.shared_remote ? m.fastest_tokens[std::size_t(tier::remote)] : 0) + m.transient_tokens;
          if (cached > best || (cached == best && e->outstanding() < target->outstanding())) {
            best = cached;
            target = e.get();
          }
        }
      }
      target->arrive(r, result.records[i], at);
      ++arrived;
      if (progress) { progress(arrived, std::int64_t(w.requests.size())); }
      continue;
    }
    if (soonest == nullptr) { break; }
    soonest->step();
    for (auto const id : soonest->take_finished()) {
      auto const it = successors.find(id.value);
      if (it == successors.end()) { continue; }
      double const done = result.records[index_of.at(id.value)].finish_s;
      for (auto const next : it->second) {
        arrivals.push({done + w.requests[next].think_s, next});
      }
    }
  }
  if (arrived != std::int64_t(w.requests.size())) {  // validate() and reject_one() make this unreachable
    throw std::logic_error("strata::sim::simulate: some requests never arrived");
  }
  for (auto& e : engines) {
    result.counters.push_back(e->counters());
    result.makespan_s = std::max(result.makespan_s, e->now());
  }
  return result;
}

/**
 * @brief Whether a run kept up with the rate offered to it in steady state: the requests served
 *        that finished in the second half of the open-loop arrival window (from the first to the
 *        last arrival of a request without a predecessor: for sessions, the last session start)
 *        number at least `fraction` of what `rate` offers over that half. The window starts at the
 *        first arrival, not at time 0: a replayed trace whose first request comes late is judged
 *        on its own span (from 0, its late start would count as time the server fell behind in).
 * @param w the workload `r` ran
 * @param r its outcome
 * @param rate the offered rate, requests per second over the arrival window
 * @param fraction the share of the offered rate that counts as keeping up
 * @return false also for a workload whose arrivals span no time
 */
inline bool keeps_up(workload const& w, simulation_result const& r, double rate, double fraction = 0.95)
{
  double first = std::numeric_limits<double>::infinity(), last = -first;
  for (auto const& q : w.requests) {
    if (q.after == request_id{}) {
      first = std::min(first, q.arrival_s);
      last = std::max(last, q.arrival_s);
    }
  }
  if (!(last > first)) { return false; }
  double const from = first + (last - first) / 2;
  std::int64_t finished = 0;  // served requests only: one turned away is not throughput
  for (auto const& x : r.records) {
    finished += x.served() && x.finish_s >= from && x.finish_s <= last;
  }
  return double(finished) >= fraction * rate * (last - from);
}

}  // namespace strata::sim
