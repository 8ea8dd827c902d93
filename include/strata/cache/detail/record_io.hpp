// SPDX-License-Identifier: Apache-2.0
/**
 * @file cache/detail/record_io.hpp
 * @brief The host side of a submission's record I/O, off the caller's thread: reads and writes on
 *        an `async_record_store`'s own I/O queues, and jobs on an executor's record thread (records
 *        to or from memory that is not page-first, through staging). Executors start it in `submit`
 *        and finish it when polled, so that no caller waits for a disk.
 */
#pragma once

#include <strata/cache/detail/records.hpp>
#include <strata/detail/thread_pool.hpp>
#include <strata/error.hpp>
#include <strata/tier/concepts.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

namespace strata::detail {

/**
 * @brief The record I/O of one submission. `read` and `write` start a record store's transfer (on
 *        an `async_record_store`'s own queues; another store moves its records at once), `run`
 *        starts a job on one of the executor's threads, and `poll` finishes them: from any thread,
 *        never blocking unless asked (while another thread finishes it, it says `pending`). What
 *        the I/O reads into or writes from must stay put until `poll` says it finished (the prefix
 *        index pins those pages while the submission is pending).
 */
class record_io {
 public:
  /// @brief Starts reading the records of `legs` into `legs.at`, checking keys where `d` has them.
  /// @throw strata::invalid_argument (or `std::bad_alloc`) when the read cannot start: nothing started
  template <record_store S>
  void read(S& store, record_legs const& legs, direction const& d, char const* who)
  {
    op o{S::kind, true, legs.from, who};
    if constexpr (async_record_store<S>) {
      o.intact.reset(new bool[legs.from.size()]);
      o.step = [&store](op& x, bool block) {
        std::span<bool> const intact{x.intact.get(), x.slots.size()};
        io_status const st = block ? (store.wait(x.ticket, intact) ? io_status::succeeded : io_status::failed)
                                   : store.poll(x.ticket, intact);
        if (st == io_status::failed) { x.lose_all_but_intact(); }
        return st;
      };
      started(o, [&] { return store.submit_read(legs.from, legs.at, std::span<std::uint64_t const>{d.keys}); });
      return;
    } else {
      o.done = true;
      try {
        read_records(store, legs, d, who);
      } catch (records_unread const& e) {
        o.lost = e.slots;
      }
    }
    push(std::move(o));
  }

  /// @brief Starts writing the records `legs.at` to the slots `legs.to`, with what `d` says of each page.
  /// @throw as `read`
  template <record_store S>
  void write(S& store, record_legs const& legs, direction const& d, char const* who)
  {
    op o{S::kind, false, legs.to, who};
    if constexpr (async_record_store<S>) {
      auto const sources = legs.sources();
      std::span<std::uint64_t const> const keys{d.keys}, parents{d.parent_keys};
      o.step = [&store](op& x, bool block) {
        io_status const st =
            block ? (store.wait(x.ticket, {}) ? io_status::succeeded : io_status::failed) : store.poll(x.ticket, {});
        if (st == io_status::failed) { x.write_failed = true; }
        return st;
      };
      started(o, [&] {
        return store.submit_write(legs.to, std::span<std::byte const* const>{sources}, keys,
                                  keys.empty() ? keys : parents, std::span<std::int32_t const>{d.ids});
      });
      return;
    } else {
      o.done = true;
      o.write_failed = !write_records(store, legs, d);
    }
    push(std::move(o));
  }

  /**
   * @brief Starts `work` on `thread` (`urgent`: before the thread's other jobs). `work` moves the
   *        records of tier `t`; it throws `records_unread` naming what a read lost, anything else
   *        for another failure (which fails the submission without losing records).
   * @throw std::bad_alloc when the job cannot be queued: nothing started
   */
  void run(thread_pool& thread, bool urgent, tier t, std::function<void()> work, char const* who)
  {
    auto const done = std::make_shared<job_state>();
    op o{t, false, {}, who};
    o.step = [done](op& x, bool block) {
      std::unique_lock lock{done->m};
      if (block) {
        done->cv.wait(lock, [&] { return done->finished; });
      }
      if (!done->finished) { return io_status::pending; }
      if (!done->error) { return io_status::succeeded; }
      try {
        std::rethrow_exception(done->error);
      } catch (records_unread const& e) {
        x.is_read = true;
        x.store = e.from;
        x.slots = e.slots;
        x.lost = e.slots;
      } catch (...) {
        x.error = std::current_exception();
      }
      return io_status::failed;
    };
    std::lock_guard lock{m_};
    ops_.push_back(std::move(o));  // first, so that a job that cannot be queued leaves nothing behind
    try {
      thread.post(urgent, [done, work = std::move(work)](int) {
        std::exception_ptr e;
        try {
          work();
        } catch (...) {
          e = std::current_exception();
        }
        {
          std::lock_guard l{done->m};
          done->finished = true;
          done->error = std::move(e);
        }
        done->cv.notify_all();
      });
    } catch (...) {
      ops_.pop_back();
      throw;
    }
  }

  /// @brief Whether nothing was started.
  [[nodiscard]] bool empty() const
  {
    std::lock_guard lock{m_};
    return ops_.empty();
  }

