// Workloads, the engine simulator, and reports.
#include "../support/catch.hpp"

#include "../../tools/simulate/report.hpp"  // the simulator tool's summaries (not installed)

#include <strata/presets/h200.hpp>
#include <strata/sched/baselines.hpp>
#include <strata/sched/strata_scheduler.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <numeric>
#include <random>
#include <set>

using namespace strata;
using namespace strata::sim;

namespace {

engine_config small_engine(io_costs io = h200::gpu_assisted_io())
{
  engine_config c;
  c.costs = h200::costs(models::llama31_8b, io);
  c.device_pages = 4096;
  c.host_pages = 32768;
  return c;
}

/// Two requests about one 40K-token document: the second arrives at `second_at`.
workload two_on_one_document(double second_at)
{
  workload w{"two", 32, {}};
  auto doc = std::make_shared<page_ids const>([] {
    page_ids p(1250);
    std::iota(p.begin(), p.end(), 1);
    return p;
  }());
  for (int k = 0; k < 2; ++k) {
    sim_request r;
    r.arrival_s = k == 0 ? 0 : second_at;
    r.shared = doc;
    r.own = {std::int32_t(100000 + k)};
    r.prompt_tokens = 1251 * 32 + 7;
    r.output_tokens = 20;
    r.id = request_id{std::uint64_t(k + 1)};
    w.requests.push_back(r);
  }
  return w;
}

std::int64_t redundant(simulation_result const& r)
{
  std::int64_t n = 0;
  for (auto const& x : r.records) {
    n += x.redundant_tokens;
  }
  return n;
}

}  // namespace

TEST_CASE("workload generators are seeded, sorted and consistent", "[cpu][sim]")
{
  auto const a = long_documents({.requests = 300, .rate = 2, .seed = 4});
  auto const b = long_documents({.requests = 300, .rate = 2, .seed = 4});
  auto const c = long_documents({.requests = 300, .rate = 2, .seed = 5});
  REQUIRE(a.requests.size() == 300);
  bool same = true, differs = false;
  for (std::size_t i = 0; i < 300; ++i) {
    same = same && a.requests[i].arrival_s == b.requests[i].arrival_s && a.requests[i].pages() == b.requests[i].pages();
    differs = differs || a.requests[i].arrival_s != c.requests[i].arrival_s;
  }
  CHECK(same);
  CHECK(differs);
  for (auto const* w : {&a}) {
    for (std::size_t i = 0; i < w->requests.size(); ++i) {
      auto const& r = w->requests[i];
      CHECK(r.id.value == i + 1);
      if (i > 0) { CHECK(r.arrival_s >= w->requests[i - 1].arrival_s); }
      CHECK(r.prompt_tokens >= std::int64_t(r.pages().size()) * 32);
      CHECK(r.prompt_tokens < (std::int64_t(r.pages().size()) + 1) * 32);
      CHECK(r.prompt_tokens >= 20000);
      CHECK(r.output_tokens >= 8);
    }
  }
  auto const chat = short_chat({.requests = 2000, .seed = 2});
  double mean = 0;
  for (auto const& r : chat.requests) {
    mean += double(r.prompt_tokens);
  }
  mean /= 2000;
  CHECK(mean > 500);
  CHECK(mean < 900);  // ~680 tokens, ShareGPT-like
  auto const turns = multi_turn({.requests = 500, .seed = 3});
  std::size_t continued = 0;
  for (auto const& r : turns.requests) {
    if (r.continuation) {
      ++continued;
      auto const prompt = r.pages();
      REQUIRE(r.continuation->size() >= prompt.size());
      CHECK(std::equal(prompt.begin(), prompt.end(), r.continuation->begin()));  // history grows
    }
  }
  CHECK(continued == 500);

  STRATA_REQUIRE_THROWS(invalid_argument, "rate must be positive", long_documents({.rate = -1}));
  STRATA_REQUIRE_THROWS(invalid_argument, "requests must be positive", long_documents({.requests = 0}));
  STRATA_REQUIRE_THROWS(invalid_argument, "bad token range", long_documents({.min_tokens = 10, .max_tokens = 5}));
  STRATA_REQUIRE_THROWS(invalid_argument, "must be positive", short_chat({.rate = 0}));
  STRATA_REQUIRE_THROWS(invalid_argument, "must be positive", multi_turn({.mean_turns = 0.5}));
}

