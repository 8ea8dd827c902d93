// SPDX-License-Identifier: Apache-2.0
/**
 * @file cache/detail/gpu_executor_state.cuh
 * @brief The machinery behind `gpu_executor` (cache/gpu_executor.cuh): its CUDA parts (streams,
 *        backends, submit and record threads) and its state (settings, the cost-based backend
 *        choice with the observed DMA descriptor cost, counters).
 */
#pragma once

#include <strata/cache/detail/gpu_records.cuh>
#include <strata/cache/detail/record_io.hpp>
#include <strata/cache/executor.hpp>
#include <strata/cache/gpu_executor_config.cuh>
#include <strata/cuda.cuh>
#include <strata/transfer/backend.cuh>
#include <strata/transfer/choice.hpp>
#include <strata/transfer/copy_plan.hpp>
#include <strata/transfer/dma_batch.cuh>
#include <strata/transfer/gpu_assisted.cuh>
#include <strata/transfer/staged.cuh>
#include <strata/transfer/submit_thread.cuh>

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

namespace strata::detail {

/// Bytes of the longest run a block of `plan` moves as one piece (what a DMA descriptor carries).
template <kv_layout Src, kv_layout Dst>
double run_bytes(copy_plan<Src, Dst> const& plan)
{
  kv_geometry const g = plan.src.geometry();
  block_ref const s = plan.src.block(plan.pages[0].src, plan.layers.begin, 0);
  block_ref const d = plan.dst.block(plan.pages[0].dst, plan.layers.begin, 0);
  if (s.contiguous(g) && d.contiguous(g)) { return double(g.block_bytes()); }
  if (s.token_stride == g.head_bytes() && d.token_stride == g.head_bytes()) {
    return double(g.page_tokens * g.head_bytes());
  }
  return double(g.head_bytes());
}

/// The CUDA side of a `gpu_executor` (streams, backends, submit and record threads), made on its
/// device at first use.
struct gpu_cuda_parts {
  explicit gpu_cuda_parts(gpu_executor_config const& c)
      : load{c.load_kernel, c.dma, c.staged}, copy{c.copy_kernel, c.dma, c.staged}, direct{c.dma}
  {
    STRATA_CUDA_TRY(cudaGetDevice(&device));
    int low = 0, high = 0;
    STRATA_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&low, &high));
    if (!c.load_stream) { own_load.emplace(high); }
    if (!c.copy_stream) { own_copy.emplace(low); }
    load_stream = own_load ? own_load->get() : c.load_stream->get();
    copy_stream = own_copy ? own_copy->get() : c.copy_stream->get();
    if (c.dma_submit_thread) { thread.emplace(device); }
  }
  gpu_cuda_parts(gpu_cuda_parts const&) = delete;
  gpu_cuda_parts& operator=(gpu_cuda_parts const&) = delete;
  ~gpu_cuda_parts()
  {
    // What the executor issued must land before its pools may go (members then wait for the rest).
    if (thread) { thread->drain(); }
    for (auto const& h : threaded) {
      if (h.valid() && !h.failed()) {
        try {
          h.synchronize();
        } catch (...) {
        }
      }
    }
    if (cudaStreamSynchronize(load_stream) != cudaSuccess) { (void)cudaGetLastError(); }
    if (cudaStreamSynchronize(copy_stream) != cudaSuccess) { (void)cudaGetLastError(); }
  }

  int device = 0;  // where the streams, backends and their memory live
  std::optional<cuda_stream> own_load, own_copy;
  cudaStream_t load_stream{}, copy_stream{};
  cuda_event order;
  gpu_backend_set load;  // used for loads only, so several loads and copies are in flight independently
  gpu_backend_set copy;
  dma_batch direct;                         // dma_batch on the calling thread (no submit thread, or several directions)
  std::optional<submit_thread> thread;      // destroyed first: it finishes enqueueing into `load`/`copy`
  std::array<transfer_handle, 2> threaded;  // the submit thread's last transfer of each kind
  std::mutex threaded_mutex;                // `synchronize` reads `threaded` from any thread
  // Records to and from the device: loads, background copies (started at first use; the state
  // waits for their jobs before these go).
  std::array<std::unique_ptr<gpu_record_thread>, 2> records;
};

