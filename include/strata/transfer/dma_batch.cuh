// SPDX-License-Identifier: Apache-2.0
/**
 * @file transfer/dma_batch.cuh
 * @brief The copy engine through `cudaMemcpyBatchAsync`: many runs per call, resolved at run time
 *        for the CUDA 12.8–12.9 and the CUDA 13 signatures, with `cudaMemcpyAsync` as fallback.
 */
#pragma once

#include <strata/transfer/backend.cuh>

#include <cuda/stream_ref>

#include <cuda.h>  // CUmemcpyAttributes: the driver entry point is resolved at run time, not linked

#include <atomic>
#include <chrono>
#include <functional>
#include <span>
#include <vector>

namespace strata {

/// @brief Tuning of `dma_batch`.
struct dma_batch_config {
  /// Most descriptors per `cudaMemcpyBatchAsync` call; longer lists are submitted in chunks. On the
  /// H200, 256–512 per call loaded 64 KiB blocks fastest (53.7–53.9 GB/s, 97% of one contiguous
  /// copy); 16K per call fell to 42.5 GB/s.
  std::size_t descriptors_per_call = 512;
  /// Descriptors in the first call, doubling per call up to `descriptors_per_call`: the copy engine
  /// starts after a few microseconds of submission instead of a whole chunk's (~0.5 µs each).
  std::size_t first_call_descriptors = 32;
  /// Ask the driver to prefer overlapping the copies with compute (`CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE`).
  bool prefer_overlap_with_compute = false;
  /// Use `cuMemcpyBatchAsync` where the driver has it; false submits one `cudaMemcpyAsync` per run
  /// (the fallback, also taken when the driver lacks the batch API and on the legacy stream 0).
  bool use_batch_api = true;
  /// Gather runs of equal length that advance by fixed strides on both sides (a block of each of
  /// consecutive pages: page-first records on one side, one layer's tensor on the other) into one
  /// strided copy each, submitted with `cuMemcpy3DBatchAsync` (CUDA 13 drivers) when that at least
  /// halves the descriptors: a 32K-token Llama-3.1-8B load on consecutive pages is 64 copies instead
  /// of 65,536, and the copy engine no longer waits for the host to describe it. Runs are visited
  /// layer by layer (also a backup's into page-first records) unless both sides are page-first,
  /// and a strided copy stays inside one (layer, plane) block (each may be its own allocation).
  /// Needs `use_batch_api`; once the driver refuses a strided batch, every instance of the process
  /// sends plain batches.
  bool strided_runs = true;
  /// Told, after each batch of plain descriptors (one run each: not the strided copies, which cost
  /// more each but carry a whole stretch) is described, how many it took and the enqueuing thread's
  /// time for them in µs (the executor's observed descriptor cost).
  std::function<void(std::int64_t descriptors, double host_us)> on_enqueue{};
};

namespace detail {

/// @brief `cuMemcpyBatchAsync` as the running driver offers it.
struct batch_entry_points {
  using v13_fn = CUresult (*)(CUdeviceptr*, CUdeviceptr*, std::size_t*, std::size_t, CUmemcpyAttributes*, std::size_t*,
                              std::size_t, CUstream);
  using v128_fn = CUresult (*)(CUdeviceptr*, CUdeviceptr*, std::size_t*, std::size_t, CUmemcpyAttributes*, std::size_t*,
                               std::size_t, std::size_t*, CUstream);
  using strided_fn = CUresult (*)(std::size_t, CUDA_MEMCPY3D_BATCH_OP*, unsigned long long, CUstream);
  v13_fn v13{};          ///< CUDA 13 signature (no failIdx)
  v128_fn v128{};        ///< CUDA 12.8–12.9 signature (with failIdx)
  strided_fn strided{};  ///< `cuMemcpy3DBatchAsync`, CUDA 13 signature
  int driver_version{};

  [[nodiscard]] bool available() const noexcept { return v13 != nullptr || v128 != nullptr; }