TEST_CASE("traces replay from CSV and JSON lines, and bad lines are named", "[cpu][sim]")
{
  {
    std::ofstream f{"strata_trace.csv"};
    f << "arrival_s,output_tokens,prompt_tokens,tokens\n";
    f << "0.5,10,70,";
    for (int t = 0; t < 70; ++t) {
      f << ' ' << t;
    }
    f << "\n0.25,3,40,";
    for (int t = 0; t < 40; ++t) {
      f << ' ' << t;
    }
    f << "\n";
  }
  auto const w = replay("strata_trace.csv");
  REQUIRE(w.requests.size() == 2);
  CHECK(w.requests[0].arrival_s == 0.25);  // sorted
  CHECK(w.requests[0].pages().size() == 1);
  CHECK(w.requests[1].pages().size() == 2);
  CHECK(w.requests[0].pages()[0] == w.requests[1].pages()[0]);  // equal first pages, equal ids
  {
    std::ofstream f{"strata_trace.jsonl"};
    f << R"({"arrival": 1.5, "output_tokens": 64, "pages": [7, 8, 9], "prompt_tokens": 100})"
      << "\n";
    f << R"({"arrival": 2, "output_tokens": 8, "tokens": [1, 2, 3]})"
      << "\n";
  }
  auto const j = replay("strata_trace.jsonl");
  REQUIRE(j.requests.size() == 2);
  CHECK(j.requests[0].own == page_ids{7, 8, 9});
  CHECK(j.requests[0].prompt_tokens == 100);
  CHECK(j.requests[1].own.empty());  // 3 tokens: no whole page
  {
    std::ofstream f{"strata_trace_bad.jsonl"};
    f << R"({"arrival": 1, "output_tokens": 4, "tokens": [1]})"
      << "\n";
    f << R"({"arrival": 1, "tokens": [1]})"
      << "\n";
  }
  STRATA_REQUIRE_THROWS(invalid_argument, "strata_trace_bad.jsonl:2: no \"output_tokens\"",
                        replay("strata_trace_bad.jsonl"));
  {
    std::ofstream f{"strata_trace_bad.csv"};
    f << "1.0,ten,5,1 2\n";
  }
  STRATA_REQUIRE_THROWS(invalid_argument, "strata_trace_bad.csv:1: output_tokens: 'ten' is not a finite number",
                        replay("strata_trace_bad.csv"));
  // Ids are never truncated: a cell that is not one integer, or a page id beyond 32 bits, is an error.
  auto bad_line = [](char const* line) {
    std::ofstream f{"strata_trace_bad.csv"};
    f << line << "\n";
  };
  bad_line("1.0,10,96,1 2x 3");
  STRATA_REQUIRE_THROWS(invalid_argument, "strata_trace_bad.csv:1: '2x' is not an integer id",
                        replay("strata_trace_bad.csv"));
  bad_line(R"({"arrival": 1, "output_tokens": 4, "tokens": [1, 2.5]})");
  STRATA_REQUIRE_THROWS(invalid_argument, "'2.5' is not an integer id", replay("strata_trace_bad.csv"));
  bad_line(R"({"arrival": 1, "output_tokens": 4, "pages": [1, 5000000000], "prompt_tokens": 64})");
  STRATA_REQUIRE_THROWS(invalid_argument, "page id 5000000000 does not fit 32 bits", replay("strata_trace_bad.csv"));
  bad_line("1.0,10,64,1 5000000000");
  STRATA_REQUIRE_THROWS(invalid_argument, "page id 5000000000 does not fit 32 bits",
                        replay("strata_trace_bad.csv", 32, true));
  STRATA_REQUIRE_THROWS(invalid_argument, "cannot read", replay("no_such_trace.csv"));
  for (char const* f : {"strata_trace.csv", "strata_trace.jsonl", "strata_trace_bad.jsonl", "strata_trace_bad.csv"}) {
    std::remove(f);
  }
}

TEST_CASE("token ids become collision-free page ids: equal prefixes, equal ids; different, different", "[cpu][sim]")
{
  // Many requests whose pages repeat contents under different prefixes: a page's id must be a
  // function of its whole prefix, and distinct prefixes must never share an id.
  std::mt19937_64 rng{7};
  std::vector<std::vector<std::int64_t>> prompts;
  {
    std::ofstream f{"strata_trace_ids.csv"};
    for (int q = 0; q < 300; ++q) {
      std::int64_t const n_pages = std::uniform_int_distribution<std::int64_t>{1, 12}(rng);
      std::vector<std::int64_t> tokens;
      for (std::int64_t p = 0; p < n_pages; ++p) {
        std::int64_t const content = std::uniform_int_distribution<std::int64_t>{0, 3}(rng);  // few contents
        for (int t = 0; t < 32; ++t) {
          tokens.push_back(content * 1000 + t);
        }
      }
      prompts.push_back(tokens);
      f << q * 0.01 << ",4," << tokens.size() << ",";
      for (auto t : tokens) {
        f << ' ' << t;
      }
      f << "\n";
    }
  }
  auto const w = replay("strata_trace_ids.csv");
  REQUIRE(w.requests.size() == prompts.size());
  std::map<std::vector<std::int64_t>, std::int32_t> id_of_prefix;
  std::map<std::int32_t, std::vector<std::int64_t>> prefix_of_id;
  for (std::size_t q = 0; q < prompts.size(); ++q) {
    auto const ids = w.requests[q].pages();  // arrivals are increasing: the order is the file's
    REQUIRE(ids.size() * 32 == prompts[q].size());
    for (std::size_t p = 0; p < ids.size(); ++p) {
      std::vector<std::int64_t> const prefix(prompts[q].begin(), prompts[q].begin() + std::ptrdiff_t((p + 1) * 32));
      auto const [a, fresh_prefix] = id_of_prefix.emplace(prefix, ids[p]);
      CHECK(a->second == ids[p]);  // equal prefixes, equal ids
      auto const [b, fresh_id] = prefix_of_id.emplace(ids[p], prefix);
      CHECK(b->second == prefix);  // one id, one prefix
      CHECK(ids[p] > 0);
    }
  }
  // Ids are dense, in order of first appearance.
  CHECK(prefix_of_id.begin()->first == 1);
  CHECK(prefix_of_id.rbegin()->first == std::int32_t(prefix_of_id.size()));
  std::remove("strata_trace_ids.csv");
}

