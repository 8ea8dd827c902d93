// SPDX-License-Identifier: Apache-2.0
// host_copy between layouts, against memcpy of the same bytes measured in the same run.
//
// Each iteration times the plan's copy and then one memcpy of plan.bytes() between two other
// buffers; `GB/s` is the copy's rate, `memcpy_GB/s` the reference's, `vs_memcpy` their ratio.
// Run with --benchmark_repetitions=5 (the default here) and read the median rows.
#include <strata/strata.hpp>

#include "bench_main.hpp"

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

/// Owned host memory and one layout of each kind the benchmark uses.
struct pool_memory {
  std::vector<std::byte> bytes;
  std::vector<std::byte*> k, v, layers;  // table entries for the engine layouts
};

pool_memory make_memory(strata::kv_geometry const& g, std::int64_t pages)
{
  pool_memory m;
  m.bytes.resize(static_cast<std::size_t>(pages * g.page_bytes()));
  std::mt19937_64 rng{1};
  for (auto& b : m.bytes) {
    b = static_cast<std::byte>(rng());
  }
  std::int64_t const tensor = pages * g.block_bytes();
  for (std::int64_t l = 0; l < g.layers; ++l) {
    m.k.push_back(m.bytes.data() + (l * g.planes) * tensor);
    if (g.planes == 2) { m.v.push_back(m.bytes.data() + (l * g.planes + 1) * tensor); }
    m.layers.push_back(m.bytes.data() + l * g.planes * tensor);
  }
  return m;
}

template <class Src, class Dst>
void run(benchmark::State& state, Src const& src, Dst const& dst, std::vector<strata::page_pair> const& pages)
{
  strata::copy_plan const plan{src, dst, std::span<strata::page_pair const>{pages},
                               strata::layer_range::all(src.geometry())};
  auto const bytes = static_cast<std::size_t>(plan.bytes());
  std::vector<std::byte> ref_src(bytes, std::byte{1}), ref_dst(bytes);
  strata::host_copy const copier;
  double copy_s = 0, memcpy_s = 0;
  for (auto _ : state) {
    auto const t0 = clock_type::now();
    copier.copy(plan);
    auto const t1 = clock_type::now();
    std::memcpy(ref_dst.data(), ref_src.data(), bytes);
    auto const t2 = clock_type::now();
    benchmark::DoNotOptimize(ref_dst.data());
    double const c = std::chrono::duration<double>(t1 - t0).count();
    copy_s += c;
    memcpy_s += std::chrono::duration<double>(t2 - t1).count();
    state.SetIterationTime(c);
  }
  double const n = static_cast<double>(state.iterations());
  state.counters["GB/s"] = static_cast<double>(bytes) * n / copy_s / 1e9;
  state.counters["memcpy_GB/s"] = static_cast<double>(bytes) * n / memcpy_s / 1e9;
  state.counters["vs_memcpy"] = memcpy_s / copy_s;
  state.counters["MiB"] = static_cast<double>(bytes) / (1 << 20);
}

/// Registers one benchmark per layout pair for a model geometry, pages in random order.
void register_geometry(char const* model, strata::kv_geometry const& g, std::int64_t pages)
{
  // Pools are kept alive for the whole run; the benchmark lambdas refer to them.
  static std::vector<std::unique_ptr<pool_memory>> keep;
  auto& a = *keep.emplace_back(std::make_unique<pool_memory>(make_memory(g, pages)));
  auto& b = *keep.emplace_back(std::make_unique<pool_memory>(make_memory(g, pages)));
  std::vector<strata::page_pair> map;
  std::vector<std::int64_t> perm(static_cast<std::size_t>(pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64{2});
  for (std::int64_t i = 0; i < pages; ++i) {
    map.push_back({i, perm[static_cast<std::size_t>(i)]});
  }

  strata::page_first const host{a.bytes.data(), g, pages};
  strata::layer_first const device{b.bytes.data(), g, pages};
  strata::page_first const host2{b.bytes.data(), g, pages};
  std::string const prefix = std::string{model} + "/";
  auto add = [&](std::string const& name, auto fn) {
    benchmark::RegisterBenchmark((prefix + name).c_str(), fn)->UseManualTime()->Unit(benchmark::kMillisecond);
  };
  add("page_first->layer_first", [=](benchmark::State& s) { run(s, host, device, map); });
  add("layer_first->page_first", [=](benchmark::State& s) { run(s, device, host, map); });
  add("page_first->page_first", [=](benchmark::State& s) { run(s, host, host2, map); });
  if (g.planes == 2) {
    auto const sglang = strata::sglang_layout(b.k, b.v, g, pages);
    add("page_first->sglang", [=](benchmark::State& s) { run(s, host, sglang, map); });
    strata::hf_layout const hf{b.k, b.v, g, 1, pages * g.page_tokens};
    add("page_first->hf(transpose)", [=](benchmark::State& s) { run(s, host, hf, map); });
    strata::vllm_layout const vllm{b.layers, g, pages};
    add("page_first->vllm", [=](benchmark::State& s) { run(s, host, vllm, map); });
  } else {
    auto const mla = strata::mla_layout(b.k, g, pages);
    add("page_first->mla", [=](benchmark::State& s) { run(s, host, mla, map); });
  }
}

}  // namespace

int main(int argc, char** argv)
{
  register_geometry("llama3.1-8b/p32", strata::models::llama31_8b.geometry(32), 16);             // 64 MiB
  register_geometry("llama3.1-8b-tp8/p32", strata::models::llama31_8b.geometry(32, 2, 8), 128);  // 64 MiB
  register_geometry("deepseek-v3-mla/p64", strata::models::deepseek_v3.geometry(64), 16);        // 69 MiB
  strata::bench::run_benchmarks(argc, argv);
}
