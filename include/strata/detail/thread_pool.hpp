// SPDX-License-Identifier: Apache-2.0
/**
 * @file detail/thread_pool.hpp
 * @brief Worker threads with two queues: the file tier's I/O threads (where io_uring is missing or
 *        refused), and the executors' record movers.
 */
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace strata::detail {

/// @brief Worker threads taking jobs `f(worker_index)` in order, urgent jobs (reads: someone waits
///        for them) before the others (writes), and by default no other job starting while an
///        urgent one runs: on a drive, a read then shares the device only with the writes already
///        under way when it came. The destructor runs every job posted, then joins.
class thread_pool {
 public:
  /// Whether a job that is not urgent waits while an urgent one runs (`yes`: the jobs share one
  /// device, a drive; `no`: they do not, as a network store's connections, and an idle worker takes
  /// the next job of either queue, urgent ones first, but of several workers one is kept for urgent
  /// jobs: long writes never hold every worker while a read waits).
  enum class others_wait : bool { no, yes };
  /// @throw std::system_error or std::bad_alloc when a thread cannot start (those started are joined)
  explicit thread_pool(int threads, others_wait wait = others_wait::yes)
      : others_wait_{wait == others_wait::yes}, others_max_{threads > 1 ? threads - 1 : 1}
  {
    try {
      threads_.reserve(static_cast<std::size_t>(threads));
      for (int i = 0; i < threads; ++i) {
        threads_.emplace_back([this, i] { run(i); });
      }
    } catch (...) {
      stop_and_join();
      throw;
    }
  }
  thread_pool(thread_pool const&) = delete;
  thread_pool& operator=(thread_pool const&) = delete;
  ~thread_pool() { stop_and_join(); }
  /// Jobs must not throw (an exception leaving one ends the process).
  void post(std::function<void(int)> job) { post(false, std::move(job)); }
  /// As `post`; an `urgent` job runs before every job that is not, once a worker is free, and a job
  /// that is not urgent waits while an urgent one runs (unless `others_wait::no`).
  void post(bool urgent, std::function<void(int)> job)
  {
    {
      std::lock_guard lock{mutex_};
      (urgent ? urgent_ : jobs_).push_back(std::move(job));
    }
    // Every worker, not one: a caller that posts a job and then waits for it alone (the file store's
    // `wait`) must never depend on a single signal, which glibc's condition variable can lose (its
    // bug 25847; seen on Debian 12 as a posted job and three idle workers, all asleep). A few spare
    // wakeups cost nothing.
    cv_.notify_all();
  }
  [[nodiscard]] int size() const noexcept { return static_cast<int>(threads_.size()); }

 private:
  void stop_and_join() noexcept
  {
    {
      std::lock_guard lock{mutex_};
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) {
      t.join();
    }
  }
  void run(int worker)
  {
    for (;;) {
      std::function<void(int)> job;
      bool urgent = false;
      {
        std::unique_lock lock{mutex_};
        cv_.wait(lock, [&] {
          bool const other_may_start = others_wait_ ? urgent_running_ == 0 : others_running_ < others_max_;
          return !urgent_.empty() || (!jobs_.empty() && other_may_start) || (stop_ && jobs_.empty());
        });
        if (urgent_.empty() && jobs_.empty()) { return; }  // stopping, and every job ran
        urgent = !urgent_.empty();
        auto& from = urgent ? urgent_ : jobs_;
        job = std::move(from.front());
        from.pop_front();
        (urgent ? urgent_running_ : others_running_) += 1;
      }
      job(worker);
      {
        std::lock_guard lock{mutex_};
        (urgent ? urgent_running_ : others_running_) -= 1;
      }
      if (urgent || !others_wait_) { cv_.notify_all(); }  // the jobs that waited for it
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void(int)>> urgent_, jobs_;
  int urgent_running_ = 0, others_running_ = 0;
  bool const others_wait_;
  int const others_max_;  // with `others_wait::no`: most jobs that are not urgent running at once
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace strata::detail