TEST_CASE("Mooncake traces replay: 512-token blocks become pages, equal leading blocks equal pages", "[cpu][sim]")
{
  {
    std::ofstream f{"strata_mooncake.jsonl"};
    f << R"({"timestamp": 0, "input_length": 1100, "output_length": 6, "hash_ids": [0, 1, 2]})"
      << "\n";
    f << R"({"timestamp": 1500, "input_length": 700, "output_length": 30, "hash_ids": [0, 1]})"
      << "\n";
    f << R"({"timestamp": 250, "input_length": 512, "output_length": 1, "hash_ids": [5]})"
      << "\n";
    f << R"({"timestamp": 3000, "input_length": 1040, "output_length": 2, "hash_ids": [0, 7, 8]})"
      << "\n";
  }
  auto w = replay("strata_mooncake.jsonl");
  REQUIRE(w.requests.size() == 4);
  auto const& a = w.requests[0];  // sorted by arrival: 0, 0.25, 1.5, 3 s
  auto const& c = w.requests[1];
  auto const& b = w.requests[2];
  auto const& d = w.requests[3];
  CHECK(c.arrival_s == 0.25);
  CHECK(b.arrival_s == 1.5);
  CHECK(a.prompt_tokens == 1100);
  CHECK(a.output_tokens == 6);
  CHECK(a.pages().size() == 1100 / 32);  // 34: two whole blocks and 2 pages of the third
  CHECK(b.pages().size() == 700 / 32);   // 21: one block and 5 pages of the second
  CHECK(c.pages().size() == 16);
  CHECK(d.pages().size() == 1040 / 32);
  // Equal leading blocks: equal pages, as far as both prompts go.
  for (std::size_t p = 0; p < b.pages().size(); ++p) {
    CHECK(a.pages()[p] == b.pages()[p]);
  }
  // d shares block 0 only; pages of different blocks never share an id.
  for (std::size_t p = 0; p < d.pages().size(); ++p) {
    CHECK((a.pages()[p] == d.pages()[p]) == (p < 16));
  }
  auto const a_pages = a.pages();
  for (auto x : c.pages()) {
    CHECK(std::count(a_pages.begin(), a_pages.end(), x) == 0);
  }
  // Time scaling sets the load.
  double const rate = arrival_rate(w);
  CHECK(rate == Approx(3.0 / 3.0));
  scale_time(w, 0.5);
  CHECK(w.requests.back().arrival_s == 1.5);
  CHECK(arrival_rate(w) == Approx(2.0));
  STRATA_REQUIRE_THROWS(invalid_argument, "factor must be finite and positive", scale_time(w, 0));
  // It simulates, every strategy.
  auto const r = simulate(w, small_engine(), strata_scheduler{});
  for (auto const& x : r.records) {
    CHECK(x.served());
  }
  {
    std::ofstream f{"strata_mooncake.jsonl"};
    f << R"({"timestamp": 0, "input_length": 100, "hash_ids": [0]})"
      << "\n";
  }
  STRATA_REQUIRE_THROWS(invalid_argument, "strata_mooncake.jsonl:1: no \"output_length\"",
                        replay("strata_mooncake.jsonl"));
  for (char const* ids : {"[]", "[0, 1]"}) {  // one id per 512-token block: 100 tokens need exactly one
    {
      std::ofstream f{"strata_mooncake.jsonl"};
      f << R"({"timestamp": 0, "input_length": 100, "output_length": 4, "hash_ids": )" << ids << "}\n";
    }
    STRATA_REQUIRE_THROWS(invalid_argument, "hash_ids for input_length 100", replay("strata_mooncake.jsonl"));
  }
  std::remove("strata_mooncake.jsonl");
}

TEST_CASE("delay-hit scenarios: strata never prefills a shared prefix twice", "[cpu][sim]")
{
  // Request 2 arrives while request 1's prefix is queued (same instant), in flight (during its
  // ~3 s prefill), or committed (after it).
  for (double second_at : {0.0, 1.0, 30.0}) {
    INFO("second request at " << second_at << " s");
    workload const w = two_on_one_document(second_at);
    auto const st = simulate(w, small_engine(), strata_scheduler{});
    auto const lp = simulate(w, small_engine(), longest_prefix{});
    CHECK(redundant(st) == 0);
    CHECK(st.records[1].computed_tokens < 100);  // it ran as a hit
    if (second_at < 30) {
      CHECK(st.records[1].delay_hit_deferrals > 0);
      CHECK(redundant(lp) > 0);  // the baseline computes the document twice
      CHECK(st.records[1].ttft_s() <= lp.records[1].ttft_s());
    } else {
      CHECK(redundant(lp) == 0);
      CHECK(st.records[1].cached_tokens[0] == 1250 * 32);
    }
  }
}

