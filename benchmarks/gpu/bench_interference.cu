// SPDX-License-Identifier: Apache-2.0
// What loads cost the kernels beside them, and whether choose_transfer picks well.
//
// Workloads (each captured in a CUDA graph, as engines launch decode): a Llama-3.1-8B-shaped prefill (per layer the
// QKV, output, gate/up and down GEMMs in bf16 through cuBLAS, 4,096 new tokens, 32 layers) and decode step (the same
// GEMMs for 64 tokens). Loads: an 8K-token context (32-token pages) from the pinned pool into a layer-first pool at
// random slots, 8 KV heads (1 GiB) and 1 KV head (TP8 shard, 128 MiB), streamed back to back.
//
// Part 1 (interference): for each way of loading, the workload's time alone and with loads
// streaming beside it (median of reps, interleaved), and the loads' bandwidth meanwhile. The
// "green contexts" options run the GEMMs in an `sm_partition`'s compute partition and the copies in
// its 2-SM copy partition; "alone" is always the GEMMs on the whole device.
// Part 2 (choice): scenarios (idle, one prefill pass, 20 decode steps, each started together with
// one context load); every option's measured makespan, and the option choose_transfer picks from
// Part 1's measurements, against the best fixed option.
//
//   bench_interference [--quick]      writes interference.csv and choice.csv to $OUT
#include "gpu_bench.cuh"

#include <strata/tier/pinned_host_pool.cuh>
#include <strata/transfer/choice.hpp>
#include <strata/transfer/dma_batch.cuh>
#include <strata/transfer/gpu_assisted.cuh>
#include <strata/transfer/sm_partition.cuh>
#include <strata/transfer/split.cuh>
#include <strata/transfer/staged.cuh>
#include <strata/transfer/submit_thread.cuh>

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <tuple>

using namespace strata;

namespace {

#define BENCH_CUBLAS(call)                                                                                    \
  do {                                                                                                        \
    cublasStatus_t const s_ = (call);                                                                         \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                        \
      throw cuda_error(std::string{"cuBLAS call " #call " failed: "} + std::to_string(static_cast<int>(s_))); \
    }                                                                                                         \
  } while (0)

__global__ void fill_bf16(__nv_bfloat16* p, std::size_t n, std::uint32_t seed)
{
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    std::uint32_t x = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    p[i] = __float2bfloat16((static_cast<float>(x & 0xffff) / 65536.0f - 0.5f) * 0.05f);
  }
}

__global__ void sleep_kernel(unsigned ns)
{
  for (unsigned t = 0; t < ns; t += 1000) {
    __nanosleep(1000);
  }
}

/// Llama-3.1-8B's per-layer GEMMs for `tokens` new tokens, 32 layers, one weight set reused.
class llama_gemms {
 public:
  explicit llama_gemms(int tokens) : m_{tokens}
  {
    BENCH_CUBLAS(cublasCreate(&handle_));
    workspace_ = device_buffer(std::size_t{32} << 20);  // explicit: graph capture needs it
    BENCH_CUBLAS(cublasSetWorkspace(handle_, workspace_.data(), workspace_.size()));
    auto make = [](std::size_t elems, std::uint32_t seed) {
      device_buffer b(elems * 2);
      fill_bf16<<<1024, 256>>>(reinterpret_cast<__nv_bfloat16*>(b.data()), elems, seed);
      return b;
    };
    x_ = make(std::size_t(m_) * 4096, 1);
    h_ = make(std::size_t(m_) * 14336, 2);
    y_ = make(std::size_t(m_) * 28672, 3);
    w_qkv_ = make(std::size_t(4096) * 6144, 4);
    w_o_ = make(std::size_t(4096) * 4096, 5);
    w_gu_ = make(std::size_t(4096) * 28672, 6);
    w_d_ = make(std::size_t(14336) * 4096, 7);
    STRATA_CUDA_TRY(cudaDeviceSynchronize());
  }
  ~llama_gemms()
  {
    for (auto& [key, exec] : graphs_) {
      cudaGraphExecDestroy(exec);
    }
    cublasDestroy(handle_);
  }
  llama_gemms(llama_gemms const&) = delete;
  llama_gemms& operator=(llama_gemms const&) = delete;

  /// 0 resets to every SM.
  void set_sm_target(int sms) { BENCH_CUBLAS(cublasSetSmCountTarget(handle_, sms)); }

