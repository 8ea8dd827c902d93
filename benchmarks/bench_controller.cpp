// SPDX-License-Identifier: Apache-2.0
// Controller overhead per scheduling round: 1,000 requests waiting on a cache_controller whose index
// holds about a million pages (1,000 documents of 20K–44K tokens, half on the device and half on
// the host only), driven the way the simulator drives it (one id per 32-token page, virtual tiers
// and time, so only the controller's own work is measured).
// - schedule: one `schedule` call (the strategy's decision plus the controller's view and bookkeeping);
//   compare with bench_sched's bare `strata` decision on a smaller index;
// - round: poll (backups landed), schedule, begin_loads (device pages, locks, load orders), loads landing,
// finish_prefill of
//   the requests whose prompt completed (index insert, backups) and their release; the requests
//   that finished are replaced by new ones outside the timed region, so 1,000 always wait.
#include <strata/presets/h200.hpp>
#include <strata/sched/strata_scheduler.hpp>
#include <strata/sim/engine.hpp>

#include <benchmark/benchmark.h>

#include <numeric>
#include <random>
#include <vector>

namespace {

using namespace strata;
using controller = cache_controller<sim::sim_policies<strata_scheduler>>;

constexpr std::int64_t page_tokens = 32;

struct fixture {
  cost_model costs = h200::costs(models::llama31_8b, h200::gpu_assisted_io());
  controller cache;
  std::vector<std::vector<std::int32_t>> docs;
  std::mt19937_64 rng{1};
  std::uint64_t next_id = 1;
  std::int32_t next_page = 1;
  std::int64_t pages = 0;

  static sim::virtual_tiers tiers(cost_model const& c)
  {
    kv_geometry const g{1, page_tokens, 1, c.page_bytes() / page_tokens, 1, 1};
    return sim::virtual_tiers{virtual_pool<tier::device>{g, 1 << 21}, virtual_pool<tier::host>{g, 1 << 21},
                              virtual_pool<tier::file>{g, 0}, sim::virtual_remote{g, 0}};
  }
  static controller_options options(cost_model const& c)
  {
    controller_options o;
    o.costs = c;
    o.ids_are_pages = true;
    o.backup_policy = write_policy::write_through;
    return o;
  }

  fixture() : cache{tiers(costs), options(costs), strata_scheduler{}, sim::virtual_executor{costs}}
  {
    for (int d = 0; d < 1000; ++d) {  // ~1M pages
      std::vector<std::int32_t> doc(std::size_t(625 + rng() % 750));
      for (auto& p : doc) {
        p = next_page++;
      }
      pages += std::int64_t(doc.size());
      std::vector<std::int32_t> prompt = doc;
      prompt.push_back(next_page++);
      run_alone(prompt);
      docs.push_back(std::move(doc));
    }
    cache.executor().set_now(1e9);  // every backup lands
    (void)cache.poll();
    for (std::size_t d = 0; d < docs.size(); d += 2) {  // half the documents leave the device
      (void)cache.evict(tier::device, std::int64_t(docs[d].size()));
    }
    for (int i = 0; i < 1000; ++i) {
      submit_one();
    }
  }

  /// One request through the whole loop, alone.
  void run_alone(std::vector<std::int32_t> const& prompt)
  {
    request_id const id{next_id++};
    cache.submit({id, prompt, std::int64_t(prompt.size()) * page_tokens, 8, 0.0});
    auto const h = cache.begin_loads(cache.schedule({1 << 20, 0, 0, 0}));
    if (h.transfer) { sim::virtual_executor::land_at(*h.transfer, cache.executor().now()); }
    (void)cache.complete(h);
    (void)cache.finish_prefill(id);
    cache.release(id);
  }

  /// A question on a document (four in five) or a new document.
  void submit_one()
  {
    std::vector<std::int32_t> t;
    if (rng() % 5 == 0) {
      t.resize(std::size_t(100 + rng() % 1000));
      for (auto& p : t) {
        p = next_page++;
      }
    } else {
      t = docs[rng() % docs.size()];
    }
    t.push_back(next_page++);
    cache.submit({request_id{next_id++}, t, std::int64_t(t.size()) * page_tokens + 17, 32, 0.0});
  }
};

fixture& shared()
{
  static fixture f;
  return f;
}

schedule_budget budget() { return {8192, 64, 64 * 40000, 100}; }

void schedule(benchmark::State& state)
{
  auto& f = shared();
  std::size_t planned = 0;
  for (auto _ : state) {
    batch_plan const p = f.cache.schedule(budget());
    planned += p.prefills.size();
    benchmark::DoNotOptimize(p.predicted_load_s);
  }
  state.counters["waiting"] = double(f.cache.waiting());
  state.counters["index_pages"] = double(f.pages);
  state.counters["planned_per_round"] = benchmark::Counter(double(planned), benchmark::Counter::kAvgIterations);
}

void round(benchmark::State& state)
{
  auto& f = shared();
  std::int64_t finished = 0;
  for (auto _ : state) {
    f.cache.executor().set_now(f.cache.executor().now() + 0.05);  // a batch's worth of virtual time
    (void)f.cache.poll();                                         // backups that landed meanwhile
    auto const h = f.cache.begin_loads(f.cache.schedule(budget()));
    if (h.transfer) { sim::virtual_executor::land_at(*h.transfer, f.cache.executor().now()); }
    (void)f.cache.complete(h);
    std::int64_t done = 0;
    for (auto const& it : h.ran) {
      if (!it.last_chunk) { continue; }
      (void)f.cache.finish_prefill(it.id);
      f.cache.release(it.id);
      ++done;
    }
    state.PauseTiming();
    for (std::int64_t i = 0; i < done; ++i) {
      f.submit_one();
    }
    finished += done;
    state.ResumeTiming();
  }
  state.counters["waiting"] = double(f.cache.waiting());
  state.counters["finished_per_round"] = double(finished) / double(state.iterations());
}

}  // namespace

BENCHMARK(schedule)->Unit(benchmark::kMicrosecond)->Repetitions(5)->ReportAggregatesOnly(true);
BENCHMARK(round)->Unit(benchmark::kMicrosecond)->Repetitions(5)->ReportAggregatesOnly(true);
BENCHMARK_MAIN();