TEST_CASE("delay-hit scenarios: nested prefixes are computed once", "[cpu][sim]")
{
  // Request 1 computes P+Y; requests 2 and 3 extend P with the same X while it does. Neither could
  // mark X at arrival (its prefix ran into request 1's), so both used to compute X once request 1
  // committed P (1,280 redundant tokens).
  auto pages = [](std::int32_t first, std::int32_t n) {
    page_ids v(static_cast<std::size_t>(n), 0);
    std::iota(v.begin(), v.end(), first);
    return v;
  };
  page_ids const p = pages(1, 300), y = pages(1001, 10), x = pages(2001, 40);
  workload w{"nested", 32, {}};
  auto add = [&](double at, page_ids own) {
    sim_request r;
    r.arrival_s = at;
    r.own = p;
    r.own.insert(r.own.end(), own.begin(), own.end());
    r.prompt_tokens = std::int64_t(r.own.size()) * 32;
    r.output_tokens = 8;
    w.requests.push_back(std::move(r));
  };
  page_ids b = x, c = x;
  b.push_back(3001);
  c.push_back(3002);
  add(0.0, y);
  add(0.05, b);
  add(0.06, c);
  for (std::size_t i = 0; i < w.requests.size(); ++i) {
    w.requests[i].id = request_id{i + 1};
  }
  auto const st = simulate(w, small_engine(), strata_scheduler{});
  CHECK(redundant(st) == 0);
  CHECK(st.records[1].computed_tokens + st.records[2].computed_tokens < 2 * 40 * 32);  // X once
  CHECK(redundant(simulate(w, small_engine(), longest_prefix{})) > 0);                 // the baseline twice
}

TEST_CASE("delay-hit scenarios: random traces with deep shared prefixes compute no prefix twice", "[cpu][sim]")
{
  // Prompts are paths down a random tree of page runs (depth up to 5, a few children per node), so
  // prefixes nest and overlap in every shape; arrivals are bursty. strata's redundant prefill from
  // delay hits must be 0 on every request, whatever its order (both orders, deadlines binding or not).
  std::int64_t baseline_redundant = 0;  // the traces do make shapes where a baseline computes twice
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    std::mt19937_64 rng{seed};
    std::int32_t next = 1;
    std::vector<page_ids> nodes{page_ids{}};  // node -> its run of pages
    std::vector<std::vector<std::size_t>> kids{{}};
    workload w{"deep", 32, {}};
    double t = 0;
    for (int q = 0; q < 60; ++q) {
      page_ids prompt;
      std::size_t node = 0;
      int const depth = 1 + int(rng() % 5);
      for (int d = 0; d < depth; ++d) {
        if (kids[node].empty() || rng() % 3 == 0) {  // a new branch
          page_ids run(std::size_t(2 + rng() % 60));
          std::iota(run.begin(), run.end(), next);
          next += std::int32_t(run.size());
          nodes.push_back(run);
          kids.emplace_back();
          kids[node].push_back(nodes.size() - 1);
          node = nodes.size() - 1;
        } else {
          node = kids[node][rng() % kids[node].size()];
        }
        prompt.insert(prompt.end(), nodes[node].begin(), nodes[node].end());
      }
      prompt.push_back(next++);  // the request's own last page
      sim_request r;
      t += rng() % 4 == 0 ? 0.5 : 0.003 * double(rng() % 10);
      r.arrival_s = t;
      r.own = prompt;
      r.prompt_tokens = std::int64_t(prompt.size()) * 32 + std::int64_t(rng() % 32);
      r.output_tokens = 1 + std::int64_t(rng() % 40);
      r.id = request_id{std::uint64_t(q + 1)};
      w.requests.push_back(std::move(r));
    }
    // Also with device pages chunk by chunk in a pool a third of the trace's prompts fill: every
    // started prefill must finish (the simulator throws if one is stuck with nothing running).
    engine_config tight = small_engine();
    tight.device_pages = 400;
    tight.pages_by_chunk = true;
    for (engine_config const& c : {small_engine(), tight}) {
      for (strata_options const so : {strata_options{}, strata_options{.deadline_slack = 1},
                                      strata_options{.order = strata_order::longest_prefix}}) {
        auto const r = simulate(w, c, strata_scheduler{so});
        for (auto const& x : r.records) {
          INFO("seed " << seed << " request " << x.id.value << " by chunk " << c.pages_by_chunk);
          CHECK(x.served());
          CHECK(x.redundant_tokens - x.short_overlap_tokens == 0);
        }
      }
    }
    baseline_redundant += redundant(simulate(w, small_engine(), srpt{}));
  }
  CHECK(baseline_redundant > 0);
}

