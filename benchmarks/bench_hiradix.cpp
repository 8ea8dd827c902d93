// SPDX-License-Identifier: Apache-2.0
// hiradix_tree: match and insert of a 128K-token prompt (4K pages of 32 tokens) in a tree holding
// ~1M cached pages of documents with shared prefixes; eviction of 10K pages; index memory per page.
// Baseline, in the same run: a std::map keyed by (hash of the prefix before the page, the page's
// tokens), the hash-chain index of vLLM/LMCache-style caches, held in a plain ordered map.
#include <strata/index/hiradix_tree.hpp>

#include <benchmark/benchmark.h>

#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

namespace {

constexpr std::int64_t page_tokens = 32;
constexpr std::int64_t prompt_pages = 4096;  // 128K tokens
constexpr int groups = 32;                   // documents sharing a 256-page prefix per group
constexpr int documents = 250;               // ~1M cached pages in all
constexpr std::int64_t shared_pages = 256;

using tokens_t = std::vector<std::int32_t>;

tokens_t document(int doc, std::int64_t pages)
{
  tokens_t t(static_cast<std::size_t>(pages * page_tokens));
  std::mt19937 group_rng{static_cast<unsigned>(doc % groups) + 1u}, doc_rng{static_cast<unsigned>(doc) + 1000u};
  for (std::size_t i = 0; i < t.size(); ++i) {
    t[i] = static_cast<std::int32_t>(i < std::size_t(shared_pages * page_tokens) ? group_rng() % 128000
                                                                                 : doc_rng() % 128000);
  }
  return t;
}

/// The baseline: one map entry per page, keyed by (chained hash of the prefix before it, tokens).
class map_index {
 public:
  std::int64_t match(tokens_t const& t) const
  {
    std::uint64_t h = 0;
    std::int64_t p = 0;
    for (; (p + 1) * page_tokens <= std::int64_t(t.size()); ++p) {
      tokens_t const page(t.begin() + p * page_tokens, t.begin() + (p + 1) * page_tokens);
      auto const it = map_.find({h, page});
      if (it == map_.end()) { break; }
      h = it->second.hash;
    }
    return p * page_tokens;
  }
  void insert(tokens_t const& t, std::int64_t first_page_id)
  {
    std::uint64_t h = 0;
    for (std::int64_t p = 0; (p + 1) * page_tokens <= std::int64_t(t.size()); ++p) {
      tokens_t page(t.begin() + p * page_tokens, t.begin() + (p + 1) * page_tokens);
      std::uint64_t next = h;
      for (auto x : page) {
        next = (next ^ std::uint64_t(x)) * 0x100000001b3ull;
      }
      auto [it, inserted] = map_.try_emplace({h, std::move(page)}, entry{next, first_page_id + p});
      h = it->second.hash;
    }
  }
  std::size_t size() const { return map_.size(); }
  // node: key (8 + 24 + 32*4 heap + 16 malloc) + value 16 + rb-tree node 32 + malloc 16
  std::size_t bytes() const { return map_.size() * (8 + 24 + page_tokens * 4 + 16 + 16 + 32 + 16); }

 private:
  struct entry {
    std::uint64_t hash;
    std::int64_t page;
  };
  std::map<std::pair<std::uint64_t, tokens_t>, entry> map_;
};

struct fixture {
  std::unique_ptr<strata::hiradix_tree> tree;
  map_index baseline;
  std::vector<tokens_t> docs;
  std::int64_t next_page = 0;
  std::int64_t cached_pages = 0;

  explicit fixture(std::int64_t device_capacity)
  {
    strata::hiradix_config c;
    c.page_tokens = page_tokens;
    c.page_bytes = 32 * 2 * 32 * 8 * 128 * 2 / 32 * 32;  // Llama-3.1-8B, 32-token pages: 4 MiB
    c.capacity = {device_capacity, 0, 0, 0};
    c.backup_policy = strata::write_policy::write_back;
    tree = std::make_unique<strata::hiradix_tree>(c);
    for (int d = 0; d < documents; ++d) {
      docs.push_back(document(d, prompt_pages));
      insert(docs.back());
    }
    cached_pages = tree->stats().resident_pages[0];
  }
  void insert(tokens_t const& t)
  {
    std::int64_t const n = std::int64_t(t.size()) / page_tokens;
    std::vector<std::int64_t> ids(static_cast<std::size_t>(n));
    std::iota(ids.begin(), ids.end(), next_page);
    next_page += n;
    (void)tree->insert(t, ids);
    baseline.insert(t, next_page);
  }
};

/// The tree the match and insert benchmarks share (room for the inserts' new pages).
fixture& long_documents()
{
  static fixture f{std::int64_t{1} << 23};
  return f;
}

void match_128k(benchmark::State& state)
{
  auto& f = long_documents();
  std::size_t i = 0;
  for (auto _ : state) {
    auto const m = f.tree->match(f.docs[i++ % f.docs.size()]);
    benchmark::DoNotOptimize(m.tokens);
  }
  state.counters["cached_pages"] = double(f.cached_pages);
}

void match_128k_map_baseline(benchmark::State& state)
{
  auto& f = long_documents();
  std::size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(f.baseline.match(f.docs[i++ % f.docs.size()]));
  }
  state.counters["cached_pages"] = double(f.baseline.size());
}

