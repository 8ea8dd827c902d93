// SPDX-License-Identifier: Apache-2.0
/**
 * @file tier/detail/file_store/io_uring_ring.hpp
 * @brief A minimal io_uring over raw system calls (no liburing), for the file tier; defines
 *        `STRATA_FILE_STORE_URING` where the kernel headers have it.
 */
#pragma once

#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#if __has_include(<linux/io_uring.h>) && defined(__NR_io_uring_setup)
#include <linux/io_uring.h>
#define STRATA_FILE_STORE_URING 1
#endif

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <thread>

namespace strata::detail {

#ifdef STRATA_FILE_STORE_URING
/**
 * @brief A minimal io_uring (raw system calls, no liburing), used under one lock: vectored reads
 *        and writes pushed to the submission queue, completions popped from the completion queue,
 *        waits bounded in time, and cancellation of an operation that does not complete.
 */
class io_uring_ring {
 public:
  /// @brief A ring of `entries` submissions, or nullptr where the kernel or a sandbox refuses io_uring.
  [[nodiscard]] static std::unique_ptr<io_uring_ring> create(unsigned entries) noexcept
  {
    std::unique_ptr<io_uring_ring> r{new (std::nothrow) io_uring_ring{}};
    if (!r) { return nullptr; }
    io_uring_params p{};
    long const fd = ::syscall(__NR_io_uring_setup, entries, &p);
    if (fd < 0) { return nullptr; }
    r->fd_ = static_cast<int>(fd);
    r->sq_bytes_ = p.sq_off.array + p.sq_entries * sizeof(std::uint32_t);
    r->cq_bytes_ = p.cq_off.cqes + p.cq_entries * sizeof(io_uring_cqe);
    bool const single = (p.features & IORING_FEAT_SINGLE_MMAP) != 0;
    if (single) { r->sq_bytes_ = r->cq_bytes_ = std::max(r->sq_bytes_, r->cq_bytes_); }
    r->sq_ =
        ::mmap(nullptr, r->sq_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd_, IORING_OFF_SQ_RING);
    if (r->sq_ == MAP_FAILED) {
      r->sq_ = nullptr;
      return nullptr;
    }
    if (single) {
      r->cq_ = r->sq_;
    } else {
      r->cq_ =
          ::mmap(nullptr, r->cq_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd_, IORING_OFF_CQ_RING);
      if (r->cq_ == MAP_FAILED) {
        r->cq_ = nullptr;
        return nullptr;
      }
    }
    r->sqes_bytes_ = p.sq_entries * sizeof(io_uring_sqe);
    void* sqes =
        ::mmap(nullptr, r->sqes_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd_, IORING_OFF_SQES);
    if (sqes == MAP_FAILED) { return nullptr; }
    r->sqes_ = static_cast<io_uring_sqe*>(sqes);
    auto* sq = static_cast<char*>(r->sq_);
    auto* cq = static_cast<char*>(r->cq_);
    r->sq_head_ = reinterpret_cast<unsigned*>(sq + p.sq_off.head);
    r->sq_tail_ = reinterpret_cast<unsigned*>(sq + p.sq_off.tail);
    r->sq_mask_ = *reinterpret_cast<unsigned*>(sq + p.sq_off.ring_mask);
    r->sq_array_ = reinterpret_cast<unsigned*>(sq + p.sq_off.array);
    r->cq_head_ = reinterpret_cast<unsigned*>(cq + p.cq_off.head);
    r->cq_tail_ = reinterpret_cast<unsigned*>(cq + p.cq_off.tail);
    r->cq_mask_ = *reinterpret_cast<unsigned*>(cq + p.cq_off.ring_mask);
    r->cqes_ = reinterpret_cast<io_uring_cqe*>(cq + p.cq_off.cqes);
    r->entries_ = p.sq_entries;
    r->ext_arg_ = (p.features & IORING_FEAT_EXT_ARG) != 0;
    return r;
  }
  io_uring_ring(io_uring_ring const&) = delete;
  io_uring_ring& operator=(io_uring_ring const&) = delete;
  ~io_uring_ring()
  {
    if (sqes_ != nullptr) { ::munmap(sqes_, sqes_bytes_); }
    if (cq_ != nullptr && cq_ != sq_) { ::munmap(cq_, cq_bytes_); }
    if (sq_ != nullptr) { ::munmap(sq_, sq_bytes_); }
    if (fd_ >= 0) { ::close(fd_); }
  }
  /// @brief Operations submitted and not yet completed, plus those pushed and not yet submitted.
  [[nodiscard]] unsigned in_flight() const noexcept { return in_flight_; }
  /// @brief Submission entries.
  [[nodiscard]] unsigned entries() const noexcept { return entries_; }
  /// @brief Operations pushed and not yet submitted.
  [[nodiscard]] unsigned pending() const noexcept { return pending_; }