/// A `gpu_executor`'s state (it holds it by pointer, so that it moves): settings, the backend
/// choice, counters and the CUDA parts.
struct gpu_executor_state {
  explicit gpu_executor_state(gpu_executor_config c) : config{std::move(c)} {}
  gpu_executor_state(gpu_executor_state const&) = delete;
  gpu_executor_state& operator=(gpu_executor_state const&) = delete;
  ~gpu_executor_state()
  {
    records.wait_all();  // the stores' and record threads write into the tiers' memory
    if (!cuda) { return; }
    try {
      device_scope const on{device};  // streams, events and buffers go on their own device
      cuda.reset();
    } catch (...) {
      cuda.reset();
    }
  }
  // Called with the executor's device current.
  gpu_cuda_parts& parts()
  {
    std::call_once(cuda_made, [this] {
      gpu_executor_config c = config;
      c.dma = dma_config();
      cuda = std::make_unique<gpu_cuda_parts>(c);
    });
    return *cuda;
  }
  // The `dma_batch` tuning its instances get: their enqueue times feed `dma_cost`.
  dma_batch_config dma_config()
  {
    dma_batch_config c = config.dma;
    c.on_enqueue = [this, theirs = config.dma.on_enqueue](std::int64_t descriptors, double host_us) {
      dma_cost.observe(descriptors, host_us);
      if (theirs) { theirs(descriptors, host_us); }
    };
    return c;
  }
  // After a choice that was not forced: a choice of another backend than DMA relaxes its observed cost.
  void chose(gpu_backend b) const
  {
    if (b != gpu_backend::dma_batch) { dma_cost.relax(); }
  }
  // Bytes one `dma_batch` descriptor of `plan` moves: a run, or, with strided copies of whole
  // blocks, the blocks of a stretch of consecutive page pairs (both sides +1: one strided copy per
  // layer and plane, in the plan's order for a load, in the device's for a backup). Runs shorter
  // than a block (a transpose, heads apart) and stretches too short to halve the descriptors
  // count as plain runs.
  template <kv_layout Src, kv_layout Dst>
  double descriptor_bytes(copy_plan<Src, Dst> const& plan) const
  {
    double const run = run_bytes(plan);
    if (!config.dma.strided_runs || !config.dma.use_batch_api || !dma_batch::strided_api_available() ||
        plan.pages.empty() || run < double(plan.src.geometry().block_bytes())) {
      return run;
    }
    std::size_t stretches = 1;
    for (std::size_t i = 1; i < plan.pages.size(); ++i) {
      page_pair const a = plan.pages[i - 1], b = plan.pages[i];
      stretches += b.src == a.src + 1 && b.dst == a.dst + 1 ? 0 : 1;
    }
    double const per = double(plan.pages.size()) / double(stretches);
    return per >= 2 ? run * per : run;
  }
  // The executor's device; throws when there was none at construction (no GPU).
  int bound() const
  {
    if (device < 0) {
      int count = 0;
      if (cudaGetDeviceCount(&count) != cudaSuccess) { (void)cudaGetLastError(); }
      STRATA_EXPECTS(false, "gpu_executor: no CUDA device was current when it was constructed (", count, " visible)");
    }
    return device;
  }

  gpu_backend choose(copy_kind kind, double bytes, double block_bytes, bool records) const
  {
    auto const& table = kind == copy_kind::load ? config.load_options : config.copy_options;
    gpu_activity const a = activity.load(std::memory_order_relaxed);
    std::vector<transfer_option> candidates;
    std::vector<gpu_backend> which;
    for (std::size_t b = 0; b < gpu_backend_count; ++b) {
      auto const backend = gpu_backend(b);
      if (backend == gpu_backend::staged && (!records || (kind == copy_kind::load && !config.staged_loads))) {
        continue;
      }
      transfer_option o = table[b];
      if (backend == gpu_backend::dma_batch) {
        double const us = dma_cost.us();              // as observed: more beside a launch-heavy engine
        double const cap = block_bytes / (us * 1e3);  // GB/s at one descriptor per run
        for (auto& g : o.gbps) {
          g = std::min(g, cap);
        }
        if (!config.dma_submit_thread) { o.caller_cpu_ms_per_gib = double(1 << 30) / block_bytes * us * 1e-3; }
      }
      candidates.push_back(std::move(o));
      which.push_back(backend);
    }
    transfer_situation sit;
    sit.activity = a;
    sit.bytes = bytes;
    sit.cpu_weight = config.cpu_weight;
    sit.compute_ms = compute_ms.load(std::memory_order_relaxed);
    if (a != gpu_activity::idle && sit.compute_ms == 0) {  // unknown: as long as the fastest transfer
      double best = 0;
      for (auto const& o : candidates) {
        best = std::max(best, o.gbps[std::size_t(a)]);
      }
      sit.compute_ms = best > 0 ? bytes / (best * 1e9) * 1e3 : 0;
    }
    return which[choose_transfer(candidates, sit)];
  }

  gpu_executor_config config;
  // What a DMA descriptor costs its enqueuing thread, as observed (starts at the configured figure).
  mutable descriptor_cost dma_cost{config.dma_descriptor_us > 0 ? config.dma_descriptor_us : 1};
  int device = -1;  // set once, at construction
  std::atomic<gpu_activity> activity{gpu_activity::idle};
  std::atomic<double> compute_ms{0};
  std::array<std::array<std::atomic<std::int64_t>, gpu_backend_count>, 2> transfers{};
  std::array<std::array<std::atomic<std::int64_t>, gpu_backend_count>, 2> bytes{};
  std::atomic<std::int64_t> failed{0};
  record_io_log records;  // record I/O not yet seen finished
  std::unique_ptr<gpu_cuda_parts> cuda;
  std::once_flag cuda_made;  // `parts` makes `cuda` once, whichever thread asks first
  std::mutex serial;         // `submit` and `warm_up`: never side by side (backends, tables)
};

}  // namespace strata::detail