namespace {

/// strata, checked on every round: the chunked prefills under way get the whole budget they need,
/// or at least half of it with balance (short prefills ride beside them within the other half).
struct checked_strata {
  static constexpr char const* name = "strata (checked)";
  strata_scheduler inner;
  std::shared_ptr<std::int64_t> short_changed = std::make_shared<std::int64_t>(0);  // rounds that broke it
  std::shared_ptr<std::int64_t> rounds_with_started = std::make_shared<std::int64_t>(0);
  [[nodiscard]] bool uses_transient_nodes() const noexcept { return inner.uses_transient_nodes(); }
  [[nodiscard]] batch_plan schedule(scheduler_view const& v) const { return inner.schedule(v); }
  /// The checks see the plan as matched (what runs).
  void finish_plan(scheduler_view const& v, batch_plan& p) const
  {
    inner.finish_plan(v, p);
    std::int64_t rest = 0, got = 0, beside = 0;  // beside: short prefills (balance's share)
    for (auto const& r : v.waiting) {
      rest += r.started ? r.prompt_tokens - r.prefilled_tokens : 0;
    }
    std::int64_t const short_tokens = (v.token_budget + 1) / 2;  // completes within the share
    for (auto const& it : p.prefills) {
      bool const started = v.waiting[it.index].started;
      got += started ? it.chunk_tokens : 0;
      beside += !started && it.last_chunk && it.chunk_tokens <= short_tokens ? it.chunk_tokens : 0;
    }
    if (!inner.options().balance) { beside = 0; }
    std::int64_t const due = std::min(rest, v.token_budget - std::min(beside, (v.token_budget + 1) / 2));
    *rounds_with_started += rest > 0;
    *short_changed += got < due;
  }
};

}  // namespace

TEST_CASE("chunked prefills under way are continued every round, before requests not yet started", "[cpu][sim]")
{
  // Long documents with bursts of questions: hits and short misses arrive while 20K-100K-token
  // prompts are chunked, and under the remaining-work order used to outrank them.
  auto const w = long_documents({.requests = 300, .rate = 4, .seed = 4, .documents = 60, .questions_per_visit = 2});
  for (strata_options const so : {strata_options{}, strata_options{.balance = false},
                                  strata_options{.deadline_slack = 0}, strata_options{.deadline_slack = 2}}) {
    checked_strata const s{strata_scheduler{so}};
    auto const r = simulate(w, small_engine(), s);
    INFO("balance " << so.balance << ", deadline slack " << so.deadline_slack);
    CHECK(*s.rounds_with_started > 30);
    CHECK(*s.short_changed == 0);
    for (auto const& x : r.records) {
      CHECK(x.served());
    }
  }
}

TEST_CASE("keeping up with a rate is judged over the arrivals' own span, wherever they start", "[cpu][sim]")
{
  // A short-chat trace the engine easily keeps up with, and the same trace starting 1,000 s late
  // (a replayed trace whose first request is not at time 0): the same requests at the same rate,
  // so the same verdict. Judged from time 0, the late one looked overloaded (the idle first
  // 1,000 s counted as time it fell behind in) and the saturation search returned a rate far too low.
  workload w = short_chat({.requests = 600, .rate = 10, .seed = 3});
  double const rate = arrival_rate(w);
  workload late = w;
  for (auto& r : late.requests) {
    r.arrival_s += 1000;
  }
  CHECK(arrival_rate(late) == Approx(rate));
  auto const c = small_engine();
  CHECK(keeps_up(w, simulate(w, c, longest_prefix{}), rate));
  CHECK(keeps_up(late, simulate(late, c, longest_prefix{}), rate));
  // Far past saturation neither keeps up, early or late.
  workload fast = w;
  scale_time(fast, 1e-3);
  workload fast_late = fast;
  for (auto& r : fast_late.requests) {
    r.arrival_s += 1000;
  }
  CHECK_FALSE(keeps_up(fast, simulate(fast, c, longest_prefix{}), arrival_rate(fast)));
  CHECK_FALSE(keeps_up(fast_late, simulate(fast_late, c, longest_prefix{}), arrival_rate(fast)));
  // Arrivals that span no time offer no rate to keep up with.
  workload one = w;
  one.requests.resize(1);
  CHECK_FALSE(keeps_up(one, simulate(one, c, longest_prefix{}), 1.0));
}

TEST_CASE("simulations conserve tokens and pages and are deterministic", "[cpu][sim]")
{
  auto const w = long_documents({.requests = 150, .rate = 2, .seed = 8, .documents = 12, .questions_per_visit = 1.5});
  engine_config c = small_engine();
  c.pages_by_chunk = GENERATE(false, true);  // a first chunk takes all of its pages, or each chunk its own
  auto check = [&](auto strategy) {
    auto const r1 = simulate(w, c, strategy);
    auto const r2 = simulate(w, c, strategy);
    INFO(r1.strategy);
    for (std::size_t i = 0; i < r1.records.size(); ++i) {
      auto const& x = r1.records[i];
      REQUIRE(x.served());
      CHECK(x.first_token_s >= x.arrival_s);
      CHECK(x.finish_s >= x.first_token_s);
      std::int64_t cached = 0;
      for (auto t : x.cached_tokens) {
        cached += t;
      }
      CHECK(cached + x.computed_tokens == x.prompt_tokens);  // every prompt token cached or computed once
      CHECK(x.first_token_s == r2.records[i].first_token_s);
    }
    auto const s = summarize(r1);
    CHECK(s.requests == 150);
    CHECK(s.hit_rate[1] > 0);  // documents came back from the host
    CHECK(s.ttft_p50 <= s.ttft_p90);
    CHECK(s.ttft_p90 <= s.ttft_p99);
  };
  check(fifo{});
  check(longest_prefix{});
  check(strata_scheduler{});
  // Transfer systems differ: per-block DMA without layer-wise overlap is slower.
  auto const slow = summarize(simulate(w, small_engine(h200::per_block_dma_io()), fifo{}));
  auto const fast = summarize(simulate(w, c, fifo{}));
  CHECK(slow.ttft_mean > fast.ttft_mean);
  CHECK(slow.io_stall_s > fast.io_stall_s);
}

