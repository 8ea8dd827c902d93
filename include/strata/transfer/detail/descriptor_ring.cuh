/**
 * @file transfer/detail/descriptor_ring.cuh
 * @brief Paired pinned/device ring buffers for the small arrays kernels read (page pairs): written
 *        on the host, copied to the device on the transfer's stream, reused once that work is done.
 */
#pragma once

#include <strata/detail/cuda.cuh>

#include <cstring>
#include <deque>

namespace strata::detail {

/**
 * @brief A ring of descriptor space. `acquire` hands out a region (host and device views at the
 *        same offset); `release_after(stream)` marks it busy until the work enqueued so far on
 *        `stream` is done. When the ring is full, `acquire` waits on the host for the oldest region.
 *        One thread at a time.
 */
class descriptor_ring {
 public:
  static constexpr std::size_t alignment = 256;

  explicit descriptor_ring(std::size_t capacity = std::size_t{1} << 20) : capacity_{capacity} {}

  /// @brief Space for `bytes`: `.host` to write, `.device` for kernels after `upload`.
  struct region {
    std::byte* host;
    std::byte* device;
    std::size_t bytes;
  };

  /// @brief Reserves `bytes` of ring space, waiting for the device to finish with old regions.
  region acquire(std::size_t bytes)
  {
    bytes = (bytes + alignment - 1) / alignment * alignment;
    if (host_.size() < bytes || host_.size() == 0) { grow(std::max(bytes * 2, capacity_)); }
    std::size_t start = head_;
    if (start + bytes > host_.size()) { start = 0; }  // wrap; the tail is left unused this round
    // Regions after `head_` in ring order are the oldest: retire those that overlap [start, end).
    while (!busy_.empty() && overlaps(busy_.front(), start, start + bytes)) {
      STRATA_CUDA_TRY(cudaEventSynchronize(busy_.front().done.get()));
      busy_.pop_front();
    }
    pending_ = {start, start + bytes};
    head_ = start + bytes;
    return {host_.data() + start, device_.data() + start, bytes};
  }

  /// @brief Copies the region's host bytes to its device view on `stream`.
  static void upload(region const& r, std::size_t bytes, cudaStream_t stream)
  {
    STRATA_CUDA_TRY(cudaMemcpyAsync(r.device, r.host, bytes, cudaMemcpyHostToDevice, stream));
  }

  /// @brief The last acquired region stays busy until the work now enqueued on `stream` is done.
  void release_after(cudaStream_t stream)
  {
    cuda_event done;
    done.record(stream);
    busy_.push_back({pending_.begin, pending_.end, std::move(done)});
  }

 private:
  struct span_t {
    std::size_t begin, end;
  };
  struct busy_region {
    std::size_t begin, end;
    cuda_event done;
  };
  static bool overlaps(busy_region const& r, std::size_t begin, std::size_t end)
  {
    return r.begin < end && begin < r.end;
  }
  void grow(std::size_t bytes)
  {
    for (auto& r : busy_) { STRATA_CUDA_TRY(cudaEventSynchronize(r.done.get())); }
    busy_.clear();
    host_ = pinned_buffer{bytes};
    device_ = device_buffer{bytes};
    head_ = 0;
  }

  std::size_t capacity_;
  pinned_buffer host_;
  device_buffer device_;
  std::size_t head_{};
  span_t pending_{};
  std::deque<busy_region> busy_;
};

}  // namespace strata::detail
