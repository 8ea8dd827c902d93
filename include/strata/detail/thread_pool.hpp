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
///        for them) before the others (writes). The destructor runs every job posted, then joins.
class thread_pool {
 public:
  /// @throw std::system_error or std::bad_alloc when a thread cannot start (those started are joined)
  explicit thread_pool(int threads)
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
  /// As `post`; an `urgent` job runs before every job that is not, once a worker is free.
  void post(bool urgent, std::function<void(int)> job)
  {
    {
      std::lock_guard lock{mutex_};
      (urgent ? urgent_ : jobs_).push_back(std::move(job));
    }
    cv_.notify_one();
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
      {
        std::unique_lock lock{mutex_};
        cv_.wait(lock, [&] { return stop_ || !urgent_.empty() || !jobs_.empty(); });
        if (urgent_.empty() && jobs_.empty()) { return; }  // stopping, and every job ran
        auto& from = urgent_.empty() ? jobs_ : urgent_;
        job = std::move(from.front());
        from.pop_front();
      }
      job(worker);
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void(int)>> urgent_, jobs_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace strata::detail