TEST_CASE("a router sends a prompt to the instance that caches its prefix", "[cpu][sim]")
{
  auto const w = long_documents({.requests = 200, .rate = 3, .seed = 9, .documents = 8});
  auto const one = simulate(w, small_engine(), strata_scheduler{}, 1);
  auto const two = simulate(w, small_engine(), strata_scheduler{}, 2);
  REQUIRE(two.counters.size() == 2);
  int used = 0;
  for (auto const& k : two.counters) {
    used += k.prefill_batches > 0;
  }
  CHECK(used == 2);
  CHECK(summarize(two).ttft_mean < summarize(one).ttft_mean);
  // Requests on one document share an instance: they find its pages there.
  CHECK(summarize(two).hit_rate[0] + summarize(two).hit_rate[1] > 0.8);
  STRATA_REQUIRE_THROWS(invalid_argument, "instances must be positive", (void)simulate(w, small_engine(), fifo{}, 0));

  // Placement: documents A and B are first asked about together (B goes to the idle instance),
  // then questions alternate, far apart: each follows its document, whatever the load.
  workload p{"placement", 32, {}};
  std::vector<std::shared_ptr<page_ids const>> docs;
  for (std::int32_t d = 0; d < 2; ++d) {
    page_ids ids(600);
    std::iota(ids.begin(), ids.end(), 1 + 1000 * d);
    docs.push_back(std::make_shared<page_ids const>(std::move(ids)));
  }
  for (std::uint64_t k = 0; k < 8; ++k) {
    sim_request r;
    r.id = request_id{k + 1};
    r.arrival_s = k < 2 ? 0.01 * double(k) : 100.0 * double(k);
    r.shared = docs[k % 2];
    r.own = {std::int32_t(500000 + k)};
    r.prompt_tokens = 601 * 32;
    r.output_tokens = 8;
    p.requests.push_back(r);
  }
  // A third document asked about twice, 10 ms apart: under strata the second question finds the
  // first one's prefix in flight (transient) on its instance and follows it there, idle as the
  // other instance is.
  {
    page_ids ids(600);
    std::iota(ids.begin(), ids.end(), 1 + 1000 * 2);
    docs.push_back(std::make_shared<page_ids const>(std::move(ids)));
  }
  for (std::uint64_t k = 8; k < 10; ++k) {
    sim_request r;
    r.id = request_id{k + 1};
    r.arrival_s = 1000.0 + 0.01 * double(k - 8);
    r.shared = docs[2];
    r.own = {std::int32_t(500000 + k)};
    r.prompt_tokens = 601 * 32;
    r.output_tokens = 8;
    p.requests.push_back(r);
  }
  auto const followed = simulate(p, small_engine(), strata_scheduler{}, 2);
  CHECK(followed.records[9].instance == followed.records[8].instance);
  CHECK(followed.records[9].redundant_tokens == 0);
  for (auto const& result : {simulate(p, small_engine(), fifo{}, 2), followed}) {
    CHECK(result.records[0].instance != result.records[1].instance);
    for (std::size_t k = 2; k < 8; ++k) {
      INFO("request " << k + 1);
      CHECK(result.records[k].instance == result.records[k % 2].instance);
      CHECK(result.records[k].cached_tokens[0] == 600 * 32);  // found on that instance's device
    }
  }
}

namespace {

/// A strategy checked every round: the index's invariants hold (`hiradix_tree::check_invariants`).
template <class Strategy>
struct invariant_checked {
  static constexpr char const* name = Strategy::name;
  Strategy inner;
  std::shared_ptr<std::int64_t> rounds = std::make_shared<std::int64_t>(0);
  [[nodiscard]] bool uses_transient_nodes() const noexcept { return inner.uses_transient_nodes(); }
  [[nodiscard]] batch_plan schedule(scheduler_view const& v)
  {
    v.tree->check_invariants();
    ++*rounds;
    return inner.schedule(v);
  }
  void finish_plan(scheduler_view const& v, batch_plan& p)
  {
    if constexpr (plan_finishing_strategy<Strategy>) { inner.finish_plan(v, p); }
  }
};

std::int64_t distinct_pages(workload const& w)
{
  std::set<std::int32_t> ids;
  for (auto const& r : w.requests) {
    for (auto id : r.pages()) {
      ids.insert(id);
    }
  }
  return std::int64_t(ids.size());
}

}  // namespace

