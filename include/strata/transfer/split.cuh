// SPDX-License-Identifier: Apache-2.0
/**
 * @file transfer/split.cuh
 * @brief One load split between the copy engine (`dma_batch`) and SM copy kernels (`gpu_assisted`),
 *        running at once: fewer host reads in flight from SMs at the same total bandwidth.
 */
#pragma once

#include <strata/transfer/dma_batch.cuh>
#include <strata/transfer/gpu_assisted.cuh>

#include <cuda/stream_ref>

#include <cmath>

namespace strata {

/// @brief Tuning of `split`.
struct split_config {
  double dma_fraction = 0.5;                         ///< share of the pages moved by the copy engine, in [0, 1]
  gpu_assisted_config kernel = default_load_config;  ///< launch shape for the SM share
  dma_batch_config dma{};                            ///< tuning of the copy-engine share
};

/**
 * @brief The first `dma_fraction` of a plan's pages go through `dma_batch` on an internal stream,
 *        the rest through `gpu_assisted` on the caller's stream; layer l completes when both
 *        shares of it have landed. The copy-engine share is submitted from the calling thread.
 */
class split {
 public:
  static constexpr char const* name = "split";  ///< for reports

  /**
   * @param config tuning
   * @throw strata::invalid_argument for a fraction outside [0, 1] or what the two parts reject
   */
  explicit split(split_config config = {}) : config_{config}, kernel_{config.kernel}, dma_{config.dma}
  {
    STRATA_EXPECTS(config.dma_fraction >= 0 && config.dma_fraction <= 1, "split: dma_fraction must be in [0, 1], got ",
                   config.dma_fraction);
  }

  /// @brief The tuning.
  [[nodiscard]] split_config const& config() const noexcept { return config_; }

  /**
   * @brief Enqueues a validated plan (see `transfer_backend`).
   * @throw strata::invalid_argument, before anything is enqueued, for what `gpu_assisted` rejects in
   *        the kernel's share
   */
  template <kv_layout Src, kv_layout Dst>
  void enqueue(copy_plan<Src, Dst> const& plan, cuda::stream_ref on, std::span<cudaEvent_t const> layer_events)
  {
    cudaStream_t const stream = on.get();
    auto const n = static_cast<std::int64_t>(plan.pages.size());
    auto const k = static_cast<std::int64_t>(std::llround(config_.dma_fraction * static_cast<double>(n)));
    if (k == 0) { return kernel_.enqueue(plan, stream, layer_events); }
    if (k == n) { return dma_.enqueue(plan, stream, layer_events); }
    copy_plan const by_dma{plan.src, plan.dst, plan.pages.first(static_cast<std::size_t>(k)), plan.layers};
    copy_plan const by_kernel{plan.src, plan.dst, plan.pages.subspan(static_cast<std::size_t>(k)), plan.layers};
    (void)kernel_.check(plan.src, plan.dst, by_kernel.pages[0], plan.layers, name);  // before any byte moves
    STRATA_CUDA_TRY(cudaEventRecord(start_.get(), stream));
    STRATA_CUDA_TRY(cudaStreamWaitEvent(side_.get(), start_.get(), 0));
    if (layer_events.empty()) {
      kernel_.enqueue(by_kernel, stream, {});
      dma_.enqueue(by_dma, side_.get(), {});
    } else {
      auto const layers = static_cast<std::size_t>(plan.layers.size());
      ensure_events(layers);
      kernel_.enqueue(by_kernel, stream, std::span<cudaEvent_t const>{kernel_raw_}.first(layers));
      dma_.enqueue(by_dma, side_.get(), std::span<cudaEvent_t const>{dma_raw_}.first(layers));
      STRATA_CUDA_TRY(cudaStreamWaitEvent(join_.get(), start_.get(), 0));
      for (std::size_t l = 0; l < layers; ++l) {
        STRATA_CUDA_TRY(cudaStreamWaitEvent(join_.get(), kernel_raw_[l], 0));
        STRATA_CUDA_TRY(cudaStreamWaitEvent(join_.get(), dma_raw_[l], 0));
        STRATA_CUDA_TRY(cudaEventRecord(layer_events[l], join_.get()));
      }
    }
    STRATA_CUDA_TRY(cudaEventRecord(side_done_.get(), side_.get()));
    STRATA_CUDA_TRY(cudaStreamWaitEvent(stream, side_done_.get(), 0));
  }

 private:
  void ensure_events(std::size_t n)
  {
    while (kernel_events_.size() < n) {
      kernel_events_.emplace_back();
      dma_events_.emplace_back();
      kernel_raw_.push_back(kernel_events_.back().get());
      dma_raw_.push_back(dma_events_.back().get());
    }
  }

  split_config config_;
  gpu_assisted kernel_;
  dma_batch dma_;
  cuda_stream side_, join_;
  cuda_event start_, side_done_;
  std::vector<cuda_event> kernel_events_, dma_events_;
  std::vector<cudaEvent_t> kernel_raw_, dma_raw_;
};
static_assert(transfer_backend<split>);

}  // namespace strata
