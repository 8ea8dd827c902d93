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
};

namespace detail {

/// @brief `cuMemcpyBatchAsync` as the running driver offers it.
struct batch_entry_points {
  using v13_fn = CUresult (*)(CUdeviceptr*, CUdeviceptr*, std::size_t*, std::size_t, CUmemcpyAttributes*, std::size_t*,
                              std::size_t, CUstream);
  using v128_fn = CUresult (*)(CUdeviceptr*, CUdeviceptr*, std::size_t*, std::size_t, CUmemcpyAttributes*, std::size_t*,
                               std::size_t, std::size_t*, CUstream);
  v13_fn v13{};    ///< CUDA 13 signature (no failIdx)
  v128_fn v128{};  ///< CUDA 12.8–12.9 signature (with failIdx)
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
      } else if (void* f =
                     p.driver_version >= 12080 ? detail::driver_entry_point("cuMemcpyBatchAsync", 12080) : nullptr) {
        p.v128 = reinterpret_cast<v128_fn>(f);
      }
      return p;
    }();
    return points;
  }
};

}  // namespace detail

/**
 * @brief Many runs per `cudaMemcpyBatchAsync` call.
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
  /// @brief The tuning.
  [[nodiscard]] dma_batch_config const& config() const noexcept { return config_; }

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
    for_each_run(plan, [this](copy_run const& r) {
      dsts_.push_back(reinterpret_cast<CUdeviceptr>(r.dst));
      srcs_.push_back(reinterpret_cast<CUdeviceptr>(r.src));
      sizes_.push_back(static_cast<std::size_t>(r.bytes));
    });
  }

  void flush(cudaStream_t stream)
  {
    auto const& api = detail::batch_entry_points::get();
    bool const legacy = stream == nullptr || stream == cudaStreamLegacy;  // the batch API rejects it
    if (!api.available() || !config_.use_batch_api || legacy) {
      for (std::size_t i = 0; i < sizes_.size(); ++i) {
        STRATA_CUDA_TRY(cudaMemcpyAsync(reinterpret_cast<void*>(dsts_[i]), reinterpret_cast<void const*>(srcs_[i]),
                                        sizes_[i], cudaMemcpyDefault, stream));
      }
      return;
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
  }

  dma_batch_config config_;
  std::vector<CUdeviceptr> dsts_, srcs_;
  std::vector<std::size_t> sizes_;
};
static_assert(transfer_backend<dma_batch>);

}  // namespace strata
