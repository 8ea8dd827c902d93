// SPDX-License-Identifier: Apache-2.0
/**
 * @file transfer/staged.cuh
 * @brief The copy engine moves whole page-first records into a GPU staging buffer; an SM kernel
 *        relays them into the destination layout through HBM (and the reverse for backups).
 */
#pragma once

#include <strata/transfer/gpu_assisted.cuh>
#include <strata/transfer/sm_partition.cuh>

#include <cuda/stream_ref>

#include <array>

namespace strata {

/// @brief A layout whose pages are contiguous records (`page_first`, `page_first_chunked`).
template <class L>
concept record_layout = kv_layout<L> && L::order == layout_order::page_major && requires(L const& l, std::int64_t p) {
  { l.page_data(p) } -> std::same_as<std::byte*>;
};

/// @brief Tuning of `staged`.
struct staged_config {
  /// Bytes the copy engine moves per pipeline step (whole records: at least one). The staging buffer
  /// holds two steps that alternate: while the relay kernel drains one, the copy engine fills the
  /// other. Small steps keep the last, unoverlapped relay short (measured on the H200: 128 MiB steps
  /// left 6.5% of an 8K-context load exposed).
  std::int64_t chunk_bytes = std::int64_t{16} << 20;
  /// Launch shape of the relay kernel (HBM to HBM: two CTAs keep up with PCIe).
  gpu_assisted_config relay{2, 1024};
};

namespace detail {

/// @brief Slots of the staging buffer, each one record of the plan's layers `[first_layer, ...)`.
struct staging_layout {
  static constexpr layout_order order = layout_order::page_major;
  static constexpr char const* name = "staging";
  std::byte* base;
  kv_geometry geometry_;
  std::int64_t first_layer;
  std::int64_t record_bytes;
  std::int64_t slots;

  [[nodiscard]] STRATA_HOST_DEVICE kv_geometry const& geometry() const noexcept { return geometry_; }
  [[nodiscard]] STRATA_HOST_DEVICE std::int64_t num_pages() const noexcept { return slots; }
  [[nodiscard]] STRATA_HOST_DEVICE block_ref block(std::int64_t slot, std::int64_t layer,
                                                   std::int64_t plane) const noexcept
  {
    auto const& g = geometry_;
    return {base + slot * record_bytes + ((layer - first_layer) * g.planes + plane) * g.block_bytes(), g.row_bytes(),
            g.head_bytes()};
  }
};
static_assert(kv_layout<staging_layout>);

}  // namespace detail

/**
 * @brief Loads from page-first records (few large copy-engine descriptors, one per run of adjacent
 *        records) plus an HBM relay; backups the reverse.
 *
 * Loads need a `record_layout` source, backups a `record_layout` destination; the other side is any
 * layout in device memory. Whole records move at once, so per-layer events are all recorded when
 * the transfer ends. The relay takes `relay.ctas` SMs for short bursts; the link is driven by the
 * copy engine. The relay runs on an internal stream at the caller's stream priority and in the
 * caller's stream's green context, if it has one (`sm_partition::copy_stream()`): relays stay inside
 * the copy partition. The device-side layout is checked as `gpu_assisted` checks it (alignment,
 * 16-byte segments, device-accessible memory) before anything is enqueued.
 */
class staged {
 public:
  static constexpr char const* name = "staged";  ///< for reports

  /**
   * @param config tuning
   * @throw strata::invalid_argument for a non-positive chunk size or a bad relay shape
   */
  explicit staged(staged_config config = {}) : config_{config}, relay_{config.relay}
  { STRATA_EXPECTS(config.chunk_bytes > 0, "staged: chunk_bytes must be positive, got ", config.chunk_bytes); }
  staged(staged const&) = delete;
  staged& operator=(staged const&) = delete;
  /// @brief Waits for the transfers still using the staging buffer and the relay stream, then frees them.
  ~staged()
  {
    if (cudaEventSynchronize(finished_.get()) != cudaSuccess) { (void)cudaGetLastError(); }
    if (relay_stream_.get() != nullptr && cudaStreamSynchronize(relay_stream_.get()) != cudaSuccess) {
      (void)cudaGetLastError();
    }
  }

  /// @brief For tests and diagnostics: the stream relays ran on last (null before the first transfer).
  [[nodiscard]] cudaStream_t relay_stream() const noexcept { return relay_stream_.get(); }

  /// @brief The tuning.
  [[nodiscard]] staged_config const& config() const noexcept { return config_; }