  /// @brief Resolves the entry point once per process.
  static batch_entry_points const& get()
  {
    static batch_entry_points const points = [] {
      batch_entry_points p;
      if (cudaDriverGetVersion(&p.driver_version) != cudaSuccess) {
        (void)cudaGetLastError();
        return p;
      }
      if (void* fn = p.driver_version >= 13000 ? detail::driver_entry_point("cuMemcpyBatchAsync", 13000) : nullptr) {
        p.v13 = reinterpret_cast<v13_fn>(fn);
        p.strided = reinterpret_cast<strided_fn>(detail::driver_entry_point("cuMemcpy3DBatchAsync", 13000));
      } else if (void* f =
                     p.driver_version >= 12080 ? detail::driver_entry_point("cuMemcpyBatchAsync", 12080) : nullptr) {
        p.v128 = reinterpret_cast<v128_fn>(f);
      }
      return p;
    }();
    return points;
  }
};

/// @brief Set once a driver refused a strided batch: no `dma_batch` of the process tries again.
inline std::atomic<bool>& strided_refused() noexcept
{
  static std::atomic<bool> refused{false};
  return refused;
}

}  // namespace detail

/**
 * @brief Many runs per `cudaMemcpyBatchAsync` call, or per `cuMemcpy3DBatchAsync` call as strided
 *        copies where runs continue fixed strides on both sides (`dma_batch_config::strided_runs`).
 *
 * Near the link's limit on large blocks, but each descriptor holds the calling thread about half a
 * microsecond (measured on the H200): submit from a `submit_thread` so the engine's thread never
 * blocks. Source access order is "stream": a copy never reads its source before earlier work on
 * the stream (a compute kernel still writing a page being backed up) has finished.
 *
 * On the legacy default stream (stream 0, PyTorch's default stream) the batch API is refused by the
 * driver, so there every run goes through its own `cudaMemcpyAsync` (the fallback), at that
 * fallback's CPU cost; use a created stream for the batch path.
 */
class dma_batch {
 public:
  static constexpr char const* name = "dma_batch";  ///< for reports

  /**
   * @param config tuning
   * @throw strata::invalid_argument for zero descriptors per call
   */
  explicit dma_batch(dma_batch_config config = {}) : config_{config}
  { STRATA_EXPECTS(config.descriptors_per_call > 0, "dma_batch: descriptors_per_call must be positive"); }

  /// @brief Whether the driver offers `cuMemcpyBatchAsync` (otherwise `cudaMemcpyAsync` per run).
  [[nodiscard]] static bool batch_api_available() { return detail::batch_entry_points::get().available(); }
  /// @brief Whether the driver offers `cuMemcpy3DBatchAsync` for strided copies (and has not
  ///        refused one: after a refusal every instance sends plain batches).
  [[nodiscard]] static bool strided_api_available()
  {
    return detail::batch_entry_points::get().strided != nullptr &&
           !detail::strided_refused().load(std::memory_order_relaxed);
  }
  /// @brief The tuning.
  [[nodiscard]] dma_batch_config const& config() const noexcept { return config_; }
  /// @brief Strided copies enqueued so far (each one or more runs; `dma_batch_config::strided_runs`).
  [[nodiscard]] std::int64_t strided_copies() const noexcept { return strided_copies_; }

  /// @brief Enqueues a validated plan (see `transfer_backend`).
  template <kv_layout Src, kv_layout Dst>
  void enqueue(copy_plan<Src, Dst> const& plan, cuda::stream_ref on, std::span<cudaEvent_t const> layer_events)
  {
    cudaStream_t const stream = on.get();
    if (layer_events.empty()) {
      collect(plan);
      flush(stream);
      return;
    }
    for (std::int64_t l = plan.layers.begin; l < plan.layers.end; ++l) {
      collect(copy_plan{plan.src, plan.dst, plan.pages, layer_range::one(l)});
      flush(stream);
      STRATA_CUDA_TRY(cudaEventRecord(layer_events[static_cast<std::size_t>(l - plan.layers.begin)], stream));
    }
  }

 private:
  template <kv_layout Src, kv_layout Dst>
  void collect(copy_plan<Src, Dst> const& plan)
  {
    dsts_.clear();
    srcs_.clear();
    sizes_.clear();
    block_starts_.clear();
    // Layer by layer unless both sides are page-major (whole records then merge): a backup into
    // page-first records visits its runs as the device holds them, so that each (layer, plane) of
    // a stretch of consecutive pages becomes one strided copy, as for a load. A batch's copies run
    // in any order (their destinations never overlap). A strided copy stays inside one (layer,
    // plane): the tensors of an engine's table are separate allocations.
    constexpr bool page_major = Src::order == layout_order::page_major && Dst::order == layout_order::page_major;
    detail::for_each_run_in(
        plan, page_major,
        [this](copy_run const& r) {
          dsts_.push_back(reinterpret_cast<CUdeviceptr>(r.dst));
          srcs_.push_back(reinterpret_cast<CUdeviceptr>(r.src));
          sizes_.push_back(static_cast<std::size_t>(r.bytes));
        },
        [this] { block_starts_.push_back(sizes_.size()); });
    strided_.clear();
    if (config_.strided_runs && config_.use_batch_api && strided_api_available()) {
      strided_ = detail::strided_runs<CUdeviceptr>(srcs_, dsts_, sizes_, block_starts_);
    }
  }

