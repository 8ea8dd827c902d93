// SPDX-License-Identifier: Apache-2.0
/**
 * @file transfer/dma_copy.cuh
 * @brief The copy engine, one `cudaMemcpyAsync` per maximal contiguous run.
 */
#pragma once

#include <strata/transfer/backend.cuh>

#include <cuda/stream_ref>

namespace strata {

/**
 * @brief One `cudaMemcpyAsync` per maximal contiguous run (adjacent pages merged).
 *
 * No SM is used, but each call costs the CPU a few microseconds and small runs use a fraction of
 * the link: the per-block DMA baseline. Works on pageable memory too (slowly).
 */
class dma_copy {
 public:
  static constexpr char const* name = "dma_copy";  ///< for reports

  /// @brief Enqueues a validated plan (see `transfer_backend`).
  template <kv_layout Src, kv_layout Dst>
  void enqueue(copy_plan<Src, Dst> const& plan, cuda::stream_ref on, std::span<cudaEvent_t const> layer_events)
  {
    cudaStream_t const stream = on.get();
    auto issue = [stream](copy_run const& r) {
      STRATA_CUDA_TRY(cudaMemcpyAsync(r.dst, r.src, static_cast<std::size_t>(r.bytes), cudaMemcpyDefault, stream));
    };
    if (layer_events.empty()) {
      for_each_run(plan, issue);
      return;
    }
    for (std::int64_t l = plan.layers.begin; l < plan.layers.end; ++l) {
      for_each_run(copy_plan{plan.src, plan.dst, plan.pages, layer_range::one(l)}, issue);
      STRATA_CUDA_TRY(cudaEventRecord(layer_events[static_cast<std::size_t>(l - plan.layers.begin)], stream));
    }
  }
};
static_assert(transfer_backend<dma_copy>);

}  // namespace strata
