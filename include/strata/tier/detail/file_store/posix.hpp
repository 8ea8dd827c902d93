// SPDX-License-Identifier: Apache-2.0
/**
 * @file tier/detail/file_store/posix.hpp
 * @brief POSIX pieces of the file tier: aligned buffers, owned descriptors, error text, and a
 *        transfer that continues after short reads and writes.
 */
#pragma once

#include <strata/error.hpp>
#include <strata/tier/detail/file_store/format.hpp>
#include <strata/tier/io_backend.hpp>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <utility>

namespace strata::detail {

/// @brief 4 KiB-aligned memory.
struct aligned_buffer {
  struct deleter {
    void operator()(std::byte* q) const noexcept { ::operator delete(q, std::align_val_t{file_alignment}); }
  };
  std::unique_ptr<std::byte, deleter> p;
  std::size_t size = 0;
  void ensure(std::size_t n)
  {
    if (n <= size) { return; }
    p.reset(static_cast<std::byte*>(::operator new(n, std::align_val_t{file_alignment})));
    size = n;
  }
  [[nodiscard]] std::byte* data() const noexcept { return p.get(); }
};

/// @brief A file descriptor closed on destruction.
class unique_fd {
 public:
  unique_fd() = default;
  explicit unique_fd(int fd) noexcept : fd_{fd} {}
  unique_fd(unique_fd&& o) noexcept : fd_{std::exchange(o.fd_, -1)} {}
  unique_fd& operator=(unique_fd&& o) noexcept
  {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  unique_fd(unique_fd const&) = delete;
  unique_fd& operator=(unique_fd const&) = delete;
  ~unique_fd() { reset(); }
  void reset() noexcept
  {
    if (fd_ >= 0) { ::close(fd_); }
    fd_ = -1;
  }
  [[nodiscard]] int get() const noexcept { return fd_; }

 private:
  int fd_ = -1;
};

/// @brief `strerror` with the symbolic name of the common I/O errors.
[[nodiscard]] inline std::string errno_text(int e)
{
  char const* name = e == EIO ? "EIO" : e == ENOSPC ? "ENOSPC" : e == EINVAL ? "EINVAL" : e == ENODATA ? "ENODATA" : "";
  return detail::concat(std::strerror(e), *name ? " (" : "", name, *name ? ")" : "");
}

/**
 * @brief Moves every byte of `iov` at `offset` through `io`, continuing after short transfers.
 * @return 0, or the error number (`ENODATA` when a read reaches the end of the file)
 */
inline int transfer_all(io_backend const& io, bool write, int fd, iovec* iov, int iovcnt, off_t offset) noexcept
{
  int empty = 0, interrupted = 0;  // in a row: progress resets both
  while (iovcnt > 0) {
    ssize_t const r = write ? io.pwritev(io.context, fd, iov, std::min(iovcnt, IOV_MAX), offset)
                            : io.preadv(io.context, fd, iov, std::min(iovcnt, IOV_MAX), offset);
    if (r < 0) {
      if (errno == EINTR && ++interrupted < 64) { continue; }
      return errno != 0 ? errno : EIO;
    }
    if (r == 0) {
      if (++empty >= 4) { return write ? EIO : ENODATA; }
      continue;
    }
    empty = interrupted = 0;
    offset += r;
    auto left = static_cast<std::size_t>(r);
    while (iovcnt > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --iovcnt;
    }
    if (iovcnt > 0) {
      iov->iov_base = static_cast<std::byte*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return 0;
}

}  // namespace strata::detail
