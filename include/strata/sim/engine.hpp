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

#include <strata/index/hiradix_tree.hpp>
#include <strata/sched/toolkit.hpp>
#include <strata/sim/workload.hpp>

#include <algorithm>
#include <functional>
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
  cost_model costs;                                   ///< the clock: loads, prefill, decode
  std::int64_t device_pages = 0;                      ///< KV pages the GPU pool holds
  std::int64_t host_pages = 0;                        ///< host tier (0: none)
  std::int64_t file_pages = 0;                        ///< file tier (0: none)
  std::int64_t remote_pages = 0;                      ///< remote tier (0: none)
  write_policy policy = write_policy::write_through;  ///< device -> host backups
  std::int64_t token_budget = 8192;                   ///< most prefill tokens per batch (longer prompts are chunked)
  std::int64_t delay_hit_tokens = 64;                 ///< shortest transient match that is a delay hit
  /// After each prefill batch, one decode step of the running requests (false: a decode step only
  /// when no prefill batch can be formed, as SGLang's scheduler does).
  bool decode_after_prefill = false;

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
  std::int64_t backup_pages = 0;
  std::int64_t rejected = 0;
};

/**
 * @brief One engine instance.
 * @tparam Strategy the scheduler
 */
template <scheduler_strategy Strategy>
class engine {
 public:
  /**
   * @throw strata::invalid_argument for a bad configuration
   */
  engine(engine_config config, Strategy strategy, int instance = 0)
      : config_{(config.validate(), config)},
        strategy_{std::move(strategy)},
        instance_{instance},
        tree_{tree_config(config_)}
  {
    for (std::int64_t p = config_.device_pages - 1; p >= 0; --p) {
      free_.push_back(p);
    }
  }

  /// @brief Virtual time of this engine.
  [[nodiscard]] double now() const noexcept { return now_; }
  /// @brief Whether requests are waiting or running.
  [[nodiscard]] bool busy() const noexcept { return !waiting_.empty() || !running_.empty(); }
  /// @brief Requests waiting or running.
  [[nodiscard]] std::size_t outstanding() const noexcept { return waiting_.size() + running_.size(); }
  /// @brief The prefix index.
  [[nodiscard]] hiradix_tree const& tree() const noexcept { return tree_; }
  /// @brief Time accounting.
  [[nodiscard]] engine_counters const& counters() const noexcept { return counters_; }

  /// @brief A request arrives at `at` (the clock moves there if the engine was idle before it).
  void arrive(sim_request const& r, request_record& rec, double at)
  {
    now_ = std::max(now_, at);
    auto a = std::make_unique<active>();
    a->req = &r;
    a->rec = &rec;
    a->tokens = r.pages();
    rec.id = r.id;
    rec.instance = instance_;
    rec.arrival_s = at;
    rec.prompt_tokens = r.prompt_tokens;
    rec.output_tokens = r.output_tokens;
    if (strategy_.uses_transient_nodes()) { a->transient_pages = tree_.mark_in_queue(r.id, a->tokens) / page_tokens(); }
    waiting_request w;
    w.id = r.id;
    w.arrival_s = at;
    w.tokens = a->tokens;
    w.prompt_tokens = r.prompt_tokens;
    w.output_tokens = r.output_tokens;
    waiting_.push_back(w);
    waiting_active_.push_back(a.get());
    actives_.push_back(std::move(a));
  }

