// SPDX-License-Identifier: Apache-2.0
// Bandwidth of every backend, loading a context from the pinned host pool into a layer-first GPU
// pool at random page slots, and backing it up the other way; each figure also as a ratio to one
// contiguous cudaMemcpyAsync of the same bytes measured in the same run, with the CPU time spent.
//
//   bench_transfer [--quick] [--reps N]
//
// --quick: 8K-token contexts only, 3 repetitions. Writes transfer.csv (and batch_sweep.csv) to $OUT.
// Also small segments: 1-token pages (256-byte blocks) and head-row transposes into a head-major
// (Hugging Face) device pool. Every timed repetition is checked: sampled destination runs are
// poisoned before it and compared with their sources after it; any mismatch makes the exit status 1.
#include "gpu_bench.cuh"

#include <strata/layout/engine.hpp>
#include <strata/tier/pinned_host_pool.cuh>
#include <strata/transfer/dma_batch.cuh>
#include <strata/transfer/dma_copy.cuh>
#include <strata/transfer/gpu_assisted.cuh>
#include <strata/transfer/staged.cuh>
#include <strata/transfer/submit_thread.cuh>

#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>

using namespace strata;

namespace {

struct measured {
  double gbps;
  double caller_cpu_ms;
  double process_cpu_ms;
};

double process_cpu_seconds()
{
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

/**
 * Destination runs of a few sampled (pair, layer) blocks of a plan (the first pair, the last, and
 * random ones, drawn anew each time): poisoned before a repetition, compared with their sources
 * after it, so that every repetition must have moved them (a stale copy from an earlier one fails).
 */
template <class Src, class Dst>
class sampled_check {
 public:
  sampled_check(copy_plan<Src, Dst> const& plan, std::mt19937_64& rng) : plan_{plan}, rng_{rng} {}

  void poison()
  {
    runs_.clear();
    kv_geometry const g = plan_.src.geometry();
    std::vector<page_pair> picks{plan_.pages.front(), plan_.pages.back()};
    for (int i = 0; i < 6; ++i) {
      picks.push_back(plan_.pages[rng_() % plan_.pages.size()]);
    }
    for (page_pair const& p : picks) {
      auto const l = static_cast<std::int64_t>(rng_() % static_cast<std::uint64_t>(g.layers));
      for_each_run(copy_plan{plan_.src, plan_.dst, std::span<page_pair const>{&p, 1}, layer_range::one(l)},
                   [this](copy_run const& r) { runs_.push_back(r); });
    }
    std::int64_t longest = 0;
    for (auto const& r : runs_) {
      longest = std::max(longest, r.bytes);
    }
    if (static_cast<std::int64_t>(poison_.size()) < longest) {
      poison_ = pinned_buffer{static_cast<std::size_t>(longest)};
      std::memset(poison_.data(), 0xA5, poison_.size());
    }
    // From pinned memory, cudaMemcpy returns once the bytes have landed.
    for (auto const& r : runs_) {
      STRATA_CUDA_TRY(cudaMemcpy(r.dst, poison_.data(), static_cast<std::size_t>(r.bytes), cudaMemcpyDefault));
    }
  }

  [[nodiscard]] bool verify() const
  {
    std::vector<std::byte> a, b;
    for (auto const& r : runs_) {
      a.resize(static_cast<std::size_t>(r.bytes));
      b.resize(a.size());
      STRATA_CUDA_TRY(cudaMemcpy(a.data(), r.src, a.size(), cudaMemcpyDefault));
      STRATA_CUDA_TRY(cudaMemcpy(b.data(), r.dst, b.size(), cudaMemcpyDefault));
      if (a != b) { return false; }
    }
    return true;
  }

 private:
  copy_plan<Src, Dst> plan_;
  std::mt19937_64& rng_;
  std::vector<copy_run> runs_;
  pinned_buffer poison_;
};

/// Runs `go(stream) -> transfer_handle` `reps` times (after one warm-up); medians. `ok` is false if
/// any repetition (the warm-up included) failed its data check.
template <class Go, class Check>
measured time_transfer(Go&& go, Check& check, std::int64_t bytes, int reps, cudaStream_t stream, bool& ok)
{
  cuda_event start{true}, stop{true};
  std::vector<double> gbps, caller, process;
  for (int r = -1; r < reps; ++r) {
    STRATA_CUDA_TRY(cudaStreamSynchronize(stream));
    check.poison();
    start.record(stream);
    double const p0 = process_cpu_seconds();
    double const c0 = bench::thread_cpu_seconds();
    transfer_handle const h = go(stream);
    double const c1 = bench::thread_cpu_seconds();
    h.wait(stream);
    stop.record(stream);
    STRATA_CUDA_TRY(cudaEventSynchronize(stop.get()));
    double const p1 = process_cpu_seconds();
    ok = check.verify() && ok;
    if (r < 0) { continue; }
    gbps.push_back(static_cast<double>(bytes) / (bench::elapsed_ms(start.get(), stop.get()) * 1e-3) / 1e9);
    caller.push_back((c1 - c0) * 1e3);
    process.push_back((p1 - p0) * 1e3);
  }
  return {bench::median(gbps), bench::median(caller), bench::median(process)};
}

/// Like `time_transfer`, without a data check (the descriptor sweep: the table above checks dma_batch).
template <class Go>
measured time_unchecked(Go&& go, std::int64_t bytes, int reps, cudaStream_t stream)
{
  struct none {
    void poison() {}
    [[nodiscard]] bool verify() const { return true; }
  } check;
  bool ok = true;
  return time_transfer(std::forward<Go>(go), check, bytes, reps, stream, ok);
}

/// One contiguous copy of `bytes` (the link's practical ceiling), median GB/s.
double contiguous_gbps(void* dst, void const* src, std::int64_t bytes, int reps, cudaStream_t stream)
{
  cuda_event start{true}, stop{true};
  std::vector<double> v;
  for (int r = -1; r < reps; ++r) {
    start.record(stream);
    STRATA_CUDA_TRY(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(bytes), cudaMemcpyDefault, stream));
    stop.record(stream);
    STRATA_CUDA_TRY(cudaEventSynchronize(stop.get()));
    if (r >= 0) { v.push_back(static_cast<double>(bytes) / (bench::elapsed_ms(start.get(), stop.get()) * 1e-3) / 1e9); }
  }
  return bench::median(v);
}

struct shape {
  char const* label;
  model_shape model;
  std::int64_t tensor_parallel;
};

/// The table's rows for one (shape, page, context): each backend, load then backup.
struct table {
  bench::report& csv;
  submit_thread& thread;
  std::mt19937_64& rng;
  cudaStream_t stream;
  bool all_ok = true;

