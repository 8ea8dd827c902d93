/**
 * @file transfer/submit_thread.cuh
 * @brief A dedicated thread that submits transfers, so that the engine's thread never blocks on a
 *        backend whose submission costs CPU time (`dma_batch`: ~0.5 µs per descriptor).
 */
#pragma once

#include <strata/transfer/backend.cuh>

#include <condition_variable>
#include <deque>
#include <functional>
#include <thread>

namespace strata {

/**
 * @brief Runs backends' `enqueue` on its own thread and stream.
 *
 * `submit` validates the plan, records an event on the caller's stream (the transfer starts after
 * the work already there, e.g. the kernels writing pages being backed up) and returns at once; the
 * thread enqueues the copy one layer at a time and publishes each layer's event as soon as it is
 * recorded, so `wait_layer` on layer 0 blocks only until layer 0 is enqueued. The plan's page list
 * and the backend must outlive the transfer; a backend given to a submit thread must not be used by
 * another thread meanwhile.
 */
class submit_thread {
 public:
  /// @brief Starts the thread on the current device.
  submit_thread()
  {
    STRATA_CUDA_TRY(cudaGetDevice(&device_));
    worker_ = std::thread{[this] { run(); }};
  }
  submit_thread(submit_thread const&) = delete;
  submit_thread& operator=(submit_thread const&) = delete;
  /// @brief Finishes enqueueing what was submitted, then stops the thread.
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
   * @throw strata::invalid_argument for a bad plan, before anything is enqueued
   */
  template <transfer_backend B, kv_layout Src, kv_layout Dst>
  transfer_handle submit(B& backend, copy_plan<Src, Dst> const& plan, cuda::stream_ref stream,
                         completion c = completion::per_layer)
  {
    validate(plan);
    transfer_handle h{plan.layers, c};
    auto start = std::make_shared<detail::cuda_event>();
    start->record(stream.get());
    auto job = [this, &backend, plan, h, c, start] {
      STRATA_CUDA_TRY(cudaStreamWaitEvent(stream_->get(), start->get(), 0));
      auto const events = h.events();
      if (c == completion::per_layer) {
        for (std::int64_t l = plan.layers.begin; l < plan.layers.end; ++l) {
          std::size_t const i = static_cast<std::size_t>(l - plan.layers.begin);
          backend.enqueue(copy_plan{plan.src, plan.dst, plan.pages, layer_range::one(l)}, stream_->get(),
                          events.subspan(i, 1));
          h.mark_recorded(i + 1);
        }
      } else {
        backend.enqueue(plan, stream_->get(), {});
        STRATA_CUDA_TRY(cudaEventRecord(events[0], stream_->get()));
        h.mark_recorded(1);
      }
    };
    {
      std::lock_guard lock{m_};
      jobs_.push_back({std::move(job), h});
    }
    cv_.notify_one();
    return h;
  }

  /// @brief Blocks until every transfer submitted so far has been enqueued (not completed).
  void drain()
  {
    std::unique_lock lock{m_};
    idle_cv_.wait(lock, [this] { return jobs_.empty() && !busy_; });
  }

 private:
  struct job {
    std::function<void()> run;
    transfer_handle handle;
  };

  void run()
  {
    if (cudaSetDevice(device_) != cudaSuccess) { (void)cudaGetLastError(); }
    detail::cuda_stream stream;
    stream_ = &stream;
    for (;;) {
      job j;
      {
        std::unique_lock lock{m_};
        cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) { break; }
        j = std::move(jobs_.front());
        jobs_.pop_front();
        busy_ = true;
      }
      try {
        j.run();
      } catch (...) {
        j.handle.fail(std::current_exception());
      }
      {
        std::lock_guard lock{m_};
        busy_ = false;
      }
      idle_cv_.notify_all();
    }
    (void)cudaStreamSynchronize(stream.get());
    stream_ = nullptr;
  }

  int device_{};
  std::mutex m_;
  std::condition_variable cv_, idle_cv_;
  std::deque<job> jobs_;
  bool stop_{false};
  bool busy_{false};
  detail::cuda_stream* stream_{};
  std::thread worker_;
};

}  // namespace strata
