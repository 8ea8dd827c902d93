// Scheduler decisions with 1,000 (and 10,000) requests waiting: one `schedule` call of each
// strategy, on an index holding 200 long documents (half on the device, half on the host only),
// the way the simulator drives it (one id per 32-token page). Four fifths of the waiting requests
// ask about those documents; one fifth bring new ones. Targets: under 100 µs per decision at 1,000
// waiting, under 1 ms at 10,000.
// `longest_prefix` past 128 waiting takes arrival order (SGLang's fallback); `longest_prefix_sorted`
// measures its sorted path over all 1,000; `srpt` and `strata` (remaining-work order) rank all.
// A strategy decides round after round on the same queue; `strata` keeps a probe per request
// (`probe_memo`) and walks again only where the index changed. The `/changing` runs change the
// index between decisions as serving does (untimed): a new document of 600-3,100 pages is computed
// onto the device and as many least recently used device pages are demoted to the host, so that
// each round re-walks the requests on a document that moved and those that missed at a node that
// gained a child. `/delay_hits`: half the queue owns new documents marked in the index, the other
// half asks about them (delay hits, whose owners are looked up each decision).
#include <strata/presets/h200.hpp>
#include <strata/sched/baselines.hpp>
#include <strata/sched/strata_scheduler.hpp>

#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <vector>

namespace {

using namespace strata;

/// A decision's view of `waiting` over `tree`: an 8K-token batch, room for any plan.
scheduler_view view_over(std::span<waiting_request const> waiting, hiradix_tree const& tree, cost_model const& costs)
{
  scheduler_view v;
  v.waiting = waiting;
  v.tree = &tree;
  v.costs = &costs;
  v.page_tokens = 32;
  v.token_budget = 8192;
  v.device_pages_available = 1 << 19;
  return v;
}

struct fixture {
  std::mt19937_64 rng{1};
  std::int64_t next = 0;               // the next device page never used
  std::vector<std::int64_t> free_ids;  // device pages freed by demotions
  int next_doc = 0;
  cost_model costs = h200::costs(models::llama31_8b, h200::gpu_assisted_io());
  hiradix_tree tree;
  std::vector<std::vector<std::int32_t>> tokens;
  std::vector<waiting_request> waiting;

  static hiradix_config config(std::int64_t host_pages)
  {
    hiradix_config h;
    h.page_tokens = 1;
    h.tokens_per_id = 32;
    h.capacity = {1 << 20, host_pages, 0, 0};
    h.backup_policy = write_policy::write_back;
    h.delay_hit_tokens = 64;
    return h;
  }

