// SPDX-License-Identifier: Apache-2.0
/**
 * @file tier/detail/file_store/uring_runs.inl
 * @brief Member definitions of `file_store` (tier/file_store.hpp, which includes this file) for its
 *        io_uring back end: starting a run of adjacent records, reaping completions, and cancelling
 *        or abandoning runs past `io_timeout_ms`.
 */
#pragma once

namespace strata {

#ifdef STRATA_FILE_STORE_URING
inline auto file_store::start_uring_run(std::shared_ptr<batch> const& b,
                                        std::shared_ptr<std::vector<std::size_t> const> const& order,
                                        std::pair<std::size_t, std::size_t> r) -> bool
{
  auto u = std::make_unique<uring_run>();
  u->b = b;
  u->order = order;
  u->first = r.first;
  u->last = r.second;
  // A read lands in the run's own staging: never straight in the caller's memory (see io_timeout_ms).
  u->staged = prepare_run(*b, u->run(), u->buf, u->iov, /*stage=*/true);  // may throw: the batch fails (launch)
  for (auto const& v : u->iov) {
    u->bytes += v.iov_len;
  }
  u->staging = b->write ? 0 : u->bytes;
  auto const budget = static_cast<std::size_t>(options_.uring_staging_bytes);
  while (ring_->in_flight() + 1 >= ring_->entries() ||
         (u->staging > 0 && uring_staged_ > 0 && uring_staged_ + u->staging > budget)) {
    reap(true);
    if (ring_gave_up_) { return false; }
  }
  auto const [file, off] = where(b->items[u->run()[0]].slot);
  int const fd =
      options_.io.uring_target != nullptr ? options_.io.uring_target(options_.io.context, b->write, file) : file;
  auto const id = next_run_++;
  u->started = std::chrono::steady_clock::now();
  std::size_t const staged = u->staging;
  auto const& run = *uring_runs_.emplace(id, std::move(u)).first->second;  // before the kernel sees it
  uring_staged_ += staged;  // once the run is kept: a failed emplace leaves the budget whole
  ring_->push(b->write, fd, run.iov.data(), static_cast<unsigned>(run.iov.size()), off, id);
  (void)ring_->enter(false);  // a refused submission is retried by the next reap
  return true;
}

inline auto file_store::reap(bool block) -> void
{
  for (int tries = 0;;) {
    std::uint64_t user = 0;
    std::int32_t result = 0;
    bool got = false;
    while (ring_->next(user, result)) {
      got = true;
      complete_uring_run(user, result);
    }
    if (!block && ring_->pending() > 0) { (void)ring_->enter(false); }
    auto const now = std::chrono::steady_clock::now();
    expire_uring_runs(now);
    if (got || !block || uring_runs_.empty()) { return; }
    // Wait for a completion, at most until the next run falls due.
    auto const timeout = std::chrono::milliseconds(options_.io_timeout_ms);
    auto due = now + timeout;
    for (auto const& [id, u] : uring_runs_) {
      due = std::min(due, u->cancelled.value_or(u->started) + timeout);
    }
    auto const wait = std::chrono::duration_cast<std::chrono::microseconds>(due - now);
    int const e = ring_->wait_for(std::max(wait, std::chrono::microseconds(100)));
    if (e == 0 || e == ETIME || e == EINTR) { continue; }
    STRATA_EXPECTS_AS(file_store_error, (e == EAGAIN || e == EBUSY || e == ENOMEM) && ++tries < 100000,
                      "file_store: io_uring_enter failed: ", detail::errno_text(e));
    std::this_thread::yield();
  }
}

inline auto file_store::expire_uring_runs(std::chrono::steady_clock::time_point now) -> void
{
  auto const timeout = std::chrono::milliseconds(options_.io_timeout_ms);
  for (auto it = uring_runs_.begin(); it != uring_runs_.end();) {
    uring_run& u = *it->second;
    if (!u.cancelled && now - u.started >= timeout && ring_->pending() + 1 < ring_->entries()) {
      ring_->push_cancel(it->first, it->first | cancel_tag);  // it completes, failed (ECANCELED), in a later reap
      (void)ring_->enter(false);
      u.cancelled = now;
      ring_gave_up_ = true;  // the I/O threads take every later transfer
      ++it;
    } else if (u.cancelled && now - *u.cancelled >= timeout) {
      // The kernel keeps it: its batch fails now, and its buffers are kept for good (a read's land
      // in them, not in the caller's memory).
      auto const run = u.run();
      auto& b = *u.b;
      b.fail(run, [&] {
        return detail::concat("file_store: an io_uring transfer of ", run.size(), " records did not complete in ",
                              options_.io_timeout_ms, " ms, nor when cancelled");
      });
      uring_staged_ -= u.staging;
      try {
        abandoned_.push_back(std::move(it->second));
      } catch (...) {
        (void)it->second.release();  // no memory to keep it: leaked all the same
      }
      it = uring_runs_.erase(it);
      {
        std::lock_guard lock{done_mutex_};
        b.remaining.fetch_sub(1);
      }
      done_cv_.notify_all();
    } else {
      ++it;
    }
  }
}

inline auto file_store::complete_uring_run(std::uint64_t id, std::int32_t result) -> void
{
  auto it = uring_runs_.find(id);
  if (it == uring_runs_.end()) { return; }  // a cancellation's, or an abandoned run's
  auto const u = std::move(it->second);
  uring_runs_.erase(it);
  uring_staged_ -= u->staging;
  if (options_.io.filter_completion != nullptr) {
    result = options_.io.filter_completion(options_.io.context, u->b->write, result);
  }
  auto& b = *u->b;
  auto const run = u->run();
  auto const first = b.items[run[0]].slot;
  auto const [fd, off] = where(first);
  int e = result < 0 ? -result : 0;
  if (e == 0 && static_cast<std::size_t>(result) < u->bytes) {  // short: the rest synchronously
    auto left = static_cast<std::size_t>(result);
    std::size_t i = 0;
    while (left >= u->iov[i].iov_len) {
      left -= u->iov[i++].iov_len;
    }
    u->iov[i].iov_base = static_cast<std::byte*>(u->iov[i].iov_base) + left;
    u->iov[i].iov_len -= left;
    e = detail::transfer_all(options_.io, b.write, fd, u->iov.data() + i, static_cast<int>(u->iov.size() - i),
                             off + static_cast<off_t>(result));
  }
  if (e == 0 && b.write && options_.sync_writes) { e = options_.io.sync(options_.io.context, fd) == 0 ? 0 : errno; }
  if (e != 0) {
    b.fail(run, [&] { return io_failure(b.write ? "write" : "read", first, run.size(), e); });
  } else if (!b.write) {
    verify_read(b, run, u->buf, u->staged);
  }
  {
    std::lock_guard lock{done_mutex_};
    b.remaining.fetch_sub(1);
  }
  done_cv_.notify_all();
}
#endif

}  // namespace strata