  /**
   * @brief `pending` while some read, write or job still moves (`block`: waits for them all
   *        instead), then `succeeded`, or `failed` when a read lost records, a write failed or a
   *        job failed (`error`). Without `block` it never waits, not even for another thread
   *        finishing the same I/O (that one says how it ended).
   */
  [[nodiscard]] io_status poll(bool block) noexcept
  {
    std::unique_lock lock{m_, std::defer_lock};
    if (block) {
      lock.lock();
    } else if (!lock.try_lock()) {
      return io_status::pending;
    }
    if (finished_) { return error_ ? io_status::failed : io_status::succeeded; }
    for (auto& o : ops_) {
      if (o.done) { continue; }
      try {
        if (o.step(o, block) == io_status::pending) { return io_status::pending; }
        o.done = true;
      } catch (...) {  // the store refused the ticket: nothing of it is known intact
        o.done = true;
        o.intact.reset();
        try {
          o.lose_all_but_intact();
        } catch (...) {
          o.write_failed = true;  // no memory to name the slots: the submission fails all the same
        }
      }
    }
    finished_ = true;
    try {
      error_ = outcome();
    } catch (...) {
      error_ = std::current_exception();
    }
    return error_ ? io_status::failed : io_status::succeeded;
  }

  /// @brief Once `poll` said `failed`: `records_unread` naming the slots a read lost (the first
  ///        that lost some), else the error of a failed write or job; null otherwise.
  [[nodiscard]] std::exception_ptr error() const
  {
    std::lock_guard lock{m_};
    return error_;
  }

 private:
  struct job_state {
    std::mutex m;
    std::condition_variable cv;
    bool finished = false;
    std::exception_ptr error;
  };
  struct op {
    op(tier t, bool read, std::vector<std::int64_t> s, char const* w)
        : store{t}, is_read{read}, slots{std::move(s)}, who{w}
    {
    }
    tier store;
    bool is_read;
    std::vector<std::int64_t> slots;
    char const* who;
    std::function<io_status(op&, bool)> step;  // poll, or wait (`block`); null: done when started
    io_ticket ticket{};                        // an asynchronous store's transfer
    std::unique_ptr<bool[]> intact;            // a read's, per record
    bool done = false;
    bool write_failed = false;
    std::vector<std::int64_t> lost;
    std::exception_ptr error;  // a job's failure other than lost records
    /// A failed read loses the records not intact (all, without statuses); a write fails.
    void lose_all_but_intact()
    {
      if (!is_read) {
        write_failed = true;
        return;
      }
      for (std::size_t i = 0; i < slots.size(); ++i) {
        if (!intact || !intact[i]) { lost.push_back(slots[i]); }
      }
    }
  };

  void push(op o)
  {
    std::lock_guard lock{m_};
    ops_.push_back(std::move(o));
  }
  /// Records `o` and starts its transfer (`submit` returns the store's ticket): room for it is
  /// made first, so that once the store has started the transfer nothing can fail before it is
  /// recorded (a transfer the log lost would run on into pages handed back).
  template <class Submit>
  void started(op& o, Submit&& submit)
  {
    std::lock_guard lock{m_};
    ops_.reserve(ops_.size() + 1);  // may throw: nothing started
    o.ticket = submit();            // may throw: nothing started
    ops_.push_back(std::move(o));   // within the capacity reserved: does not throw
  }

  [[nodiscard]] std::exception_ptr outcome() const
  {
    for (auto const& o : ops_) {
      if (o.is_read && !o.lost.empty()) {
        return std::make_exception_ptr(records_unread(
            concat("strata: ", o.who, ": ", o.lost.size(), " of ", o.slots.size(), " records read from the ",
                   to_string(o.store), " tier did not arrive intact (a miss)"),
            o.store, o.lost));
      }
    }
    for (auto const& o : ops_) {
      if (o.write_failed) {
        return std::make_exception_ptr(strata::error(concat("strata: ", o.who, ": writing ", o.slots.size(),
                                                            " records to the ", to_string(o.store), " tier failed")));
      }
    }
    for (auto const& o : ops_) {
      if (o.error) { return o.error; }
    }
    return nullptr;
  }

  mutable std::mutex m_;
  std::vector<op> ops_;
  bool finished_ = false;
  std::exception_ptr error_;
};

/// @brief The record I/O of an executor's submissions not yet seen finished, for `wait_all`
///        (synchronize, shutdown: the stores' and the executor's threads write into the tiers'
///        memory). Any thread.
class record_io_log {
 public:
  /// @brief Keeps `io` until it is seen finished (those seen finished now leave).
  void add(std::shared_ptr<record_io> io)
  {
    std::lock_guard lock{m_};
    std::erase_if(io_, [](auto const& x) { return x.second->poll(false) != io_status::pending; });
    io_.emplace_back(++added_, std::move(io));
  }
  /// @brief Blocks until the record I/O of every submission added so far finished. Callers on
  ///        several threads each wait for all of it (an entry leaves the log only once finished),
  ///        and none waits for what was added after it was called. Takes no memory of its own.
  void wait_all() noexcept
  {
    std::uint64_t last;
    {
      std::lock_guard lock{m_};
      last = added_;
    }
    for (;;) {
      std::shared_ptr<record_io> next;  // the first entry added by then still moving
      {
        std::lock_guard lock{m_};
        for (auto const& [n, x] : io_) {
          if (n <= last && x->poll(false) == io_status::pending) {
            next = x;
            break;
          }
        }
      }
      if (!next) { return; }
      (void)next->poll(true);
    }
  }

 private:
  std::mutex m_;
  std::vector<std::pair<std::uint64_t, std::shared_ptr<record_io>>> io_;  // by when added
  std::uint64_t added_ = 0;
};

}  // namespace strata::detail