  /// @brief Enqueues a validated plan (see `transfer_backend`): a load if the source is made of
  ///        records, else a backup into records.
  template <kv_layout Src, kv_layout Dst>
  requires(record_layout<Src> || record_layout<Dst>)
  void enqueue(copy_plan<Src, Dst> const& plan, cuda::stream_ref on, std::span<cudaEvent_t const> layer_events)
  {
    cudaStream_t const stream = on.get();
    kv_geometry const g = plan.src.geometry();
    std::int64_t const record = plan.layers.size() * g.planes * g.block_bytes();
    std::int64_t const per_half = std::max<std::int64_t>(1, config_.chunk_bytes / record);
    std::int64_t const n = static_cast<std::int64_t>(plan.pages.size());
    std::int64_t const slots_per_half = std::min(per_half, n);
    reserve(2 * slots_per_half * record);
    detail::staging_layout const staging{staging_.data(), g, plan.layers.begin, record, 2 * slots_per_half};
    constexpr bool load = record_layout<Src>;
    // The relay kernel's side of the plan, checked before anything is enqueued.
    auto const shape = load ? relay_.check(staging, plan.dst, {0, plan.pages[0].dst}, plan.layers, name)
                            : relay_.check(plan.src, staging, {plan.pages[0].src, 0}, plan.layers, name);
    // The relay runs at the caller's priority (at a lower one, compute kernels starve it) and in the
    // caller's green context (an sm_partition's copy stream: relays stay on the copy partition).
    int priority = 0;
    STRATA_CUDA_TRY(cudaStreamGetPriority(stream, &priority));
    CUgreenCtx const ctx = detail::green_context_of(stream);
    if (!relay_stream_.matches(ctx, priority)) {
      detail::context_stream fresh{ctx, priority};
      if (relay_stream_.get() != nullptr) { STRATA_CUDA_TRY(cudaStreamSynchronize(relay_stream_.get())); }
      relay_stream_ = std::move(fresh);
    }

    // Relay pairs: (page, slot) for backups, (slot, page) for loads; uploaded once.
    std::size_t const bytes = static_cast<std::size_t>(n) * sizeof(page_pair);
    auto const region = ring_.acquire(bytes);
    try {
      enqueue_acquired(plan, stream, layer_events, staging, shape, region);
    } catch (...) {
      // Relays already queued still read the region and the staging buffer and write the
      // destination: the caller's stream (which the caller waits on before reusing its pages) and
      // both buffers' release come after them.
      join_relays(stream);
      ring_.release_after_noexcept(stream);
      throw;
    }
    ring_.release_after(stream);
  }

 private:
  /// After a failure: `stream` and `finished_` wait for the relays queued so far (when even that
  /// cannot be enqueued, the host waits for both streams).
  void join_relays(cudaStream_t stream) noexcept
  {
    if (relay_stream_.get() == nullptr) { return; }
    if (cudaEventRecord(start_.get(), relay_stream_.get()) != cudaSuccess ||
        cudaStreamWaitEvent(stream, start_.get(), 0) != cudaSuccess ||
        cudaEventRecord(finished_.get(), stream) != cudaSuccess) {
      (void)cudaStreamSynchronize(relay_stream_.get());
      (void)cudaStreamSynchronize(stream);
      (void)cudaGetLastError();  // this failure's, reported by the exception under way
    }
  }