  /// `host_pages`: room for what the changes between decisions demote (nothing is dropped).
  fixture(int waiting_count, std::int64_t host_pages) : tree{config(host_pages)}
  {
    std::vector<std::vector<std::int32_t>> docs;
    for (int d = 0; d < 200; ++d) {
      auto doc = add_document();
      if (d % 2 == 0) {  // half of them on the host only
        demote(std::int64_t(doc.size()));
      }
      docs.push_back(std::move(doc));
    }
    for (int i = 0; i < waiting_count; ++i) {
      std::vector<std::int32_t> t =
          rng() % 5 == 0 ? std::vector<std::int32_t>(std::size_t(100 + rng() % 3000), 0) : docs[rng() % docs.size()];
      if (t[0] == 0) { std::iota(t.begin(), t.end(), 50'000'000 + i * 4000); }  // a new document
      t.push_back(100'000'000 + i);
      tokens.push_back(std::move(t));
      waiting_request w;
      w.id = request_id{std::uint64_t(i + 1)};
      w.arrival_s = i * 0.01;
      w.prompt_tokens = std::int64_t(tokens.back().size()) * 32 - 7;
      w.output_tokens = 32;
      waiting.push_back(w);
    }
    for (std::size_t i = 0; i < waiting.size(); ++i) {
      waiting[i].tokens = tokens[i];
    }
  }
  /// A new document of 600-3,100 pages computed onto the device (the first 200: those asked about;
  /// later ones from ids no request holds).
  std::vector<std::int32_t> add_document()
  {
    std::vector<std::int32_t> doc(std::size_t(600 + rng() % 2500));
    int const d = next_doc++;
    std::iota(doc.begin(), doc.end(), d < 200 ? 1 + d * 4000 : 200'000'000 + (d - 200) * 4000);
    std::vector<std::int64_t> ids(doc.size());
    for (auto& id : ids) {  // freed device pages first
      if (free_ids.empty()) {
        id = next++;
      } else {
        id = free_ids.back();
        free_ids.pop_back();
      }
    }
    (void)tree.insert(doc, ids);
    return doc;
  }
  /// The least recently used `pages` device pages demoted to the host.
  void demote(std::int64_t pages)
  {
    auto const e = tree.evict(tier::device, pages);
    free_ids.insert(free_ids.end(), e.freed.begin(), e.freed.end());
    for (auto const& o : e.demotions) {
      auto const freed = tree.complete(o.id);
      free_ids.insert(free_ids.end(), freed.begin(), freed.end());
    }
  }
  scheduler_view view()
  {
    scheduler_view v = view_over(waiting, tree, costs);
    v.running_sequences = 64;
    v.running_context_tokens = 64 * 40000;
    v.running_max_remaining = 100;
    return v;
  }
};

fixture& shared(int waiting, bool changing)
{
  static std::map<std::pair<int, bool>, std::unique_ptr<fixture>> fixtures;
  auto& f = fixtures[{waiting, changing}];
  // Changing: 5 x 1,000 decisions, each demoting a new document's 600-3,100 pages.
  if (!f) { f = std::make_unique<fixture>(waiting, changing ? std::int64_t{1} << 24 : std::int64_t{1} << 20); }
  return *f;
}

template <class S>
void decide(benchmark::State& state, S strategy, int waiting, bool changing)
{
  auto& f = shared(waiting, changing);
  scheduler_view const v = f.view();
  std::size_t planned = 0;
  for (auto _ : state) {
    if (changing) {
      state.PauseTiming();
      std::vector<std::int32_t> const doc = f.add_document();
      f.demote(std::int64_t(doc.size()));
      state.ResumeTiming();
    }
    batch_plan const p = plan_batch(strategy, v, f.tree);  // the proposal and its final match
    planned += p.prefills.size();
    benchmark::DoNotOptimize(p.predicted_load_s);
  }
  state.counters["waiting"] = double(f.waiting.size());
  state.counters["planned_per_decision"] = benchmark::Counter(double(planned), benchmark::Counter::kAvgIterations);
}

/// Half the queue computes new documents (each marked in the index as its owner's, as the
/// controller marks a waiting prompt), the other half are questions on them: delay hits, whose
/// owners must join the candidates (a lookup per owner).
void decide_delay_hits(benchmark::State& state, int waiting)
{
  hiradix_config h = fixture::config(1 << 20);
  hiradix_tree tree{h};
  cost_model const costs = h200::costs(models::llama31_8b, h200::gpu_assisted_io());
  std::vector<std::vector<std::int32_t>> tokens;
  tokens.reserve(std::size_t(waiting));
  for (int k = 0; k < waiting / 2; ++k) {
    std::vector<std::int32_t> doc(std::size_t(40));
    std::iota(doc.begin(), doc.end(), 300'000'000 + k * 100);
    tokens.push_back(doc);
    (void)tree.mark_in_queue(request_id{std::uint64_t(2 * k + 1)}, tokens.back());
    doc.push_back(-1 - k);
    tokens.push_back(std::move(doc));
  }
  std::vector<waiting_request> w(tokens.size());
  for (std::size_t i = 0; i < w.size(); ++i) {
    w[i].id = request_id{i + 1};
    w[i].arrival_s = double(i) * 0.01;
    w[i].tokens = tokens[i];
    w[i].prompt_tokens = std::int64_t(tokens[i].size()) * 32;
    w[i].output_tokens = 32;
  }
  scheduler_view const v = view_over(w, tree, costs);
  strata_scheduler s;
  std::size_t deferred = 0;
  for (auto _ : state) {
    batch_plan const p = s.schedule(v);  // the proposal (matching would take the marks' pages)
    deferred += p.deferred.size();
    benchmark::DoNotOptimize(p.predicted_load_s);
  }
  state.counters["waiting"] = double(w.size());
  state.counters["deferred_per_decision"] = benchmark::Counter(double(deferred), benchmark::Counter::kAvgIterations);
}

}  // namespace

BENCHMARK_CAPTURE(decide, fifo, strata::fifo{}, 1000, false)
    ->Unit(benchmark::kMicrosecond)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK_CAPTURE(decide, longest_prefix, strata::longest_prefix{}, 1000, false)
    ->Unit(benchmark::kMicrosecond)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK_CAPTURE(decide, longest_prefix_sorted, strata::longest_prefix_sorted{}, 1000, false)
    ->Unit(benchmark::kMicrosecond)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK_CAPTURE(decide, sjf, strata::sjf{}, 1000, false)
    ->Unit(benchmark::kMicrosecond)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK_CAPTURE(decide, srpt, strata::srpt{}, 1000, false)
    ->Unit(benchmark::kMicrosecond)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK_CAPTURE(decide, strata, strata::strata_scheduler{}, 1000, false)
    ->Unit(benchmark::kMicrosecond)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK_CAPTURE(decide, strata_on_longest_prefix_order,
                  strata::strata_scheduler{{.order = strata::strata_order::longest_prefix}}, 1000, false)
    ->Unit(benchmark::kMicrosecond)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK_CAPTURE(decide, strata / changing, strata::strata_scheduler{}, 1000, true)
    ->Unit(benchmark::kMicrosecond)
    ->Iterations(1000)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK_CAPTURE(decide, srpt / changing, strata::srpt{}, 1000, true)
    ->Unit(benchmark::kMicrosecond)
    ->Iterations(1000)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK_CAPTURE(decide, strata / 10000_waiting, strata::strata_scheduler{}, 10000, false)
    ->Unit(benchmark::kMicrosecond)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK_CAPTURE(decide, strata / 10000_waiting / changing, strata::strata_scheduler{}, 10000, true)
    ->Unit(benchmark::kMicrosecond)
    ->Iterations(1000)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK_CAPTURE(decide_delay_hits, strata / 1000_waiting / delay_hits, 1000)
    ->Unit(benchmark::kMicrosecond)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK_CAPTURE(decide_delay_hits, strata / 10000_waiting / delay_hits, 10000)
    ->Unit(benchmark::kMicrosecond)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK_MAIN();