  /// @brief One iteration.
  void step()
  {
    complete_copies(now_);
    if (!busy()) { return; }
    batch_plan plan;
    if (!waiting_.empty()) {
      scheduler_view v;
      v.waiting = waiting_;
      v.tree = &tree_;
      v.costs = &config_.costs;
      v.page_tokens = page_tokens();
      v.token_budget = config_.token_budget;
      v.device_pages_available = std::int64_t(free_.size()) + tree_.reclaimable_pages(tier::device);
      running_stats(v.running_sequences, v.running_context_tokens, v.running_max_remaining);
      plan = strategy_.schedule(v);
      for (auto const& d : plan.deferred) {
        ++waiting_[d.index].deferrals;
        waiting_[d.index].delay_hit_deferred = d.reason == deferral_reason::delay_hit;
        ++waiting_active_[d.index]->rec->deferrals;
        if (d.reason == deferral_reason::delay_hit) { ++waiting_active_[d.index]->rec->delay_hit_deferrals; }
      }
    }
    if (!plan.prefills.empty() && run_prefill(plan)) { return; }
    if (!running_.empty()) {
      decode_step();
      return;
    }
    if (!copies_.empty()) {  // memory comes back when demotions land
      now_ = std::max(now_, copies_.top().end);
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
    page_ids tokens;                     // whole pages of the prompt
    std::vector<std::int64_t> computed;  // device pages of the computed whole pages
    std::vector<std::int64_t> extra;     // pages the tree does not hold: uncached computed, partial tail, output
    node_ref node{};
    bool locked = false;
    std::int64_t cached_pages = 0;
    std::int64_t transient_pages = 0;
    std::int64_t short_overlap = 0;  // pages of another request's transient prefix it shares, below the threshold
    std::int64_t remaining = 0;
    std::int64_t context = 0;
  };
  struct pending_copy {
    double end;
    transfer_id id;
    bool operator>(pending_copy const& o) const noexcept { return end > o.end; }
  };

  static hiradix_config tree_config(engine_config const& c)
  {
    hiradix_config t;
    t.page_tokens = 1;  // the index holds one id per page
    t.tokens_per_id = c.costs.page_tokens();
    t.page_bytes = c.costs.page_bytes();
    t.capacity = {c.device_pages, c.host_pages, c.file_pages, c.remote_pages};
    t.policy = c.policy;
    t.delay_hit_tokens = c.delay_hit_tokens;
    return t;
  }
  [[nodiscard]] std::int64_t page_tokens() const noexcept { return config_.costs.page_tokens(); }

  void running_stats(std::int64_t& sequences, std::int64_t& context, std::int64_t& most) const
  {
    sequences = std::int64_t(running_.size());
    context = most = 0;
    for (auto const* a : running_) {
      context += a->context;
      most = std::max(most, a->remaining);
    }
  }

  std::optional<std::vector<std::int64_t>> allocate(std::int64_t n)
  {
    if (std::int64_t(free_.size()) < n) {
      auto r = tree_.evict(tier::device, n - std::int64_t(free_.size()));
      free_.insert(free_.end(), r.freed.begin(), r.freed.end());
      schedule_copies(std::move(r.demotions));
    }
    (void)tree_.take_internal_evictions();
    schedule_copies(tree_.take_copies());
    if (std::int64_t(free_.size()) < n) { return std::nullopt; }
    std::vector<std::int64_t> out(free_.end() - n, free_.end());
    free_.resize(free_.size() - std::size_t(n));
    return out;
  }
  void release(std::vector<std::int64_t> const& pages) { free_.insert(free_.end(), pages.begin(), pages.end()); }

  /// Backups and demotions: each tier's link carries one copy at a time.
  void schedule_copies(std::vector<copy_order> orders)
  {
    for (auto const& o : orders) {
      double const bytes = double(o.from_pages.size()) * double(config_.costs.page_bytes());
      double const bw = o.to == tier::host ? config_.costs.io().backup_bytes_per_s
                                           : config_.costs.io().load_bytes_per_s[std::size_t(o.to)];
      double& link = link_free_[std::size_t(o.to)];
      double const start = std::max(now_, link);
      link = start + bytes / bw;
      copies_.push({link, o.id});
      if (o.from == tier::device) { counters_.backup_pages += std::int64_t(o.from_pages.size()); }
    }
  }
  void complete_copies(double t)
  {
    while (!copies_.empty() && copies_.top().end <= t) {
      auto const freed = tree_.complete(copies_.top().id);
      copies_.pop();
      release(freed);
    }
  }

  /// Starts a request's first chunk: holds its pages, orders its loads. False without memory.
  bool start(prefill_item const& item, std::array<std::int64_t, tier_count>& loaded, std::vector<transfer_id>& loads)
  {
    active& a = *waiting_active_[item.index];
    waiting_request& w = waiting_[item.index];
    std::int64_t const to_load = tree_.pages_to_load(item.cached_node);
    std::int64_t const cached = tree_.path_length(item.cached_node);
    std::int64_t const computed = std::int64_t(a.tokens.size()) - cached;
    // Loaded pages, then computed whole pages, then the partial tail and the output (`extra`).
    auto pages =
        allocate(first_chunk_pages(a.req->prompt_tokens, a.req->output_tokens, cached, to_load, page_tokens()));
    if (!pages) { return false; }
    for (auto const& o :
         tree_.load(item.cached_node, std::span<std::int64_t const>{*pages}.first(std::size_t(to_load)))) {
      loaded[std::size_t(o.from)] += std::int64_t(o.from_pages.size());
      a.rec->cached_tokens[std::size_t(o.from)] += std::int64_t(o.from_pages.size()) * page_tokens();
      loads.push_back(o.id);
    }
    a.cached_pages = cached;
    a.rec->cached_tokens[0] += (cached - to_load) * page_tokens();
    a.computed.assign(pages->begin() + to_load, pages->begin() + to_load + computed);
    a.extra.assign(pages->begin() + to_load + computed, pages->end());
    a.node = item.cached_node;
    a.locked = true;
    match_result const overlap = tree_.probe(a.tokens);
    a.short_overlap = overlap.transient_owner != a.req->id && !overlap.delay_hit ? overlap.transient_tokens : 0;
    if (a.transient_pages > 0) { tree_.mark_in_flight(a.req->id); }
    w.started = true;
    w.cached_tokens = item.cached_tokens;
    w.prefilled_tokens = item.cached_tokens;  // the chunks compute the rest
    w.delay_hit_deferred = false;
    return true;
  }

  /// Runs a batch; false if none of its requests could get device memory.
  bool run_prefill(batch_plan const& plan)
  {
    std::array<std::int64_t, tier_count> loaded{};
    std::vector<transfer_id> loads;
    double compute = 0;
    std::vector<prefill_item> ran;
    // Hold every cached prefix of the batch first, so that one request's allocation cannot evict
    // another's.
    for (auto const& item : plan.prefills) {
      if (item.first_chunk) { tree_.lock(item.cached_node, tier::device); }
    }
    for (auto const& item : plan.prefills) {
      if (item.first_chunk && !start(item, loaded, loads)) {
        tree_.unlock(item.cached_node, tier::device);
        continue;
      }
      compute += config_.costs.prefill_s(item.chunk_tokens, item.context_tokens);
      ran.push_back(item);
    }
    if (ran.empty()) { return false; }
    counters_.loaded_pages += loaded[1] + loaded[2] + loaded[3];
    double const load = config_.costs.load_s(loaded);
    double const batch = config_.costs.batch_s(load, compute);
    double const stall = config_.costs.stall_s(load, compute);
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
    now_ += batch;
    for (auto id : loads) {
      release(tree_.complete(id));
    }
    // Progress, first tokens, and the prompt's pages into the index.
    std::vector<std::size_t> done;
    for (auto const& item : ran) {
      waiting_request& w = waiting_[item.index];
      active& a = *waiting_active_[item.index];
      w.prefilled_tokens += item.chunk_tokens;
      a.rec->computed_tokens += item.chunk_tokens;
      if (w.prefilled_tokens >= w.prompt_tokens) {
        finish_prefill(a);
        done.push_back(item.index);
      }
    }
    std::sort(done.begin(), done.end(), std::greater<>());
    for (auto i : done) {
      waiting_.erase(waiting_.begin() + std::ptrdiff_t(i));
      waiting_active_.erase(waiting_active_.begin() + std::ptrdiff_t(i));
    }
    if (config_.decode_after_prefill && steps == 0 && !running_.empty()) { decode_step(); }
    return true;
  }

  void finish_prefill(active& a)
  {
    a.rec->first_token_s = now_;
    std::int64_t const n = std::int64_t(a.tokens.size());
    std::vector<std::int64_t> table = tree_.path_pages(a.node, tier::device);
    table.insert(table.end(), a.computed.begin(), a.computed.end());
    if (a.transient_pages > 0) {
      tree_.commit(a.req->id, std::span<std::int64_t const>{a.computed}.last(std::size_t(a.transient_pages)));
    }
    insert_result const r = tree_.insert(a.tokens, table);
    std::int64_t const path = tree_.path_length(r.node);
    // Unused pages inside the cached path duplicate another request's (redundant prefill): freed
    // now, the request reads the tree's. Past it (another request computes that prefix) the
    // request keeps its own until it finishes.
    std::int64_t const beyond = n - path;
    std::int64_t const duplicates = std::int64_t(r.unused_device_pages.size()) - beyond;
    if (duplicates > 0) {
      auto const held = tree_.path_pages(r.node, tier::device);
      std::int64_t prefill_duplicates = 0;
      for (std::size_t p = std::size_t(a.cached_pages); p < held.size(); ++p) {
        if (held[p] == table[p]) { continue; }
        bool const answer = answer_pages_.count(a.tokens[p]) != 0;
        (answer ? a.rec->answer_race_tokens : prefill_duplicates) += page_tokens();
      }
      a.rec->redundant_tokens += prefill_duplicates;
      a.rec->short_overlap_tokens += std::min(prefill_duplicates, a.short_overlap);
    }
    release({r.unused_device_pages.begin(), r.unused_device_pages.begin() + duplicates});
    std::vector<std::int64_t> kept(r.unused_device_pages.begin() + duplicates, r.unused_device_pages.end());
    kept.insert(kept.end(), a.extra.begin(), a.extra.end());
    a.extra = std::move(kept);
    a.computed.clear();
    tree_.lock(r.node, tier::device);
    tree_.unlock(a.node, tier::device);
    a.node = r.node;
    schedule_copies(tree_.take_copies());
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
    now_ += dt;
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
        now_ = t;
        finish(*a);
        now_ = saved;
      } else {
        still.push_back(a);
      }
    }
    running_ = std::move(still);
  }

  void finish(active& a)
  {
    a.rec->finish_s = now_;
    std::vector<std::int64_t> extra = std::move(a.extra);
    if (a.req->continuation) {  // the next turn reads this answer: cache prompt and answer pages
      page_ids const& next = *a.req->continuation;
      std::vector<std::int64_t> table = tree_.path_pages(a.node, tier::device);
      std::size_t const need = next.size() > table.size() ? next.size() - table.size() : 0;
      if (need <= extra.size()) {
        table.insert(table.end(), extra.begin(), extra.begin() + std::ptrdiff_t(need));
        table.resize(next.size());
        for (std::size_t p = a.tokens.size(); p < next.size(); ++p) {
          answer_pages_.insert(next[p]);
        }
        insert_result const r = tree_.insert(next, table);
        extra.erase(extra.begin(), extra.begin() + std::ptrdiff_t(need));
        extra.insert(extra.end(), r.unused_device_pages.begin(), r.unused_device_pages.end());
        schedule_copies(tree_.take_copies());
      }
    }
    tree_.unlock(a.node, tier::device);
    release(extra);
    finished_.push_back(a.req->id);
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
    std::size_t i = waiting_.size();
    for (auto const& d : plan.deferred) {
      if (d.reason == deferral_reason::memory) {
        i = d.index;
        break;
      }
    }
    if (i == waiting_.size() && !plan.prefills.empty()) { i = plan.prefills.front().index; }
    if (i == waiting_.size()) {
      throw std::logic_error("strata::sim::engine: idle with requests waiting and none blocked by memory");
    }
    active& a = *waiting_active_[i];
    if (waiting_[i].started) { return; }  // cannot happen: started requests hold their memory
    if (tree_.transient_pages(a.req->id) > 0) { tree_.abort(a.req->id); }
    a.rec->first_token_s = -1;
    a.rec->finish_s = now_;  // a session's next turn still comes
    finished_.push_back(a.req->id);
    ++counters_.rejected;
    waiting_.erase(waiting_.begin() + std::ptrdiff_t(i));
    waiting_active_.erase(waiting_active_.begin() + std::ptrdiff_t(i));
  }

  engine_config config_;
  Strategy strategy_;
  int instance_;
  hiradix_tree tree_;
  double now_ = 0;
  std::vector<std::int64_t> free_;
  std::vector<waiting_request> waiting_;
  std::vector<active*> waiting_active_;
  std::vector<active*> running_;
  std::vector<std::unique_ptr<active>> actives_;
  std::vector<request_id> finished_;
  std::priority_queue<pending_copy, std::vector<pending_copy>, std::greater<>> copies_;
  std::array<double, tier_count> link_free_{};
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
 *        longest prefix cached or being computed; the least loaded on ties).
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
  for (int i = 0; i < instances; ++i) {
    engines.push_back(std::make_unique<engine<Strategy>>(config, strategy, i));
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
    for (auto& e : engines) {
      if (e->busy() && (soonest == nullptr || e->now() < soonest->now())) { soonest = e.get(); }
    }
    if (!arrivals.empty() && (soonest == nullptr || arrivals.top().first <= soonest->now())) {
      auto const [at, i] = arrivals.top();
      arrivals.pop();
      sim_request const& r = w.requests[i];
      engine<Strategy>* target = engines[0].get();
      if (instances > 1) {
        page_ids const pages = r.pages();
        std::int64_t best = -1;
        for (auto& e : engines) {
          // Cached, or being computed there (transient): either way the prefix is cheapest there.
          match_result const m = e->tree().probe(pages);
          std::int64_t const cached = m.tokens + m.transient_tokens;
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

}  // namespace strata::sim