  template <kv_layout Src, kv_layout Dst>
  void enqueue_acquired(copy_plan<Src, Dst> const& plan, cudaStream_t stream, std::span<cudaEvent_t const> layer_events,
                        detail::staging_layout const& staging, detail::segment_shape const& shape,
                        detail::descriptor_ring::region const& region)
  {
    kv_geometry const g = plan.src.geometry();
    std::int64_t const record = staging.record_bytes;
    std::int64_t const offset = plan.layers.begin * g.planes * g.block_bytes();
    std::int64_t const n = static_cast<std::int64_t>(plan.pages.size());
    std::int64_t const slots_per_half = staging.slots / 2;
    constexpr bool load = record_layout<Src>;
    std::size_t const bytes = static_cast<std::size_t>(n) * sizeof(page_pair);
    auto* host_pairs = reinterpret_cast<page_pair*>(region.host);
    for (std::int64_t i = 0; i < n; ++i) {
      std::int64_t const slot = (i / slots_per_half % 2) * slots_per_half + i % slots_per_half;
      host_pairs[i] = load ? page_pair{slot, plan.pages[i].dst} : page_pair{plan.pages[i].src, slot};
    }
    detail::descriptor_ring::upload(region, bytes, stream);
    auto const* device_pairs = reinterpret_cast<page_pair const*>(region.device);
    // Everything before this call on `stream`, and this instance's previous transfer, come first.
    STRATA_CUDA_TRY(cudaStreamWaitEvent(stream, finished_.get(), 0));
    STRATA_CUDA_TRY(cudaEventRecord(start_.get(), stream));
    STRATA_CUDA_TRY(cudaStreamWaitEvent(relay_stream_.get(), start_.get(), 0));

    auto const& records = [&]() -> auto const& {
      if constexpr (load) {
        return plan.src;
      } else {
        return plan.dst;
      }
    }();
    auto const record_page = [&](std::int64_t i) { return load ? plan.pages[i].src : plan.pages[i].dst; };
    bool const whole_records = record == g.page_bytes();
    // Copy-engine descriptors between records and the chunk's consecutive slots; whole records of
    // adjacent pages merge into one descriptor.
    auto dma = [&](std::int64_t first, std::int64_t count, std::int64_t first_slot) {
      for (std::int64_t i = first; i < first + count;) {
        std::int64_t j = i + 1;
        while (whole_records && j < first + count &&
               records.page_data(record_page(j)) == records.page_data(record_page(j - 1)) + record) {
          ++j;
        }
        std::byte* const slot = staging.base + (first_slot + i - first) * record;
        std::byte* const rec = records.page_data(record_page(i)) + offset;
        auto const len = static_cast<std::size_t>((j - i) * record);
        STRATA_CUDA_TRY(cudaMemcpyAsync(load ? slot : rec, load ? rec : slot, len, cudaMemcpyDefault, stream));
        i = j;
      }
    };

    for (std::int64_t first = 0, chunk = 0; first < n; first += slots_per_half, ++chunk) {
      std::int64_t const count = std::min(slots_per_half, n - first);
      std::size_t const half = static_cast<std::size_t>(chunk % 2);
      std::int64_t const first_slot = static_cast<std::int64_t>(half) * slots_per_half;
      if constexpr (load) {
        if (chunk >= 2) { STRATA_CUDA_TRY(cudaStreamWaitEvent(stream, relayed_[half].get(), 0)); }
        dma(first, count, first_slot);
        STRATA_CUDA_TRY(cudaEventRecord(moved_[half].get(), stream));
        STRATA_CUDA_TRY(cudaStreamWaitEvent(relay_stream_.get(), moved_[half].get(), 0));
        relay_.launch(staging, plan.dst, device_pairs + first, count, plan.layers.begin, plan.layers.size(), shape,
                      relay_stream_.get());
        STRATA_CUDA_TRY(cudaEventRecord(relayed_[half].get(), relay_stream_.get()));
      } else {
        if (chunk >= 2) { STRATA_CUDA_TRY(cudaStreamWaitEvent(relay_stream_.get(), moved_[half].get(), 0)); }
        relay_.launch(plan.src, staging, device_pairs + first, count, plan.layers.begin, plan.layers.size(), shape,
                      relay_stream_.get());
        STRATA_CUDA_TRY(cudaEventRecord(relayed_[half].get(), relay_stream_.get()));
        STRATA_CUDA_TRY(cudaStreamWaitEvent(stream, relayed_[half].get(), 0));
        dma(first, count, first_slot);
        STRATA_CUDA_TRY(cudaEventRecord(moved_[half].get(), stream));
      }
    }
    // Join the relay stream back (loads end with a relay), then mark the staging buffer free.
    STRATA_CUDA_TRY(cudaEventRecord(start_.get(), relay_stream_.get()));
    STRATA_CUDA_TRY(cudaStreamWaitEvent(stream, start_.get(), 0));
    STRATA_CUDA_TRY(cudaEventRecord(finished_.get(), stream));
    for (auto e : layer_events) {
      STRATA_CUDA_TRY(cudaEventRecord(e, stream));
    }
  }

  void reserve(std::int64_t bytes)
  {
    if (static_cast<std::int64_t>(staging_.size()) >= bytes) { return; }
    STRATA_CUDA_TRY(cudaEventSynchronize(finished_.get()));  // the previous transfer may still use it
    staging_ = device_buffer{};
    staging_ = device_buffer{static_cast<std::size_t>(std::max(bytes, 2 * config_.chunk_bytes))};
  }

  staged_config config_;
  gpu_assisted relay_;
  device_buffer staging_;
  detail::descriptor_ring ring_;
  detail::context_stream relay_stream_;
  cuda_event start_;
  cuda_event finished_;
  std::array<cuda_event, 2> moved_;
  std::array<cuda_event, 2> relayed_;
};

}  // namespace strata