TEST_CASE("instances sharing a remote tier find the prefixes the others computed", "[cpu][sim]")
{
  // A document computed on instance a; its question arrives on instance b much later.
  auto const w = two_on_one_document(100);
  auto run = [&](bool shared, std::int64_t remote_pages) {
    engine_config c = small_engine();
    c.remote_pages = remote_pages;
    if (shared) { c.shared_remote = std::make_shared<shared_remote_pages>(); }
    c.costs.set_remote_tier(12.5e9, 12.5e9, 1e-3);  // 100 Gb/s
    engine<strata_scheduler> a{c, strata_scheduler{}, 0}, b{c, strata_scheduler{}, 1};
    std::vector<request_record> rec(2);
    a.arrive(w.requests[0], rec[0], 0);
    while (a.next_event() < std::numeric_limits<double>::infinity()) {
      a.step();
    }
    b.arrive(w.requests[1], rec[1], 100);
    while (b.next_event() < std::numeric_limits<double>::infinity()) {
      b.step();
    }
    if (shared && remote_pages > 0) { CHECK(c.shared_remote->size() >= 1250); }  // a wrote the document
    return std::pair{rec[1], b.cache().stats()};
  };
  auto const [alone, alone_stats] = run(false, 1 << 20);
  auto const [none, none_stats] = run(true, 0);  // no remote tier: nothing to share through
  auto const [shared, shared_stats] = run(true, 1 << 20);
  CHECK(alone.cached_tokens[1] + alone.cached_tokens[3] == 0);
  CHECK(none.cached_tokens[1] + none.cached_tokens[3] == 0);
  CHECK(shared_stats.remote_lookups == 1);
  CHECK(shared_stats.remote_found_pages == 1250);
  CHECK(shared.cached_tokens[1] + shared.cached_tokens[3] ==
        1250 * 32);  // from the host (prefetched) or the remote tier
  CHECK(shared.computed_tokens < alone.computed_tokens);
  CHECK(shared.ttft_s() < alone.ttft_s());  // 1250 pages over 100 Gb/s beat a 40K-token prefill
}

TEST_CASE("a working set larger than the host tier is served from the file tier at its cost", "[cpu][sim]")
{
  auto const w = long_documents(
      {.requests = 240, .rate = 0.5, .seed = 6, .documents = 16, .questions_per_visit = 1.5, .zipf = 0.3});
  std::int64_t const working_set = distinct_pages(w);
  engine_config c = small_engine();
  c.host_pages = working_set / 4;  // the host holds a quarter of the documents
  c.file_pages = 2 * working_set;
  c.backup_policy = write_policy::write_back;
  REQUIRE(c.host_pages + c.device_pages < working_set);
  auto check = [&](auto strategy, engine_config const& config) {
    invariant_checked<decltype(strategy)> const checked{strategy};
    auto const r = simulate(w, config, checked);
    INFO(r.strategy << ", file tier " << config.file_pages << " pages");
    CHECK(*checked.rounds > 100);
    for (auto const& x : r.records) {  // nothing turned away, every prompt token cached or computed once
      REQUIRE(x.served());
      CHECK(x.first_token_s >= x.arrival_s);
      CHECK(x.cached_tokens[0] + x.cached_tokens[1] + x.cached_tokens[2] + x.cached_tokens[3] + x.computed_tokens ==
            x.prompt_tokens);
    }
    return r;
  };
  for (bool const use_strata : {false, true}) {
    auto run = [&](engine_config const& config) {
      return use_strata ? check(strata_scheduler{}, config) : check(srpt{}, config);
    };
    // A drive fast enough that reading beats recomputing (12 GB/s, PCIe 5 NVMe): revisits find
    // their document on disk, and the read is charged at the drive's rate.
    engine_config fast = c;
    fast.costs.set_file_tier(h200::pcie5_nvme_bytes_per_s, h200::pcie5_nvme_bytes_per_s);
    auto const with_file = run(fast);
    summary const f = summarize(with_file);
    CHECK(f.hit_rate[std::size_t(tier::file)] > 0.1);
    CHECK(with_file.counters[0].loaded_from[std::size_t(tier::file)] > 0);
    CHECK(with_file.counters[0].record_read_s >=
          double(with_file.counters[0].loaded_from[std::size_t(tier::file)]) * double(c.costs.page_bytes()) / 12e9);
    // Without the file tier those documents are recomputed.
    engine_config host_only = c;
    host_only.file_pages = 0;
    summary const h = summarize(run(host_only));
    CHECK(h.hit_rate[std::size_t(tier::file)] == 0);
    CHECK(h.hit_rate[0] + h.hit_rate[1] < f.hit_rate[0] + f.hit_rate[1] + f.hit_rate[2] - 0.1);
    // At the measured 1.92 GB/s reading a page costs more than recomputing it at these contexts: the
    // plans recompute most file hits instead (`choose_prefix`), what they read is charged at 1.92 GB/s,
    // and the faster drive serves sooner.
    auto const slow_run = run(c);
    summary const slow = summarize(slow_run);
    CHECK(slow.hit_rate[std::size_t(tier::file)] < f.hit_rate[std::size_t(tier::file)] / 2);
    CHECK(slow_run.counters[0].record_read_s >=
          double(slow_run.counters[0].loaded_from[std::size_t(tier::file)]) * double(c.costs.page_bytes()) / 1.92e9);
    CHECK(f.ttft_mean < slow.ttft_mean);
  }
}

