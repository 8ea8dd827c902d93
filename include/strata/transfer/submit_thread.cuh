// SPDX-License-Identifier: Apache-2.0
/**
 * @file transfer/submit_thread.cuh
 * @brief A dedicated thread that submits transfers, so that the engine's thread never blocks on a
 *        backend whose submission costs CPU time (`dma_batch`: ~0.5 µs per descriptor).
 */
#pragma once

#include <strata/transfer/backend.cuh>
#include <strata/transfer/sm_partition.cuh>

#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

namespace strata {

/// @brief What a transfer is for, which decides the order a `submit_thread` serves it in.
enum class transfer_kind {
  load,    ///< on the critical path (`wait_layer` waits for it): served first
  backup,  ///< off the critical path: served when no load is waiting
};

/**
 * @brief Runs backends' `enqueue` on its own thread.
 *
 * `submit` validates the plan, copies its page list, records an event on the caller's stream (the
 * transfer starts after the work already there, e.g. the kernels writing pages being backed up) and
 * returns at once. The thread serves loads before backups: a per-layer backup yields to waiting
 * loads between its layers, so `wait_layer` never waits behind a backup longer than one layer's
 * enqueue. It enqueues a per-layer transfer one layer at a time and publishes each layer's event as
 * soon as it is recorded, so `wait_layer` on layer 0 blocks only until layer 0 is enqueued.
 *
 * The copy is issued on a stream of the thread's at the caller's stream priority, and in the caller's
 * stream's green context when it has one (`sm_partition::copy_stream()`: copy kernels stay on the
 * copy partition); the thread keeps one such stream per (context, priority) until it stops, so an
 * `sm_partition` whose copy stream submitted here must outlive the thread (as it must a `staged`
 * that relayed on it). Errors, creating those streams included, reach whoever waits on the handle.
 * The backend must outlive the transfer (the page list need not: the job owns a copy), and a backend
 * given to a submit thread must not be used by another thread meanwhile.
 */
class submit_thread {
 public:
  /**
   * @brief Starts the thread on `device` (-1: the current device), where its streams live.
   * @throw strata::invalid_argument for a device that does not exist; strata::cuda_error if the
   *        devices cannot be read; std::system_error if no thread starts
   */
  explicit submit_thread(int device = -1) : device_{device}
  {
    if (device_ < 0) { device_ = current_device(); }
    detail::require_device(device_, "submit_thread");
    worker_ = std::thread{[this] { run(); }};
  }
  /// @brief The device its streams live on.
  [[nodiscard]] int device() const noexcept { return device_; }
  submit_thread(submit_thread const&) = delete;
  submit_thread& operator=(submit_thread const&) = delete;
  /// @brief Finishes enqueueing what was submitted, waits for it on the thread's streams, then stops.
  ~submit_thread()
  {
    {
      std::lock_guard lock{m_};
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  /**
   * @brief Validates `plan` and hands it to the thread; returns its handle at once.
   * @param kind loads are served before backups
   * @throw strata::invalid_argument for a bad plan, before anything is enqueued
   * @throw strata::cuda_error if the caller's stream cannot be queried or recorded on
   */
  template <transfer_backend B, kv_layout Src, kv_layout Dst>
  transfer_handle submit(B& backend, copy_plan<Src, Dst> const& plan, cuda::stream_ref stream,
                         completion c = completion::per_layer, transfer_kind kind = transfer_kind::load)
  {
    validate(plan);
    transfer_handle h{plan.layers, c};
    int priority = 0;
    STRATA_CUDA_TRY(cudaStreamGetPriority(stream.get(), &priority));
    auto j = std::make_unique<job_impl<B, Src, Dst>>(backend, plan, c);
    j->handle = h;
    j->priority = priority;
    j->ctx = detail::green_context_of(stream.get());
    j->start.record(stream.get());
    {
      std::lock_guard lock{m_};
      (kind == transfer_kind::load ? loads_ : backups_).push_back(std::move(j));
    }
    cv_.notify_all();  // not one: glibc can lose a single signal (detail/thread_pool.hpp)
    return h;
  }

  /// @brief Blocks until every transfer submitted so far has been enqueued (not completed).
  void drain()
  {
    std::unique_lock lock{m_};
    idle_cv_.wait(lock, [this] { return loads_.empty() && backups_.empty() && !busy_; });
  }

 private:
  struct job {
    virtual ~job() = default;
    /// Enqueues the next part (a layer, or the whole transfer) on `s`; true when nothing is left.
    virtual bool step(cudaStream_t s) = 0;
    transfer_handle handle;
    cuda_event start;
    int priority{};
    CUgreenCtx ctx{};
    bool started{false};
  };

  template <class B, class Src, class Dst>
  struct job_impl final : job {
    job_impl(B& b, copy_plan<Src, Dst> const& plan, completion c)
        : backend{b},
          src{plan.src},
          dst{plan.dst},
          pages(plan.pages.begin(), plan.pages.end()),
          layers{plan.layers},
          per_layer{c == completion::per_layer},
          next{plan.layers.begin}
    {
    }
    bool step(cudaStream_t s) override
    {
      std::span<page_pair const> const p{pages};
      auto const events = handle.events();
      if (!per_layer) {
        backend.enqueue(copy_plan{src, dst, p, layers}, s, {});
        STRATA_CUDA_TRY(cudaEventRecord(events[0], s));
        handle.mark_recorded(1);
        return true;
      }
      std::size_t const i = static_cast<std::size_t>(next - layers.begin);
      backend.enqueue(copy_plan{src, dst, p, layer_range::one(next)}, s, events.subspan(i, 1));
      handle.mark_recorded(i + 1);
      return ++next == layers.end;
    }
    B& backend;
    Src src;
    Dst dst;
    std::vector<page_pair> pages;
    layer_range layers;
    bool per_layer;
    std::int64_t next;
  };

  // The stream a job's copy is issued on: the caller's priority, and its green context if any. One
  // per (context, priority), kept: jobs of one kind stay in order on it (a later job's handle
  // covers the earlier ones), and the thread waits for all of them when it stops.
  cudaStream_t stream_for(job& j)
  {
    auto it = streams_.find({j.ctx, j.priority});
    if (it == streams_.end()) {
      it = streams_.emplace(std::pair{j.ctx, j.priority}, detail::context_stream{j.ctx, j.priority}).first;
    }
    return it->second.get();
  }

  void run()
  {
    // Without its device the thread can enqueue nothing: every job fails with the reason.
    std::exception_ptr no_device;
    if (cudaError_t const e = cudaSetDevice(device_); e != cudaSuccess) {
      (void)cudaGetLastError();
      no_device = std::make_exception_ptr(cuda_error(
          detail::concat("strata: submit_thread: cudaSetDevice(", device_, ") failed: ", cudaGetErrorName(e))));
    }
    for (;;) {
      job* j = nullptr;
      bool load = false;
      {
        std::unique_lock lock{m_};
        cv_.wait(lock, [this] { return stop_ || !loads_.empty() || !backups_.empty(); });
        if (loads_.empty() && backups_.empty()) { break; }
        load = !loads_.empty();
        j = (load ? loads_ : backups_).front().get();  // only the worker pops: it stays valid
        busy_ = true;
      }
      bool finished = true;
      cudaStream_t s = nullptr;
      try {
        if (no_device) { std::rethrow_exception(no_device); }
        s = stream_for(*j);
        if (!j->started) {
          STRATA_CUDA_TRY(cudaStreamWaitEvent(s, j->start.get(), 0));
          j->started = true;
        }
        finished = j->step(s);
      } catch (...) {
        // Layers enqueued before the failure may still be writing: a failed handle must mean that
        // nothing of the transfer moves any more (its pages are reused once it is cancelled).
        if (s != nullptr) { (void)cudaStreamSynchronize(s); }
        j->handle.fail(std::current_exception());
        finished = true;
      }
      std::unique_ptr<job> done;
      {
        std::lock_guard lock{m_};
        auto& q = load ? loads_ : backups_;
        if (finished) {
          done = std::move(q.front());
          q.pop_front();
        }
        busy_ = false;
      }
      done.reset();
      idle_cv_.notify_all();
    }
    for (auto& [priority, s] : streams_) {
      if (cudaStreamSynchronize(s.get()) != cudaSuccess) { (void)cudaGetLastError(); }
    }
    streams_.clear();
  }

  int device_{};
  std::mutex m_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::unique_ptr<job>> loads_, backups_;
  bool stop_{false};
  bool busy_{false};
  // The worker's own, by green context (null: none) and priority (worker thread only).
  std::map<std::pair<CUgreenCtx, int>, detail::context_stream> streams_;
  std::thread worker_;
};

}  // namespace strata
