// Scheduler decisions with 1,000 requests waiting: one `schedule` call of each strategy, on an index
// holding 200 long documents (half on the device, half on the host only), the way the simulator
// drives it (one id per 32-token page). Four fifths of the waiting requests ask about those
// documents; one fifth bring new ones. Target: under 100 µs per decision.
// `longest_prefix` past 128 waiting takes arrival order (SGLang's fallback); `longest_prefix_sorted`
// measures its sorted path over all 1,000; `srpt` and `strata` (remaining-work order) probe all 1,000.
#include <strata/presets/h200.hpp>
#include <strata/sched/baselines.hpp>
#include <strata/sched/strata_scheduler.hpp>

#include <benchmark/benchmark.h>

#include <numeric>
#include <random>
#include <vector>

namespace {

using namespace strata;

struct fixture {
  cost_model costs = h200::costs(models::llama31_8b, h200::gpu_assisted_io());
  hiradix_tree tree{[] {
    hiradix_config h;
    h.page_tokens = 1;
    h.tokens_per_id = 32;
    h.capacity = {1 << 20, 1 << 20, 0, 0};
    h.backup_policy = write_policy::write_back;
    h.delay_hit_tokens = 64;
    return h;
  }()};
  std::vector<std::vector<std::int32_t>> tokens;
  std::vector<waiting_request> waiting;

  fixture()
  {
    std::mt19937_64 rng{1};
    std::vector<std::vector<std::int32_t>> docs;
    std::int64_t next = 0;
    for (int d = 0; d < 200; ++d) {
      std::vector<std::int32_t> doc(std::size_t(600 + rng() % 2500));
      std::iota(doc.begin(), doc.end(), 1 + d * 4000);
      std::vector<std::int64_t> ids(doc.size());
      std::iota(ids.begin(), ids.end(), next);
      next += std::int64_t(ids.size());
      (void)tree.insert(doc, ids);
      if (d % 2 == 0) {  // half of them on the host only
        auto const e = tree.evict(tier::device, std::int64_t(doc.size()));
        for (auto const& o : e.demotions) {
          (void)tree.complete(o.id);
        }
      }
      docs.push_back(std::move(doc));
    }
    for (int i = 0; i < 1000; ++i) {
      std::vector<std::int32_t> t =
          rng() % 5 == 0 ? std::vector<std::int32_t>(std::size_t(100 + rng() % 3000), 0) : docs[rng() % docs.size()];
      if (t[0] == 0) { std::iota(t.begin(), t.end(), 5'000'000 + i * 4000); }  // a new document
      t.push_back(10'000'000 + i);
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
  scheduler_view view()
  {
    scheduler_view v;
    v.waiting = waiting;
    v.tree = &tree;
    v.costs = &costs;
    v.page_tokens = 32;
    v.token_budget = 8192;
    v.device_pages_available = 1 << 19;
    v.running_sequences = 64;
    v.running_context_tokens = 64 * 40000;
    v.running_max_remaining = 100;
    return v;
  }
};

fixture& shared()
{
  static fixture f;
  return f;
}

template <class S>
void decide(benchmark::State& state, S strategy)
{
  auto& f = shared();
  scheduler_view const v = f.view();
  std::size_t planned = 0;
  for (auto _ : state) {
    batch_plan const p = plan_batch(strategy, v, f.tree);  // the proposal and its final match
    planned += p.prefills.size();
    benchmark::DoNotOptimize(p.predicted_load_s);
  }
  state.counters["waiting"] = double(f.waiting.size());
  state.counters["planned_per_decision"] = benchmark::Counter(double(planned), benchmark::Counter::kAvgIterations);
}

}  // namespace

BENCHMARK_CAPTURE(decide, fifo, strata::fifo{})
    ->Unit(benchmark::kMicrosecond)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK_CAPTURE(decide, longest_prefix, strata::longest_prefix{})
    ->Unit(benchmark::kMicrosecond)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK_CAPTURE(decide, longest_prefix_sorted, strata::longest_prefix_sorted{})
    ->Unit(benchmark::kMicrosecond)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK_CAPTURE(decide, sjf, strata::sjf{})
    ->Unit(benchmark::kMicrosecond)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK_CAPTURE(decide, srpt, strata::srpt{})
    ->Unit(benchmark::kMicrosecond)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK_CAPTURE(decide, strata, strata::strata_scheduler{})
    ->Unit(benchmark::kMicrosecond)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK_CAPTURE(decide, strata_on_longest_prefix_order,
                  strata::strata_scheduler{{.order = strata::strata_order::longest_prefix}})
    ->Unit(benchmark::kMicrosecond)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK_MAIN();