TEST_CASE("bad simulator configurations are rejected", "[cpu][sim]")
{
  auto const w = two_on_one_document(0);
  engine_config c = small_engine();
  c.token_budget = 0;
  STRATA_REQUIRE_THROWS(invalid_argument, "token_budget must be positive", (void)simulate(w, c, fifo{}));
  c = small_engine();
  c.device_pages = 0;
  STRATA_REQUIRE_THROWS(invalid_argument, "device_pages must be positive", (void)simulate(w, c, fifo{}));
  c = small_engine();
  c.host_pages = -1;
  STRATA_REQUIRE_THROWS(invalid_argument, "tier sizes must not be negative", (void)simulate(w, c, fifo{}));
  c = small_engine();
  c.costs = cost_model{};
  STRATA_REQUIRE_THROWS(invalid_argument, "costs is an empty cost_model", (void)simulate(w, c, fifo{}));
  // Bad workloads are named before anything runs.
  auto bad = [&](auto&& change, char const* message) {
    workload b = w;
    change(b);
    STRATA_REQUIRE_THROWS(invalid_argument, message, (void)simulate(b, small_engine(), fifo{}));
  };
  bad([](workload& b) { b.requests[1].id = b.requests[0].id; }, "request id 1 appears twice");
  bad([](workload& b) { b.requests[1].id = request_id{}; }, "request id 0 is reserved");
  bad([](workload& b) { b.requests[1].prompt_tokens = 1251 * 32 - 1; }, "fewer than its 1251 whole pages");
  bad([](workload& b) { b.requests[0].output_tokens = 0; }, "must generate at least one token");
  bad([](workload& b) { b.requests[1].arrival_s = -1; }, "negative or non-finite arrival");
  bad([](workload& b) { b.requests[1].after = request_id{7}; },
      "follows request 7, which is not earlier in the workload");
  workload other = w;
  other.page_tokens = 16;
  STRATA_REQUIRE_THROWS(invalid_argument, "the workload's 16", (void)simulate(other, small_engine(), fifo{}));
  // A prompt larger than the device pool is turned away, not looped on.
  c = small_engine();
  c.device_pages = 1000;
  auto const r = simulate(w, c, fifo{});
  CHECK(summarize(r).rejected == 2);
  CHECK_FALSE(r.records[0].served());
}

TEST_CASE("reports: percentiles, CSV, chart data", "[cpu][sim]")
{
  CHECK(percentile({1, 2, 3, 4}, 50) == 2);
  CHECK(percentile({1, 2, 3, 4}, 90) == 4);
  CHECK(percentile({}, 50) == 0);
  auto const w = two_on_one_document(0);
  auto const r = simulate(w, small_engine(), strata_scheduler{});
  write_requests_csv("strata_requests.csv", r);
  std::ifstream in{"strata_requests.csv"};
  std::string header, line;
  std::getline(in, header);
  CHECK(header.rfind("id,instance,arrival_s,first_token_s,ttft_s", 0) == 0);
  int lines = 0;
  while (std::getline(in, line)) {
    ++lines;
  }
  CHECK(lines == 2);
  // The CDF ends at 1 (the axis is [0, 1]), and its x values never go down.
  auto const cdf = ttft_cdf(r, "strata", 10);
  REQUIRE(cdf.x.size() == 2);  // one point per request when there are fewer requests than points
  CHECK(cdf.y.back() == 1.0);
  CHECK(std::is_sorted(cdf.x.begin(), cdf.x.end()));
  // Chart data: one row per point, titles with commas and quotes quoted.
  chart const c{"a, \"b\"", "TTFT (s)", "fraction", {cdf, series{"two", {1, 2}, {3, 4}}}, true, chart::kind::cdf};
  write_chart_csv("strata_chart.csv", {c, c});
  std::ifstream data{"strata_chart.csv"};
  std::getline(data, header);
  CHECK(header == "panel,title,x_label,y_label,x_scale,kind,series,x,y");
  std::vector<std::string> rows;
  while (std::getline(data, line)) {
    rows.push_back(line);
  }
  REQUIRE(rows.size() == 2 * (2 + 2));
  CHECK(rows[0].rfind("0,\"a, \"\"b\"\"\",TTFT (s),fraction,log,cdf,strata,", 0) == 0);
  CHECK(rows.back() == "1,\"a, \"\"b\"\"\",TTFT (s),fraction,log,cdf,two,2,4");
  STRATA_REQUIRE_THROWS(
      invalid_argument, "series 'bad' has 1 x and 0 y values",
      write_chart_csv("strata_chart.csv", {chart{"t", "x", "y", {series{"bad", {1}, {}}}, false, chart::kind::line}}));
  CHECK(plot_command("/a b/plot.py", {"it's.csv"}) == "python3 '/a b/plot.py' 'it'\\''s.csv'");
  std::remove("strata_requests.csv");
  std::remove("strata_chart.csv");
}
