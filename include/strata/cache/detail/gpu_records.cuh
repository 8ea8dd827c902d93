// SPDX-License-Identifier: Apache-2.0
/**
 * @file cache/detail/gpu_records.cuh
 * @brief A `gpu_executor`'s record thread: moves records between a record store (a file tier) and
 *        the device, chunk by chunk through a bounded pinned staging buffer of its own, so that
 *        neither the engine's thread nor the controller's lock waits for a disk.
 */
#pragma once

#include <strata/cache/detail/records.hpp>
#include <strata/cuda.cuh>
#include <strata/detail/thread_pool.hpp>
#include <strata/layout/page_first.hpp>
#include <strata/transfer/backend.cuh>
#include <strata/transfer/dma_batch.cuh>
#include <strata/transfer/gpu_assisted.cuh>
#include <strata/transfer/staged.cuh>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <tuple>
#include <vector>

namespace strata::detail {

/// The backends of one kind of copy (loads, background copies), one instance each.
using gpu_backend_set = std::tuple<gpu_assisted, dma_batch, staged>;

/**
 * @brief One thread, its backends and its pinned staging (two halves: the next chunk of records is
 *        read, or written, while the one before crosses PCIe). A `gpu_executor` has two, one for
 *        loads and one for background copies, so that a load never queues behind a backup. Jobs
 *        run in order on the thread (`pool()`); only they touch the backends and the staging.
 */
class gpu_record_thread {
 public:
  /**
   * @param device where the thread enqueues its copies
   * @param staging_bytes the staging's size, two halves of at least one page each
   */
  gpu_record_thread(int device, std::int64_t staging_bytes, gpu_assisted_config kernel, dma_batch_config dma,
                    staged_config st)
      : backends_{kernel, dma, st}, device_{device}, staging_bytes_{staging_bytes}
  {
  }
  gpu_record_thread(gpu_record_thread const&) = delete;
  gpu_record_thread& operator=(gpu_record_thread const&) = delete;
  /// @brief Runs the jobs posted (the executor waits for them first), then frees the staging.
  ~gpu_record_thread() = default;

  /// @brief Where jobs are posted.
  [[nodiscard]] thread_pool& pool() noexcept { return pool_; }

  /**
   * @brief On the thread: the records of `d` from `src` into device store `dst`, on `s`. Each
   *        chunk is read (the store's queues do the I/O; this thread waits), then copied by
   *        `enqueue(plan, s, backends)` while the next chunk is read. From an
   *        `async_record_store`, the next chunk's read is queued before this thread waits for the
   *        current one, so that the store always has a read of the load to run: a drive starts no
   *        write while a read runs on it, and a gap between chunks would let backups in.
   * @throw records_unread naming the slots a read lost (the chunks before it were enqueued: the
   *        caller synchronizes `s` before it reports the failure; a read queued after it has landed)
   */
  template <class S, class D, class Enqueue>
  void load(S& src, D& dst, direction const& d, cudaStream_t s, Enqueue&& enqueue)
  {
    kv_geometry const g = src.geometry();
    std::size_t const per = chunk_pages(g);
    std::size_t const n = d.pairs.size();
    auto const copy_in = [&](std::span<page_pair const> out, page_first const& records, std::size_t half) {
      enqueue(copy_plan{records, dst.layout(), out, layer_range::all(g)}, s, backends_);
      STRATA_CUDA_TRY(cudaEventRecord(half_free_[half].get(), s));
    };
    if constexpr (async_record_store<S>) {
      (void)staging_half(g, 0);  // allocated (or grown) now, while no read is in flight
      auto const start = [&](std::size_t at, std::size_t half) {
        return start_read(src, slice(d, at, std::min(per, n - at)), staging_half(g, half));
      };
      std::optional<record_read> current{start(0, 0)};
      for (std::size_t at = 0, half = 0; at < n; at += per, half ^= 1) {
        std::optional<record_read> next;
        try {
          if (at + per < n) { next.emplace(start(at + per, half ^ 1)); }
          finish_read(src, *current, "gpu_executor");
          copy_in(current->legs.out, staging_half(g, half), half);
        } catch (...) {
          // A failed read or copy: the next chunk's read goes on into the other staging half (and
          // holds its slots in flight) until waited for.
          if (next) {  // it reads into the staging: let it land before the failure is reported
            std::span<bool> const intact{next->intact.get(), next->legs.from.size()};
            try {
              (void)src.wait(next->ticket, intact);
            } catch (...) {  // the first failure is the one reported
            }
          } else if (at + per < n) {  // `next` could not start: `current` is still in flight
            try {
              finish_read(src, *current, "gpu_executor");
            } catch (...) {
            }
          }
          throw;
        }
        current = std::move(next);
      }
    } else {
      for (std::size_t at = 0, half = 0; at < n; at += per, half ^= 1) {
        direction const part = slice(d, at, std::min(per, n - at));
        page_first const records = staging_half(g, half);
        record_legs const legs{part.pairs, records};
        read_records(src, legs, part, "gpu_executor");
        copy_in(legs.out, records, half);
      }
    }
  }