  void flush(cudaStream_t stream)
  {
    auto const t0 = std::chrono::steady_clock::now();
    if (enqueue_collected(stream) && config_.on_enqueue) {
      config_.on_enqueue(std::int64_t(sizes_.size()),
                         std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
  }

  /// Enqueues the last `collect`'s runs; true when they went as plain descriptors (one per run).
  bool enqueue_collected(cudaStream_t stream)
  {
    auto const& api = detail::batch_entry_points::get();
    bool const legacy = stream == nullptr || stream == cudaStreamLegacy;  // the batch API rejects it
    if (!legacy && !strided_.empty() && 2 * strided_.size() <= sizes_.size() && flush_strided(stream)) { return false; }
    if (!api.available() || !config_.use_batch_api || legacy) {
      for (std::size_t i = 0; i < sizes_.size(); ++i) {
        STRATA_CUDA_TRY(cudaMemcpyAsync(reinterpret_cast<void*>(dsts_[i]), reinterpret_cast<void const*>(srcs_[i]),
                                        sizes_[i], cudaMemcpyDefault, stream));
      }
      return true;
    }
    CUmemcpyAttributes attr{};
    attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    attr.flags = config_.prefer_overlap_with_compute ? CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE : 0;
    std::size_t attr_index = 0;
    std::size_t per_call =
        std::max<std::size_t>(1, std::min(config_.first_call_descriptors, config_.descriptors_per_call));
    for (std::size_t at = 0, n = 0; at < sizes_.size();
         at += n, per_call = std::min(2 * per_call, config_.descriptors_per_call)) {
      n = std::min(per_call, sizes_.size() - at);
      CUresult r{};
      std::size_t fail_index = 0;
      if (api.v13 != nullptr) {
        r = api.v13(dsts_.data() + at, srcs_.data() + at, sizes_.data() + at, n, &attr, &attr_index, 1,
                    reinterpret_cast<CUstream>(stream));
      } else {
        r = api.v128(dsts_.data() + at, srcs_.data() + at, sizes_.data() + at, n, &attr, &attr_index, 1, &fail_index,
                     reinterpret_cast<CUstream>(stream));
      }
      if (r != CUDA_SUCCESS) {
        throw cuda_error(detail::concat("strata: CUDA call cuMemcpyBatchAsync (", n, " descriptors from ", at,
                                        ") failed with CUresult ", static_cast<int>(r),
                                        api.v128 != nullptr ? detail::concat(", first failure at ", fail_index) : ""));
      }
    }
    return true;
  }

  /// The strided copies of the last `collect` through `cuMemcpy3DBatchAsync`; false (nothing
  /// enqueued) when the driver refuses them: no instance tries again.
  bool flush_strided(cudaStream_t stream)
  {
    ops_.clear();
    for (auto const& r : strided_) {
      CUDA_MEMCPY3D_BATCH_OP op{};
      op.src.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
      op.src.op.ptr.ptr = r.src;
      op.src.op.ptr.rowLength = r.count > 1 ? r.src_step : 0;  // elements of 1 byte: pointer to pointer
      op.dst.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
      op.dst.op.ptr.ptr = r.dst;
      op.dst.op.ptr.rowLength = r.count > 1 ? r.dst_step : 0;
      op.extent = CUextent3D{r.bytes, r.count, 1};
      op.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
      op.flags = config_.prefer_overlap_with_compute ? CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE : 0;
      ops_.push_back(op);
    }
    auto const fn = detail::batch_entry_points::get().strided;
    for (std::size_t at = 0; at < ops_.size(); at += config_.descriptors_per_call) {
      std::size_t const n = std::min(config_.descriptors_per_call, ops_.size() - at);
      if (fn(n, ops_.data() + at, 0, reinterpret_cast<CUstream>(stream)) != CUDA_SUCCESS) {
        // Refused before anything of this call was enqueued (a driver call: the runtime's last
        // error is untouched); the copies of earlier calls, if any, are enqueued again by the
        // caller's fallback: the same bytes to the same place.
        detail::strided_refused().store(true, std::memory_order_relaxed);
        return false;
      }
    }
    strided_copies_ += std::int64_t(ops_.size());
    return true;
  }

  dma_batch_config config_;
  std::vector<CUdeviceptr> dsts_, srcs_;
  std::vector<std::size_t> sizes_;
  std::vector<std::size_t> block_starts_;  // first run of each (layer, plane), layer by layer
  std::vector<detail::strided_run<CUdeviceptr>> strided_;
  std::vector<CUDA_MEMCPY3D_BATCH_OP> ops_;
  std::int64_t strided_copies_ = 0;
};
static_assert(transfer_backend<dma_batch>);

}  // namespace strata
