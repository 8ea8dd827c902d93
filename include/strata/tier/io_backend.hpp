// SPDX-License-Identifier: Apache-2.0
/**
 * @file tier/io_backend.hpp
 * @brief The system calls a `file_store` makes, as a value (`file_store_options::io`): tests inject
 *        faults through it, other back ends plug in.
 */
#pragma once

#include <fcntl.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstdint>

namespace strata {

/**
 * @brief The system calls a `file_store` makes, as function pointers over a context, so that tests
 *        inject faults (EIO, ENOSPC, short and torn transfers) and other back ends plug in.
 *
 * `preadv` / `pwritev` follow POSIX: bytes moved, or -1 with `errno` set; a short count is legal
 * and the store continues from where it stopped. `allocate` follows `posix_fallocate`: 0 or an
 * error number. `sync` follows `fdatasync`.
 */
struct io_backend {
  void* context{};  ///< passed as the first argument of every call
  /// @brief Reads into `iov` at `offset`.
  ssize_t (*preadv)(void* context, int fd, iovec const* iov, int iovcnt, off_t offset){
      [](void*, int fd, iovec const* iov, int iovcnt, off_t offset) { return ::preadv(fd, iov, iovcnt, offset); }};
  /// @brief Writes `iov` at `offset`.
  ssize_t (*pwritev)(void* context, int fd, iovec const* iov, int iovcnt, off_t offset){
      [](void*, int fd, iovec const* iov, int iovcnt, off_t offset) { return ::pwritev(fd, iov, iovcnt, offset); }};
  /// @brief Reserves `[offset, offset + length)` of the file (extending it with zeros).
  int (*allocate)(void* context, int fd, off_t offset, off_t length){
      [](void*, int fd, off_t offset, off_t length) { return ::posix_fallocate(fd, offset, length); }};
  /// @brief Makes written data durable.
  int (*sync)(void* context, int fd){[](void*, int fd) { return ::fdatasync(fd); }};
  /**
   * @brief Optional: sees (and may change) the result of every io_uring transfer (bytes, or a
   *        negative error number). With it set, a custom back end still uses io_uring — tests inject
   *        faults here — and its `preadv`/`pwritev` finish short completions.
   */
  std::int32_t (*filter_completion)(void* context, bool write, std::int32_t result){};
  /**
   * @brief Optional: the descriptor an io_uring transfer of file `fd` goes to instead (tests: a
   *        pipe that never answers, to see the store's bounded waits). With it set, a custom back
   *        end still uses io_uring.
   */
  int (*uring_target)(void* context, bool write, int fd){};
};

}  // namespace strata