  /**
   * @brief On the thread: the pages of `d` from device store `src` into record store `dst`. Each
   *        chunk is copied out on `s`, then written (this thread waits for the store) while the
   *        next one is copied out.
   * @throw strata::error when a write fails
   */
  template <class S, class D, class Enqueue>
  void store(S& src, D& dst, direction const& d, cudaStream_t s, Enqueue&& enqueue)
  {
    kv_geometry const g = src.geometry();
    std::size_t const per = chunk_pages(g);
    struct chunk {
      direction part;
      record_legs legs;
    };
    auto const copy_out = [&](std::size_t at, std::size_t half) {
      direction part = slice(d, at, std::min(per, d.pairs.size() - at));
      page_first const records = staging_half(g, half);
      record_legs legs{part.pairs, records};
      enqueue(copy_plan{src.layout(), records, std::span<page_pair const>{legs.in}, layer_range::all(g)}, s, backends_);
      STRATA_CUDA_TRY(cudaEventRecord(half_free_[half].get(), s));
      return chunk{std::move(part), std::move(legs)};
    };
    std::optional<chunk> current{copy_out(0, 0)};
    for (std::size_t at = 0, half = 0; at < d.pairs.size(); at += per, half ^= 1) {
      STRATA_CUDA_TRY(cudaEventSynchronize(half_free_[half].get()));  // its copy-out landed
      std::optional<chunk> next;
      if (at + per < d.pairs.size()) { next.emplace(copy_out(at + per, half ^ 1)); }
      STRATA_EXPECTS_AS(error, write_records(dst, current->legs, current->part), "gpu_executor: writing ",
                        current->part.pairs.size(), " records to the ", to_string(D::kind), " tier failed");
      current = std::move(next);
    }
  }

  /// @brief On the thread, before its copies: the executor's device.
  void bind() const { STRATA_CUDA_TRY(cudaSetDevice(device_)); }

 private:
  /// Pages a staging half holds: half the staging, at least one page.
  [[nodiscard]] std::size_t chunk_pages(kv_geometry const& g) const
  { return std::size_t(std::max<std::int64_t>(1, staging_bytes_ / 2 / g.page_bytes())); }

  /// Staging half `half` as page-first records, once the last copy using it has landed. Allocated
  /// at first use (grown for a larger page: both halves' users land first).
  page_first staging_half(kv_geometry const& g, std::size_t half)
  {
    auto const per = std::int64_t(chunk_pages(g));
    auto const bytes = std::size_t(2 * per * g.page_bytes());
    if (staging_.size() < bytes) {
      for (auto const& e : half_free_) {
        STRATA_CUDA_TRY(cudaEventSynchronize(e.get()));
      }
      staging_ = pinned_buffer{};  // the old one goes first: pinned memory is scarce
      staging_ = pinned_buffer{bytes};
    }
    STRATA_CUDA_TRY(cudaEventSynchronize(half_free_[half].get()));  // never recorded: returns at once
    return page_first{staging_.data() + half * std::size_t(per * g.page_bytes()), g, per};
  }

  gpu_backend_set backends_;
  int device_;
  std::int64_t staging_bytes_;
  pinned_buffer staging_;
  std::array<cuda_event, 2> half_free_;  // recorded after the last copy that uses each half
  thread_pool pool_{1};                  // last: joined before the rest goes
};

}  // namespace strata::detail
