// SPDX-License-Identifier: Apache-2.0
/**
 * @file transfer/gpu_assisted.cuh
 * @brief GPU-assisted I/O: copy kernels confined to a few CTAs that read pinned host memory through
 *        its device mapping (or write it, for backups) and reach the PCIe link's limit on small pages.
 */
#pragma once

#include <strata/transfer/backend.cuh>
#include <strata/transfer/detail/copy_kernel.cuh>
#include <strata/transfer/detail/descriptor_ring.cuh>
#include <strata/transfer/detail/kernel_checks.cuh>

#include <cuda/stream_ref>

namespace strata {

/**
 * @brief Launch shape of the copy kernels: how many SMs they may take and how many reads each keeps
 *        in flight (`ctas * threads * copy_unroll * 16` bytes).
 */
struct gpu_assisted_config {
  int ctas = 2;        ///< CTAs per launch; each occupies at most one SM, so this caps the SMs used
  int threads = 1024;  ///< threads per CTA: 128, 256, 512 or 1024 (fewer: fewer reads in flight)

  /// @brief Bytes of reads in flight at once.
  [[nodiscard]] constexpr std::int64_t bytes_in_flight() const noexcept
  { return std::int64_t{ctas} * threads * detail::copy_unroll * 16; }
};

/// @brief Default quotas: loads sit on the critical path (2 CTAs), backups do not (1 CTA).
inline constexpr gpu_assisted_config default_load_config{2, 1024};
/// @brief The default for backups: one CTA.
inline constexpr gpu_assisted_config default_backup_config{1, 1024};

/**
 * @brief SMs left to the engine's own kernels while copies of shape `config` run: pass it to
 *        `cublasSetSmCountTarget` (or size a green context) so that GEMM grids do not run an extra
 *        wave on the SMs the copies hold. Measured on the H200: this removed a 2-CTA copy's cost
 *        beside prefill (8.5% to -0.7%).
 */
inline int sms_left_for_compute(gpu_assisted_config const& config) { return std::max(1, sm_count() - config.ctas); }

/**
 * @brief Moves pages with SM copy kernels; any pair of layouts, transposing on the fly.
 *
 * Host memory must be pinned and device-mapped (`cudaHostAlloc`, or `cudaHostRegister` with
 * `cudaHostRegisterMapped`; on 64-bit Linux its device address equals its host address), and every
 * block 16-byte aligned, with head rows (or whatever both layouts hold contiguously) of whole
 * 16-byte vectors. All of it is checked before anything is enqueued. Per-layer completion launches
 * one kernel per layer; otherwise one kernel moves every layer. Several transfers may be in flight
 * on one instance at once (each has its own region of the descriptor ring).
 */
class gpu_assisted {
 public:
  static constexpr char const* name = "gpu_assisted";  ///< for reports

  /**
   * @param config launch shape
   * @throw strata::invalid_argument for a non-positive CTA count, or threads not in the documented set
   */
  explicit gpu_assisted(gpu_assisted_config config = default_load_config) : config_{config}
  {
    STRATA_EXPECTS(config.ctas > 0, "gpu_assisted: ctas must be positive, got ", config.ctas);
    STRATA_EXPECTS(config.threads == 128 || config.threads == 256 || config.threads == 512 || config.threads == 1024,
                   "gpu_assisted: threads must be 128, 256, 512 or 1024, got ", config.threads);
  }

  /// @brief The launch shape.
  [[nodiscard]] gpu_assisted_config const& config() const noexcept { return config_; }

  /**
   * @brief Enqueues a validated plan (see `transfer_backend`).
   * @throw strata::invalid_argument, before anything is enqueued, when a block is not 16-byte
   *        aligned, a segment is not a whole number of 16-byte vectors, or a block lies in memory
   *        the device cannot dereference (pageable host memory): see `detail::check_kernel_copy`
   */
  template <kv_layout Src, kv_layout Dst>
  void enqueue(copy_plan<Src, Dst> const& plan, cuda::stream_ref on, std::span<cudaEvent_t const> layer_events)
  {
    cudaStream_t const stream = on.get();
    auto const shape = detail::check_kernel_copy(plan.src, plan.dst, plan.pages[0], plan.layers, name, &access_);
    std::size_t const bytes = plan.pages.size() * sizeof(page_pair);
    auto const region = ring_.acquire(bytes);
    try {
      std::memcpy(region.host, plan.pages.data(), bytes);
      detail::descriptor_ring::upload(region, bytes, stream);
      auto const* pairs = reinterpret_cast<page_pair const*>(region.device);
      auto const n = static_cast<std::int64_t>(plan.pages.size());
      if (layer_events.empty()) {
        launch(plan.src, plan.dst, pairs, n, plan.layers.begin, plan.layers.size(), shape, stream);
      } else {
        for (std::int64_t l = plan.layers.begin; l < plan.layers.end; ++l) {
          launch(plan.src, plan.dst, pairs, n, l, 1, shape, stream);
          STRATA_CUDA_TRY(cudaEventRecord(layer_events[static_cast<std::size_t>(l - plan.layers.begin)], stream));
        }
      }
    } catch (...) {
      ring_.release_after_noexcept(stream);  // whatever was enqueued may still read the region
      throw;
    }
    ring_.release_after(stream);
  }

  /// @brief For `staged` and `split`: the checks `enqueue` makes, remembering accessible memory here.
  template <kv_layout Src, kv_layout Dst>
  detail::segment_shape check(Src const& src, Dst const& dst, page_pair first, layer_range layers, char const* backend)
  { return detail::check_kernel_copy(src, dst, first, layers, backend, &access_); }

  /// @brief For `staged`: launches on device-resident pairs (no upload), unchecked.
  template <kv_layout Src, kv_layout Dst>
  void launch(Src const& src, Dst const& dst, page_pair const* device_pairs, std::int64_t n_pairs, std::int64_t layer0,
              std::int64_t n_layers, detail::segment_shape const& shape, cudaStream_t stream) const
  {
    // The launch's own status, not `cudaGetLastError()`: that would take (and blame strata for) an
    // error the engine's own work left pending on this thread.
    cudaLaunchConfig_t launch{};
    launch.gridDim = dim3{static_cast<unsigned>(config_.ctas)};
    launch.blockDim = dim3{static_cast<unsigned>(config_.threads)};
    launch.stream = stream;
    STRATA_CUDA_TRY(cudaLaunchKernelEx(&launch, detail::copy_blocks_kernel<Src, Dst>, src, dst, device_pairs, n_pairs,
                                       layer0, n_layers, shape));
  }

 private:
  gpu_assisted_config config_;
  detail::descriptor_ring ring_;
  detail::access_cache access_;
};
static_assert(transfer_backend<gpu_assisted>);

}  // namespace strata