  template <class Backend, class Host, class Device>
  void run(char const* label, std::int64_t page, std::int64_t context, char const* name, Backend& backend,
           bool threaded, completion c, copy_plan<Host, Device> const& load, copy_plan<Device, Host> const& backup,
           double ref_load, double ref_backup, int reps)
  {
    std::int64_t const bytes = load.bytes();
    for (int dir = 0; dir < 2; ++dir) {
      bool ok = true;
      auto measure = [&](auto const& plan) {
        sampled_check check{plan, rng};
        return time_transfer(
            [&](cudaStream_t st) {
              return threaded ? thread.submit(backend, plan, st, c) : submit(backend, plan, st, c);
            },
            check, bytes, reps, stream, ok);
      };
      measured const m = dir == 0 ? measure(load) : measure(backup);
      all_ok = all_ok && ok;
      double const ref = dir == 0 ? ref_load : ref_backup;
      char const* d = dir == 0 ? "load" : "backup";
      std::printf("| %s | %lld | %lld | %s | %s | %.1f | %.3f | %.2f | %.2f |%s\n", label, (long long)page,
                  (long long)context, d, name, m.gbps, m.gbps / ref, m.caller_cpu_ms, m.process_cpu_ms,
                  ok ? "" : " DATA MISMATCH");
      std::ostringstream row;
      row << label << "," << load.src.geometry().kv_heads << "," << page << "," << context << "," << d << "," << name
          << "," << m.gbps << "," << m.gbps / ref << "," << m.caller_cpu_ms << "," << m.process_cpu_ms << "," << ref
          << "," << (ok ? "ok" : "MISMATCH");
      csv.row(row.str());
    }
  }
};

}  // namespace