  /// Captures `passes` (with cuBLAS told to use `sm_target` SMs, 0: all) into a CUDA graph, as
  /// engines run decode: one launch, so the CPU never blocks on a full launch queue.
  void prepare(int passes, int sm_target, cudaStream_t s)
  {
    if (graphs_.count({passes, sm_target, s}) != 0) { return; }
    set_sm_target(sm_target);
    cudaGraph_t graph{};
    STRATA_CUDA_TRY(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    enqueue(s, passes);
    STRATA_CUDA_TRY(cudaStreamEndCapture(s, &graph));
    cudaGraphExec_t exec{};
    STRATA_CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
    STRATA_CUDA_TRY(cudaGraphDestroy(graph));
    graphs_[{passes, sm_target, s}] = exec;  // per stream: a green context's stream gets its own
    set_sm_target(0);
  }

  /// Launches the prepared graph.
  void run(cudaStream_t s, int passes, int sm_target = 0)
  {
    prepare(passes, sm_target, s);
    STRATA_CUDA_TRY(cudaGraphLaunch(graphs_.at({passes, sm_target, s}), s));
  }

 private:
  void enqueue(cudaStream_t s, int passes)
  {
    BENCH_CUBLAS(cublasSetStream(handle_, s));
    for (int p = 0; p < passes; ++p) {
      for (int layer = 0; layer < 32; ++layer) {
        gemm(w_qkv_, x_, y_, 6144, 4096);
        gemm(w_o_, x_, y_, 4096, 4096);
        gemm(w_gu_, x_, y_, 28672, 4096);
        gemm(w_d_, h_, y_, 4096, 14336);
      }
    }
  }

  // Y (n x m) = W (n x k) * X (k x m), column-major, bf16 in and out, fp32 accumulation.
  void gemm(device_buffer const& w, device_buffer const& x, device_buffer& y, int n, int k)
  {
    float const alpha = 1, beta = 0;
    BENCH_CUBLAS(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, n, m_, k, &alpha, w.data(), CUDA_R_16BF, n, x.data(),
                              CUDA_R_16BF, k, &beta, y.data(), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
  }

  int m_;
  cublasHandle_t handle_{};
  device_buffer workspace_;
  std::map<std::tuple<int, int, cudaStream_t>, cudaGraphExec_t> graphs_;
  device_buffer x_, h_, y_, w_qkv_, w_o_, w_gu_, w_d_;
};

using load_plan = copy_plan<page_first_chunked, layer_first>;

/// A way of loading, with what it needs around the compute.
struct option {
  std::string name;
  std::function<transfer_handle(load_plan const&, cudaStream_t)> submit;
  int sm_target = 0;                        // cuBLAS SM count target while it runs beside compute (0: all SMs)
  sm_partition const* partition = nullptr;  // green contexts: compute and loads on its streams
};

struct workload {
  char const* name;
  llama_gemms* gemms;
  int passes;  // passes per timed unit in Part 1
  gpu_activity activity;
};

/// A green-context option runs compute and loads on its partition's streams.
void use_partition_streams(option const& o, cudaStream_t& compute, cudaStream_t& load_stream)
{
  if (o.partition != nullptr) { compute = o.partition->compute_stream(), load_stream = o.partition->copy_stream(); }
}

/// Idles the GPU for a fixed time so that every timed run starts from the same clock and power state
/// (a GEMM run right after another is slower: the board's power limit).
void settle()
{
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
}

double time_compute(workload const& w, cudaStream_t s, int passes)
{
  w.gemms->prepare(passes, 0, s);
  settle();
  cuda_event a{true}, b{true};
  a.record(s);
  w.gemms->run(s, passes);
  b.record(s);
  STRATA_CUDA_TRY(cudaEventSynchronize(b.get()));
  return bench::elapsed_ms(a.get(), b.get());
}

/// `passes` of the workload with loads streamed beside it for as long as it runs (at most two loads
/// queued ahead): (compute ms, load GB/s over the loads that completed inside the compute window).
std::pair<double, double> with_loads(workload const& w, option const& o, load_plan const& plan, cudaStream_t gate,
                                     cudaStream_t compute, cudaStream_t load_stream)
{
  use_partition_streams(o, compute, load_stream);
  w.gemms->prepare(w.passes, o.sm_target, compute);
  settle();
  cuda_event go{true}, a{true}, b{true};
  sleep_kernel<<<1, 1, 0, gate>>>(2'000'000);  // 2 ms to submit the first loads
  go.record(gate);
  STRATA_CUDA_TRY(cudaStreamWaitEvent(compute, go.get(), 0));
  STRATA_CUDA_TRY(cudaStreamWaitEvent(load_stream, go.get(), 0));
  a.record(compute);
  w.gemms->run(compute, w.passes, o.sm_target);
  b.record(compute);
  std::vector<cuda_event> done;
  while (cudaEventQuery(b.get()) == cudaErrorNotReady) {
    o.submit(plan, load_stream).wait(load_stream);
    done.emplace_back(true);
    done.back().record(load_stream);
    if (done.size() > 2) { STRATA_CUDA_TRY(cudaEventSynchronize(done[done.size() - 3].get())); }
  }
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  double const window = bench::elapsed_ms(a.get(), b.get());
  std::vector<double> t;
  for (auto& e : done) {
    double const at = bench::elapsed_ms(a.get(), e.get());
    if (at > 0 && at <= window) { t.push_back(at); }
  }
  double gbps = 0;
  if (t.size() >= 2) { gbps = double(plan.bytes()) * double(t.size() - 1) / ((t.back() - t.front()) * 1e-3) / 1e9; }
  return {window, gbps};
}

/// One load and one unit of compute started together: time until both are done.
double makespan(option const& o, load_plan const& plan, workload const* w, int passes, cudaStream_t gate,
                cudaStream_t compute, cudaStream_t load_stream)
{
  use_partition_streams(o, compute, load_stream);
  if (w != nullptr) { w->gemms->prepare(passes, o.sm_target, compute); }
  settle();
  cuda_event go{true}, load_end{true}, compute_end{true};
  sleep_kernel<<<1, 1, 0, gate>>>(3'000'000);  // 3 ms for the CPU to enqueue everything
  go.record(gate);
  STRATA_CUDA_TRY(cudaStreamWaitEvent(load_stream, go.get(), 0));
  STRATA_CUDA_TRY(cudaStreamWaitEvent(compute, go.get(), 0));
  if (w != nullptr) { w->gemms->run(compute, passes, o.sm_target); }
  compute_end.record(compute);
  o.submit(plan, load_stream).wait(load_stream);
  load_end.record(load_stream);
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  return std::max(bench::elapsed_ms(go.get(), load_end.get()), bench::elapsed_ms(go.get(), compute_end.get()));
}

}  // namespace

int main(int argc, char** argv)
{
  bool const quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  int const reps = quick ? 2 : 3;
  STRATA_CUDA_TRY(cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync));
  int const sms = sm_count();
  cudaDeviceProp prop{};
  STRATA_CUDA_TRY(cudaGetDeviceProperties(&prop, 0));
  std::printf("# bench_interference on %s (%d SMs), %d repetitions, median\n", prop.name, sms, reps);