/// The floor under any exact match: comparing the prompt's 512 KiB of tokens with 512 KiB held in
/// the index (a `memcmp`, on the same rotation of documents).
void memcmp_128k_floor(benchmark::State& state)
{
  auto& f = long_documents();
  std::vector<tokens_t> copies(f.docs.begin(), f.docs.end());
  std::size_t i = 0;
  for (auto _ : state) {
    std::size_t const k = i++ % f.docs.size();
    benchmark::DoNotOptimize(std::memcmp(f.docs[k].data(), copies[k].data(), f.docs[k].size() * 4));
  }
}

void insert_128k(benchmark::State& state)
{
  auto& f = long_documents();
  int d = documents;
  std::vector<tokens_t> fresh;
  for (int k = 0; k < 64; ++k) {
    fresh.push_back(document(d + k, prompt_pages));
  }
  std::size_t i = 0;
  for (auto _ : state) {
    state.PauseTiming();
    tokens_t t = fresh[i % fresh.size()];
    t[t.size() - 1 - (i / fresh.size()) % 100] ^= static_cast<std::int32_t>(i);  // a new last page every time
    std::vector<std::int64_t> ids(static_cast<std::size_t>(prompt_pages));
    std::iota(ids.begin(), ids.end(), f.next_page);
    state.ResumeTiming();
    auto const r = f.tree->insert(t, ids);
    benchmark::DoNotOptimize(r.new_pages);
    state.PauseTiming();
    f.next_page += prompt_pages;
    ++i;
    state.ResumeTiming();
  }
}

void insert_128k_map_baseline(benchmark::State& state)
{
  auto& f = long_documents();
  std::vector<tokens_t> fresh;
  for (int k = 0; k < 64; ++k) {
    fresh.push_back(document(10000 + k, prompt_pages));
  }
  std::size_t i = 0;
  for (auto _ : state) {
    state.PauseTiming();
    tokens_t t = fresh[i % fresh.size()];
    t[t.size() - 1 - (i / fresh.size()) % 100] ^= static_cast<std::int32_t>(i);
    state.ResumeTiming();
    f.baseline.insert(t, 0);
    ++i;
  }
}

/// Eviction of 10K pages from a tree of short chats (21-page prompts sharing a 4-page system
/// prompt per group): ~500 leaves per call.
void evict_10k_pages(benchmark::State& state)
{
  strata::hiradix_config c;
  c.page_tokens = page_tokens;
  c.capacity = {std::int64_t{1} << 21, 0, 0, 0};
  c.backup_policy = strata::write_policy::write_through_selective;
  strata::hiradix_tree tree{c};
  std::int64_t next = 0, chats = 0;
  auto add_chats = [&](std::int64_t n) {
    for (std::int64_t k = 0; k < n; ++k, ++chats) {
      tokens_t t(21 * page_tokens);
      std::mt19937 sys{static_cast<unsigned>(chats % 64) + 1u}, own{static_cast<unsigned>(chats) + 99u};
      for (std::size_t i = 0; i < t.size(); ++i) {
        t[i] = std::int32_t(i < 4 * page_tokens ? sys() % 50000 : own() % 50000);
      }
      std::vector<std::int64_t> ids(21);
      std::iota(ids.begin(), ids.end(), next);
      auto const r = tree.insert(t, ids);
      next += 21;
      (void)r;
    }
  };
  add_chats(50000);  // ~850K pages
  double pages = 0;
  for (auto _ : state) {
    state.PauseTiming();
    if (tree.stats().resident_pages[0] < 200000) { add_chats(20000); }
    state.ResumeTiming();
    auto const r = tree.evict(strata::tier::device, 10000);
    pages += double(r.pages);
    benchmark::DoNotOptimize(r.freed.data());
  }
  state.counters["pages_per_call"] = benchmark::Counter(pages, benchmark::Counter::kAvgIterations);
  state.counters["ns_per_page"] = benchmark::Counter(pages, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

/// Memory of the same ~1M cached pages in a tree sized for them (a device pool of 2^20 pages: the
/// owner table costs 4 bytes per device page).
void memory_per_page(benchmark::State& state)
{
  fixture f{std::int64_t{1} << 20};
  for (auto _ : state) {
    benchmark::DoNotOptimize(f.tree->memory_bytes());
  }
  double const pages = double(f.tree->stats().resident_pages[0]);
  state.counters["index_bytes_per_page"] = double(f.tree->memory_bytes()) / pages;
  state.counters["token_bytes_per_page"] = double(page_tokens * 4);
  state.counters["overhead_bytes_per_page"] = double(f.tree->memory_bytes()) / pages - double(page_tokens * 4);
  state.counters["map_baseline_bytes_per_page"] = double(f.baseline.bytes()) / double(f.baseline.size());
  state.counters["nodes"] = double(f.tree->node_count());
}

}  // namespace

BENCHMARK(match_128k)->Unit(benchmark::kMicrosecond)->Repetitions(5)->ReportAggregatesOnly(true);
BENCHMARK(memcmp_128k_floor)->Unit(benchmark::kMicrosecond)->Repetitions(5)->ReportAggregatesOnly(true);
BENCHMARK(match_128k_map_baseline)->Unit(benchmark::kMicrosecond)->Repetitions(5)->ReportAggregatesOnly(true);
BENCHMARK(insert_128k)->Unit(benchmark::kMicrosecond)->Iterations(200)->Repetitions(5)->ReportAggregatesOnly(true);
BENCHMARK(insert_128k_map_baseline)
    ->Unit(benchmark::kMicrosecond)
    ->Iterations(20)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK(evict_10k_pages)->Unit(benchmark::kMicrosecond)->Iterations(50)->Repetitions(5)->ReportAggregatesOnly(true);
BENCHMARK(memory_per_page)->Iterations(1);
BENCHMARK_MAIN();