  /// @brief Queues a vectored read or write; the caller keeps in_flight() below entries().
  void push(bool write, int fd, iovec const* iov, unsigned iovcnt, off_t offset, std::uint64_t user) noexcept
  {
    unsigned const tail = *sq_tail_;
    unsigned const index = tail & sq_mask_;
    io_uring_sqe& e = sqes_[index];
    std::memset(&e, 0, sizeof e);
    e.opcode = write ? IORING_OP_WRITEV : IORING_OP_READV;
    e.fd = fd;
    e.off = static_cast<std::uint64_t>(offset);
    e.addr = reinterpret_cast<std::uint64_t>(iov);
    e.len = iovcnt;
    e.user_data = user;
    sq_array_[index] = index;
    __atomic_store_n(sq_tail_, tail + 1, __ATOMIC_RELEASE);
    ++pending_;
    ++in_flight_;
  }

  /// @brief Submits what was pushed and, with `wait`, blocks until a completion is available.
  /// @return 0 or an error number
  int enter(bool wait) noexcept
  {
    for (;;) {
      unsigned const flags = wait ? IORING_ENTER_GETEVENTS : 0U;
      long const r = ::syscall(__NR_io_uring_enter, fd_, pending_, wait ? 1U : 0U, flags, nullptr, 0);
      if (r >= 0) {
        pending_ -= static_cast<unsigned>(r);
        if (pending_ == 0 || !wait) { return 0; }
        continue;
      }
      if (errno == EINTR) { continue; }
      return errno;
    }
  }

  /**
   * @brief Submits what was pushed and waits up to `timeout` for a completion (the kernel's own
   *        timeout where it has one, IORING_FEAT_EXT_ARG; else short naps between checks).
   * @return 0 when a completion may be there, ETIME when none came in time, or an error number
   */
  int wait_for(std::chrono::microseconds timeout) noexcept
  {
    if (int const e = enter(false); e != 0) { return e; }
    unsigned const head = *cq_head_;
    if (head != __atomic_load_n(cq_tail_, __ATOMIC_ACQUIRE)) { return 0; }
    if (ext_arg_) {
      __kernel_timespec ts{};
      ts.tv_sec = static_cast<long long>(timeout.count() / 1000000);
      ts.tv_nsec = static_cast<long long>(timeout.count() % 1000000) * 1000;
      io_uring_getevents_arg arg{};
      arg.sigmask_sz = _NSIG / 8;
      arg.ts = reinterpret_cast<std::uint64_t>(&ts);
      for (;;) {
        long const r = ::syscall(__NR_io_uring_enter, fd_, 0U, 1U, IORING_ENTER_GETEVENTS | IORING_ENTER_EXT_ARG, &arg,
                                 sizeof arg);
        if (r >= 0) { return 0; }
        if (errno == EINTR) { continue; }
        return errno;  // ETIME: none in time
      }
    }
    auto const until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      if (*cq_head_ != __atomic_load_n(cq_tail_, __ATOMIC_ACQUIRE)) { return 0; }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return *cq_head_ != __atomic_load_n(cq_tail_, __ATOMIC_ACQUIRE) ? 0 : ETIME;
  }

  /// @brief Queues a request to cancel the operation tagged `user`; its own completion is tagged
  ///        `tag`. The caller keeps in_flight() below entries().
  void push_cancel(std::uint64_t user, std::uint64_t tag) noexcept
  {
    unsigned const tail = *sq_tail_;
    unsigned const index = tail & sq_mask_;
    io_uring_sqe& e = sqes_[index];
    std::memset(&e, 0, sizeof e);
    e.opcode = IORING_OP_ASYNC_CANCEL;
    e.fd = -1;
    e.addr = user;
    e.user_data = tag;
    sq_array_[index] = index;
    __atomic_store_n(sq_tail_, tail + 1, __ATOMIC_RELEASE);
    ++pending_;
    ++in_flight_;
  }

  /// @brief Pops one completion if there is one.
  bool next(std::uint64_t& user, std::int32_t& result) noexcept
  {
    unsigned const head = *cq_head_;
    if (head == __atomic_load_n(cq_tail_, __ATOMIC_ACQUIRE)) { return false; }
    io_uring_cqe const& c = cqes_[head & cq_mask_];
    user = c.user_data;
    result = c.res;
    __atomic_store_n(cq_head_, head + 1, __ATOMIC_RELEASE);
    --in_flight_;
    return true;
  }

 private:
  io_uring_ring() = default;
  int fd_ = -1;
  void* sq_ = nullptr;
  void* cq_ = nullptr;
  io_uring_sqe* sqes_ = nullptr;
  std::size_t sq_bytes_ = 0, cq_bytes_ = 0, sqes_bytes_ = 0;
  unsigned* sq_head_ = nullptr;
  unsigned* sq_tail_ = nullptr;
  unsigned* sq_array_ = nullptr;
  unsigned sq_mask_ = 0;
  unsigned* cq_head_ = nullptr;
  unsigned* cq_tail_ = nullptr;
  unsigned cq_mask_ = 0;
  io_uring_cqe* cqes_ = nullptr;
  unsigned entries_ = 0;
  bool ext_arg_ = false;  // the kernel takes a timeout for waits
  unsigned pending_ = 0;
  unsigned in_flight_ = 0;
};
#endif

}  // namespace strata::detail
