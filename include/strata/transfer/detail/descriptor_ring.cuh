// SPDX-License-Identifier: Apache-2.0
/**
 * @file transfer/detail/descriptor_ring.cuh
 * @brief Paired pinned/device ring buffers for the small arrays kernels read (page pairs): written
 *        on the host, copied to the device on the transfer's stream, reused once that work is done.
 */
#pragma once

#include <strata/cuda.cuh>

#include <algorithm>
#include <cassert>
#include <cstring>
#include <deque>
#include <utility>

namespace strata::detail {

/**
 * @brief A ring of descriptor space. `acquire` hands out a region (host and device views at the
 *        same offset); `release_after(stream)` marks it busy until the work enqueued so far on
 *        `stream` is done. When the ring is full, `acquire` waits on the host for old regions.
 *        One thread at a time.
 *
 * The ring as intervals. Busy regions are kept in FIFO (acquisition) order, and they lie in that
 * order along the ring: walking forward from the oldest region's begin, one meets every busy region
 * from oldest to youngest, and the youngest ends at `head_`. Free space is therefore the circular
 * interval from `head_` to the oldest region's begin. A new region either starts at `head_`, or
 * (when it does not fit before the end) wraps to 0 and leaves the tail `[head_, size)` unused; in
 * both cases the busy regions it overlaps, together with those in a skipped tail, are a prefix of
 * the FIFO: the oldest ones. `acquire` retires that whole prefix (up to the youngest region that
 * overlaps the new range or the skipped tail), waiting for each in FIFO order, so the invariant
 * holds again afterwards and no live region is ever left behind `head_` or under a new region.
 */
class descriptor_ring {
 public:
  static constexpr std::size_t alignment = 256;

  explicit descriptor_ring(std::size_t capacity = std::size_t{1} << 20) : capacity_{capacity} {}
  descriptor_ring(descriptor_ring const&) = delete;
  descriptor_ring& operator=(descriptor_ring const&) = delete;
  descriptor_ring(descriptor_ring&& o) noexcept
      : capacity_{o.capacity_},
        host_{std::move(o.host_)},
        device_{std::move(o.device_)},
        head_{std::exchange(o.head_, 0)},
        pending_{o.pending_},
        busy_{std::exchange(o.busy_, {})}
  {
  }
  /// @brief Waits for the transfers that may still read this ring's memory, then takes `o`'s.
  descriptor_ring& operator=(descriptor_ring&& o) noexcept
  {
    synchronize_all();
    capacity_ = o.capacity_;
    std::swap(host_, o.host_);
    std::swap(device_, o.device_);
    head_ = std::exchange(o.head_, 0);
    pending_ = o.pending_;
    busy_.swap(o.busy_);
    return *this;
  }
  /// @brief Waits for the transfers that may still read the ring, then frees it.
  ~descriptor_ring() { synchronize_all(); }

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
    assert(host_.size() == device_.size());
    std::size_t start = head_;
    std::size_t tail_end = head_;  // [head_, tail_end): a tail skipped by a wrap
    if (start + bytes > host_.size()) {
      start = 0;
      tail_end = host_.size();
    }
    // Retire the FIFO prefix that overlaps the skipped tail or the new range (see the class
    // comment): the tail holds the oldest regions, then the new range meets the next oldest in
    // address order, so looking at the front alone finds them all, in O(retired) time.
    while (!busy_.empty() &&
           (overlaps(busy_.front(), head_, tail_end) || overlaps(busy_.front(), start, start + bytes))) {
      STRATA_CUDA_TRY(cudaEventSynchronize(busy_.front().done.get()));
      busy_.pop_front();
    }
    assert(std::none_of(busy_.begin(), busy_.end(), [&](busy_region const& r) {
      return overlaps(r, start, start + bytes) || overlaps(r, head_, tail_end);
    }));
    pending_ = {start, start + bytes};
    head_ = start + bytes;
    return {host_.data() + start, device_.data() + start, bytes};
  }

  /// @brief Copies the region's host bytes to its device view on `stream`.
  static void upload(region const& r, std::size_t bytes, cudaStream_t stream)
  {
    assert(bytes <= r.bytes);
    STRATA_CUDA_TRY(cudaMemcpyAsync(r.device, r.host, bytes, cudaMemcpyHostToDevice, stream));
  }

  /// @brief The last acquired region stays busy until the work now enqueued on `stream` is done.
  void release_after(cudaStream_t stream)
  {
    cuda_event done;
    done.record(stream);
    busy_.push_back({pending_.begin, pending_.end, std::move(done)});
  }

  /**
   * @brief For error paths: like `release_after`, but never throws; if the event cannot be
   *        recorded, waits for `stream` (and failing that, the device) before forgetting the region.
   */
  void release_after_noexcept(cudaStream_t stream) noexcept
  {
    try {
      release_after(stream);
    } catch (...) {
      if (cudaStreamSynchronize(stream) != cudaSuccess) {
        (void)cudaGetLastError();
        (void)cudaDeviceSynchronize();
        (void)cudaGetLastError();
      }
    }
  }

  /// @brief Bytes of ring space (host and device views always have the same size).
  [[nodiscard]] std::size_t size() const noexcept { return host_.size(); }

 private:
  struct span_t {
    std::size_t begin, end;
  };
  struct busy_region {
    std::size_t begin, end;
    cuda_event done;
  };
  static bool overlaps(busy_region const& r, std::size_t begin, std::size_t end)
  { return r.begin < end && begin < r.end; }
  // Strong guarantee: both views are allocated before anything changes, so a failed allocation
  // leaves the ring exactly as it was (host and device views of the same size).
  void grow(std::size_t bytes)
  {
    pinned_buffer host{bytes};
    device_buffer device{bytes};
    for (auto& r : busy_) {
      STRATA_CUDA_TRY(cudaEventSynchronize(r.done.get()));
    }
    busy_.clear();
    host_ = std::move(host);
    device_ = std::move(device);
    assert(host_.size() == device_.size());
    head_ = 0;
  }
  void synchronize_all() noexcept
  {
    for (auto& r : busy_) {
      if (cudaEventSynchronize(r.done.get()) != cudaSuccess) { (void)cudaGetLastError(); }
    }
  }

  std::size_t capacity_;
  pinned_buffer host_;
  device_buffer device_;
  std::size_t head_{};
  span_t pending_{};
  std::deque<busy_region> busy_;
};

}  // namespace strata::detail