  // Loads at the higher priority: their few CTAs are placed first and keep their SMs, the GEMMs
  // take the rest (a load feeding the next prefill is on the critical path).
  int low = 0, high = 0;
  STRATA_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&low, &high));
  cuda_stream compute{low}, load_stream{high}, gate;
  std::optional<sm_partition> partition;
  if (sm_partition::supported()) { partition.emplace(2, -1, high, low); }
  submit_thread thread;
  llama_gemms prefill_gemms{4096}, decode_gemms{64};
  workload const prefill{"prefill", &prefill_gemms, 2, gpu_activity::prefill};
  workload const decode{"decode", &decode_gemms, 40, gpu_activity::decode};
  bench::report csv{"interference.csv",
                    "kv_heads,workload,option,compute_ms_alone,compute_ms_with,slowdown,load_GBps,load_vs_contiguous"};
  bench::report choice_csv{"choice.csv", "kv_heads,scenario,option,measured_ms,predicted_ms,chosen,best"};
  std::mt19937_64 rng{7};

  std::printf(
      "| KV heads | workload | option | alone ms | with loads ms | slowdown | load GB/s beside | vs contiguous |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (std::int64_t tp : {1, 8}) {
    kv_geometry const g = models::llama31_8b.geometry(32, 2, tp);
    std::int64_t const n = 8192 / 32;
    pinned_host_pool pool{g, n};
    auto const host = pool.layout();
    for (std::int64_t p = 0; p < n; ++p) {
      std::memset(host.page_data(p), int(p % 251) + 1, std::size_t(g.page_bytes()));
    }
    device_buffer dev(std::size_t(2 * n * g.page_bytes()));
    layer_first const device{dev.data(), g, 2 * n};
    std::vector<std::int64_t> slots(std::size_t(2 * n));
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    std::vector<page_pair> map;
    for (std::int64_t i = 0; i < n; ++i) {
      map.push_back({i, slots[std::size_t(i)]});
    }
    load_plan const plan{host, device, std::span<page_pair const>{map}, layer_range::all(g)};

    // The options. Backends live as long as the options.
    std::vector<std::shared_ptr<void>> keep;
    std::vector<option> options;
    auto add_kernel = [&](std::string name, gpu_assisted_config c, int sm_target = 0) {
      auto b = std::make_shared<gpu_assisted>(c);
      keep.push_back(b);
      options.push_back({std::move(name),
                         [b](load_plan const& p, cudaStream_t s) { return submit(*b, p, s, completion::whole); },
                         sm_target});
    };
    add_kernel("gpu_assisted/1", {1, 1024});
    add_kernel("gpu_assisted/2", {2, 1024});
    add_kernel("gpu_assisted/4", {4, 1024});
    add_kernel("gpu_assisted/1 x256 threads", {1, 256});
    add_kernel("gpu_assisted/2 x256 threads", {2, 256});
    add_kernel("gpu_assisted/2 + SM target", {2, 1024}, sms - 2);
    if (partition) {  // green contexts: the copies on 2 SMs of their own, the GEMMs on the rest
      for (int target : {0, partition->compute_sms()}) {
        auto b = std::make_shared<gpu_assisted>(gpu_assisted_config{2, 1024});
        keep.push_back(b);
        options.push_back(
            {target == 0 ? "gpu_assisted/2, green contexts" : "gpu_assisted/2, green contexts + SM target",
             [b](load_plan const& p, cudaStream_t s) { return submit(*b, p, s, completion::whole); }, target,
             &*partition});
      }
    }
    {
      auto b = std::make_shared<dma_batch>(dma_batch_config{});
      keep.push_back(b);
      options.push_back({"dma_batch (submit thread)", [b, &thread](load_plan const& p, cudaStream_t s) {
                           return thread.submit(*b, p, s, completion::whole);
                         }});
    }
    {
      auto b = std::make_shared<staged>();
      keep.push_back(b);
      options.push_back(
          {"staged", [b](load_plan const& p, cudaStream_t s) { return submit(*b, p, s, completion::whole); }});
    }
    if (partition) {  // green contexts: the relays run in the copy partition (the caller's stream's context)
      for (int target : {0, partition->compute_sms()}) {  // and the GEMMs sized to the SMs left, or not
        auto b = std::make_shared<staged>();
        keep.push_back(b);
        options.push_back({target == 0 ? "staged, green contexts" : "staged, green contexts + SM target",
                           [b](load_plan const& p, cudaStream_t s) { return submit(*b, p, s, completion::whole); },
                           target, &*partition});
      }
    }
    for (double f : {0.25, 0.5, 0.75}) {
      auto b = std::make_shared<split>(split_config{.dma_fraction = f});
      keep.push_back(b);
      options.push_back({"split/" + std::to_string(f).substr(0, 4),
                         [b](load_plan const& p, cudaStream_t s) { return submit(*b, p, s, completion::whole); }});
    }

    // The reference: one contiguous copy of the same bytes (the pool is one chunk), GPU otherwise idle.
    double contiguous = 0;
    {
      std::vector<double> v;
      for (int r = -1; r < reps; ++r) {
        cuda_event a{true}, b{true};
        a.record(load_stream.get());
        STRATA_CUDA_TRY(cudaMemcpyAsync(dev.data(), host.page_data(0), std::size_t(plan.bytes()), cudaMemcpyDefault,
                                        load_stream.get()));
        b.record(load_stream.get());
        STRATA_CUDA_TRY(cudaEventSynchronize(b.get()));
        if (r >= 0) { v.push_back(double(plan.bytes()) / (bench::elapsed_ms(a.get(), b.get()) * 1e-3) / 1e9); }
      }
      contiguous = bench::median(v);
      std::printf("| %lld | (reference) | contiguous cudaMemcpyAsync, GPU idle | | | | %.1f | 1.000 |\n",
                  (long long)g.kv_heads, contiguous);
    }

    // Part 1: bandwidth alone and CPU cost, then interference.
    std::vector<transfer_option> profile(options.size());
    std::vector<double> load_ms_alone(options.size());
    for (std::size_t i = 0; i < options.size(); ++i) {
      std::vector<double> ms, cpu;
      for (int r = -1; r < reps; ++r) {
        cuda_event a{true}, b{true};
        a.record(load_stream.get());
        double const c0 = bench::thread_cpu_seconds();
        auto const h = options[i].submit(plan, load_stream.get());
        double const c1 = bench::thread_cpu_seconds();
        h.wait(load_stream.get());
        b.record(load_stream.get());
        STRATA_CUDA_TRY(cudaEventSynchronize(b.get()));
        if (r >= 0) {
          ms.push_back(bench::elapsed_ms(a.get(), b.get()));
          cpu.push_back((c1 - c0) * 1e3);
        }
      }
      load_ms_alone[i] = bench::median(ms);
      profile[i].name = options[i].name;
      profile[i].gbps[0] = double(plan.bytes()) / (load_ms_alone[i] * 1e-3) / 1e9;
      profile[i].caller_cpu_ms_per_gib = bench::median(cpu) / (double(plan.bytes()) / double(1 << 30));
    }
    for (workload const* w : {&prefill, &decode}) {
      for (std::size_t i = 0; i < options.size(); ++i) {
        option const& o = options[i];
        std::vector<double> alone, with, gbps;
        for (int r = -1; r < reps; ++r) {
          double const base = time_compute(*w, compute.get(), w->passes);  // all SMs, the reference
          auto const [c, bw] = with_loads(*w, o, plan, gate.get(), compute.get(), load_stream.get());
          if (r < 0) { continue; }
          alone.push_back(base);
          with.push_back(c);
          gbps.push_back(bw);
        }
        double const ma = bench::median(alone), mw = bench::median(with), mg = bench::median(gbps);
        auto const act = static_cast<std::size_t>(w->activity);
        profile[i].slowdown[act] = std::max(0.0, mw / ma - 1);
        profile[i].gbps[act] = mg > 0 ? mg : profile[i].gbps[0];
        std::printf("| %lld | %s | %s | %.2f | %.2f | %+.1f%% | %.1f | %.3f |\n", (long long)g.kv_heads, w->name,
                    o.name.c_str(), ma, mw, 100 * (mw / ma - 1), mg, mg / contiguous);
        std::ostringstream row;
        row << g.kv_heads << "," << w->name << "," << o.name << "," << ma << "," << mw << "," << (mw / ma - 1) << ","
            << mg << "," << mg / contiguous;
        csv.row(row.str());
      }
    }

    // Part 2: scenarios, every option measured, the choice checked against the best.
    struct scenario {
      char const* name;
      workload const* w;
      int passes;
    };
    scenario const scenarios[] = {{"idle", nullptr, 0}, {"prefill x1", &prefill, 1}, {"decode x20", &decode, 20}};
    for (auto const& sc : scenarios) {
      double compute_alone = 0;
      if (sc.w != nullptr) {
        std::vector<double> v;
        for (int r = 0; r < reps; ++r) {
          v.push_back(time_compute(*sc.w, compute.get(), sc.passes));
        }
        compute_alone = bench::median(v);
      }
      transfer_situation const situation{sc.w == nullptr ? gpu_activity::idle : sc.w->activity, double(plan.bytes()),
                                         compute_alone, 1};
      std::size_t const chosen = choose_transfer(profile, situation);
      std::vector<double> measured(options.size());
      for (std::size_t i = 0; i < options.size(); ++i) {
        std::vector<double> v;
        for (int r = -1; r < reps; ++r) {
          double const m = makespan(options[i], plan, sc.w, sc.passes, gate.get(), compute.get(), load_stream.get());
          if (r >= 0) { v.push_back(m); }
        }
        measured[i] = bench::median(v);
      }
      std::size_t const best = std::size_t(std::min_element(measured.begin(), measured.end()) - measured.begin());
      std::printf(
          "\n%lld KV heads, %s (compute alone %.2f ms): chose %s, %.2f ms; best fixed %s, %.2f ms; ratio %.3f\n",
          (long long)g.kv_heads, sc.name, compute_alone, options[chosen].name.c_str(), measured[chosen],
          options[best].name.c_str(), measured[best], measured[chosen] / measured[best]);
      for (std::size_t i = 0; i < options.size(); ++i) {
        std::ostringstream row;
        row << g.kv_heads << "," << sc.name << "," << options[i].name << "," << measured[i] << ","
            << predict(profile[i], situation).makespan_ms << "," << (i == chosen) << "," << (i == best);
        choice_csv.row(row.str());
      }
    }
    std::printf("\n");
  }
  return 0;
}