int main(int argc, char** argv)
{
  bool quick = false;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) { quick = true; }
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) { reps = std::atoi(argv[++i]); }
  }
  if (quick) { reps = std::min(reps, 3); }
  STRATA_CUDA_TRY(cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync));  // waiting threads sleep, not spin
  cudaDeviceProp prop{};
  STRATA_CUDA_TRY(cudaGetDeviceProperties(&prop, 0));
  std::printf("# bench_transfer on %s (%d SMs), %d repetitions, median\n", prop.name, prop.multiProcessorCount, reps);
  std::printf("# dma_batch: batch API %s\n", dma_batch::batch_api_available() ? "available" : "MISSING (fallback)");

  bench::report csv{
      "transfer.csv",
      "model,kv_heads,page_tokens,context,direction,backend,GBps,vs_contiguous,caller_cpu_ms,process_cpu_ms,"
      "contiguous_GBps,check"};
  cuda_stream stream;
  submit_thread thread;
  std::mt19937_64 rng{2026};
  table rows{csv, thread, rng, stream.get()};

  shape const shapes[] = {{"llama3.1-8b", models::llama31_8b, 1},
                          {"llama3.1-8b-tp8", models::llama31_8b, 8},
                          {"deepseek-v3-mla", models::deepseek_v3, 1}};
  std::vector<std::int64_t> contexts{8192};
  if (!quick) { contexts.push_back(65536); }

  std::printf("| model | page | context | dir | backend | GB/s | vs contiguous | caller CPU ms | process CPU ms |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (shape const& s : shapes) {
    for (std::int64_t page : {16, 32, 64}) {
      for (std::int64_t context : contexts) {
        kv_geometry const g = s.model.geometry(page, 2, s.tensor_parallel);
        std::int64_t const n = context / page;
        pinned_host_pool pool{g, n, {.chunk_bytes = n * g.page_bytes()}};  // one chunk: contiguous reference
        auto const host = pool.layout();
        device_buffer dev(static_cast<std::size_t>(2 * n * g.page_bytes()));
        layer_first const device{dev.data(), g, 2 * n};
        {  // non-zero data
          auto* w = reinterpret_cast<std::uint64_t*>(host.page_data(0));
          std::size_t const words = static_cast<std::size_t>(pool.bytes() / 8);
          for (std::size_t i = 0; i < words; ++i) {
            w[i] = i * 0x9E3779B97F4A7C15ull;
          }
        }
        std::vector<std::int64_t> slots(static_cast<std::size_t>(2 * n));
        std::iota(slots.begin(), slots.end(), 0);
        std::shuffle(slots.begin(), slots.end(), rng);
        std::vector<page_pair> load_map, backup_map;
        for (std::int64_t i = 0; i < n; ++i) {
          load_map.push_back({i, slots[static_cast<std::size_t>(i)]});
          backup_map.push_back({slots[static_cast<std::size_t>(i)], i});
        }
        copy_plan const load{host, device, std::span<page_pair const>{load_map}, layer_range::all(g)};
        copy_plan const backup{device, host, std::span<page_pair const>{backup_map}, layer_range::all(g)};
        std::int64_t const bytes = load.bytes();
        int const reps_here = context <= 8192 ? reps : std::min(reps, 3);
        double const ref_load = contiguous_gbps(dev.data(), host.page_data(0), bytes, reps_here, stream.get());
        double const ref_backup = contiguous_gbps(host.page_data(0), dev.data(), bytes, reps_here, stream.get());

        auto run = [&](char const* name, auto& backend, bool threaded, completion c) {
          rows.run(s.label, page, context, name, backend, threaded, c, load, backup, ref_load, ref_backup, reps_here);
        };
        std::printf("| %s | %lld | %lld | load / backup | contiguous cudaMemcpyAsync | %.1f / %.1f | 1 | | |\n",
                    s.label, (long long)page, (long long)context, ref_load, ref_backup);
        bool const full = context <= 8192;  // 64K contexts: the main contenders only
        dma_copy per_run;
        if (full) { run("dma_copy", per_run, false, completion::whole); }
        dma_batch batch{};  // 512 descriptors per call, ramping up from 32
        if (full) { run("dma_batch/512", batch, false, completion::whole); }
        run("dma_batch/512 (submit thread)", batch, true, completion::whole);
        dma_batch batch_all{{.descriptors_per_call = std::numeric_limits<std::size_t>::max()}};
        if (full) { run("dma_batch/all", batch_all, false, completion::whole); }
        for (int ctas : {1, 2, 4}) {
          if (!full && ctas != 2) { continue; }
          gpu_assisted k{{ctas, 1024}};
          std::string const name = "gpu_assisted/" + std::to_string(ctas);
          run(name.c_str(), k, false, completion::whole);
        }
        gpu_assisted per_layer{{2, 1024}};
        run("gpu_assisted/2 per-layer", per_layer, false, completion::per_layer);
        staged st;
        run("staged", st, false, completion::whole);
        // Pages in order on both sides (a prefix loaded into pages allocated in order): dma_batch
        // describes each layer and plane as one strided copy instead of one descriptor per block.
        std::vector<page_pair> in_order;
        for (std::int64_t i = 0; i < n; ++i) {
          in_order.push_back({i, i});
        }
        copy_plan const load_c{host, device, std::span<page_pair const>{in_order}, layer_range::all(g)};
        copy_plan const backup_c{device, host, std::span<page_pair const>{in_order}, layer_range::all(g)};
        auto run_c = [&](char const* name, auto& backend, bool threaded, completion c) {
          rows.run(s.label, page, context, name, backend, threaded, c, load_c, backup_c, ref_load, ref_backup,
                   reps_here);
        };
        dma_batch strided{};
        dma_batch plain{{.strided_runs = false}};
        run_c("dma_batch/512 (submit thread), pages in order, strided", strided, true, completion::whole);
        run_c("dma_batch/512 (submit thread), pages in order, not strided", plain, true, completion::whole);
        gpu_assisted k2{{2, 1024}};
        run_c("gpu_assisted/2, pages in order", k2, false, completion::whole);
      }
    }
  }

  // Small segments: 1-token pages (256-byte blocks of the TP8 shard) into a layer-first pool, and
  // 16-token pages into a head-major pool (Hugging Face's static cache): every block a transpose of
  // 256-byte head rows. 8K-token contexts, the main contenders.
  std::printf("\n| model | page | context | dir | backend | GB/s | vs contiguous | caller CPU ms | process CPU ms |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (bool const transpose : {false, true}) {
    std::int64_t const page = transpose ? 16 : 1;
    std::int64_t const context = 8192;
    kv_geometry const g = models::llama31_8b.geometry(page, 2, transpose ? 1 : 8);
    char const* label = transpose ? "llama3.1-8b to hf (head rows)" : "llama3.1-8b-tp8 (1-token pages)";
    std::int64_t const n = context / page;
    pinned_host_pool pool{g, n, {.chunk_bytes = n * g.page_bytes()}};
    auto const host = pool.layout();
    {
      auto* w = reinterpret_cast<std::uint64_t*>(host.page_data(0));
      std::size_t const words = static_cast<std::size_t>(pool.bytes() / 8);
      for (std::size_t i = 0; i < words; ++i) {
        w[i] = i * 0x9E3779B97F4A7C15ull + 1;
      }
    }
    std::vector<std::int64_t> slots(static_cast<std::size_t>(2 * n));
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    std::vector<page_pair> load_map, backup_map;
    for (std::int64_t i = 0; i < n; ++i) {
      load_map.push_back({i, slots[static_cast<std::size_t>(i)]});
      backup_map.push_back({slots[static_cast<std::size_t>(i)], i});
    }
    auto bench_device = [&](auto const& device, device_buffer const& dev) {
      copy_plan const load{host, device, std::span<page_pair const>{load_map}, layer_range::all(g)};
      copy_plan const backup{device, host, std::span<page_pair const>{backup_map}, layer_range::all(g)};
      std::int64_t const bytes = load.bytes();
      double const ref_load = contiguous_gbps(dev.data(), host.page_data(0), bytes, reps, stream.get());
      double const ref_backup = contiguous_gbps(host.page_data(0), dev.data(), bytes, reps, stream.get());
      std::printf("| %s | %lld | %lld | load / backup | contiguous cudaMemcpyAsync | %.1f / %.1f | 1 | | |\n", label,
                  (long long)page, (long long)context, ref_load, ref_backup);
      auto run = [&](char const* name, auto& backend, bool threaded, completion c) {
        rows.run(label, page, context, name, backend, threaded, c, load, backup, ref_load, ref_backup, reps);
      };
      dma_batch batch{};
      run("dma_batch/512 (submit thread)", batch, true, completion::whole);
      gpu_assisted k{{2, 1024}};
      run("gpu_assisted/2", k, false, completion::whole);
      run("gpu_assisted/2 per-layer", k, false, completion::per_layer);
      staged st;
      run("staged", st, false, completion::whole);
    };
    if (transpose) {
      std::int64_t const per_sequence = 16, capacity = per_sequence * page, batch = 2 * n / per_sequence;
      std::int64_t const tensor = batch * g.kv_heads * capacity * g.head_bytes();
      device_buffer dev(static_cast<std::size_t>(g.layers * g.planes * tensor));
      std::vector<std::byte*> keys, values;
      for (std::int64_t l = 0; l < g.layers; ++l) {
        keys.push_back(dev.data() + 2 * l * tensor);
        values.push_back(dev.data() + (2 * l + 1) * tensor);
      }
      bench_device(hf_layout{keys, values, g, batch, capacity}, dev);
    } else {
      device_buffer dev(static_cast<std::size_t>(2 * n * g.page_bytes()));
      bench_device(layer_first{dev.data(), g, 2 * n}, dev);
    }
  }

  // Descriptors per batch call, Llama-3.1-8B, 32-token pages, 8K context, and its TP8 shard.
  bench::report sweep{"batch_sweep.csv", "model,kv_heads,descriptors_per_call,GBps,vs_contiguous,caller_cpu_ms"};
  std::printf(
      "\n| model | descriptors per call | load GB/s | vs contiguous | caller CPU ms |\n|---|---|---|---|---|\n");
  for (std::int64_t tp : {1, 8}) {
    kv_geometry const g = models::llama31_8b.geometry(32, 2, tp);
    std::int64_t const n = 8192 / 32;
    pinned_host_pool pool{g, n, {.chunk_bytes = n * g.page_bytes()}};
    device_buffer dev(static_cast<std::size_t>(2 * n * g.page_bytes()));
    layer_first const device{dev.data(), g, 2 * n};
    std::vector<page_pair> map;
    for (std::int64_t i = 0; i < n; ++i) {
      map.push_back({i, 2 * n - 1 - 2 * i});
    }
    copy_plan const load{pool.layout(), device, std::span<page_pair const>{map}, layer_range::all(g)};
    double const ref = contiguous_gbps(dev.data(), pool.layout().page_data(0), load.bytes(), reps, stream.get());
    for (std::size_t per_call : {128, 256, 512, 1024, 2048, 4096, 16384}) {
      dma_batch b{{.descriptors_per_call = per_call}};
      measured const m = time_unchecked([&](cudaStream_t st) { return submit(b, load, st, completion::whole); },
                                        load.bytes(), reps, stream.get());
      std::printf("| %s | %zu | %.1f | %.3f | %.2f |\n", tp == 1 ? "llama3.1-8b" : "llama3.1-8b-tp8", per_call, m.gbps,
                  m.gbps / ref, m.caller_cpu_ms);
      std::ostringstream row;
      row << (tp == 1 ? "llama3.1-8b" : "llama3.1-8b-tp8") << "," << g.kv_heads << "," << per_call << "," << m.gbps
          << "," << m.gbps / ref << "," << m.caller_cpu_ms;
      sweep.row(row.str());
    }
  }
  if (!rows.all_ok) { std::printf("\nDATA MISMATCH: a backend moved wrong bytes (rows marked above)\n"); }
  return rows.all_ok ? 0 : 1;
}
