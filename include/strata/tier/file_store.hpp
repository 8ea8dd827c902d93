// SPDX-License-Identifier: Apache-2.0
/**
 * @file tier/file_store.hpp
 * @brief The file tier: one checksummed page-first record per page in preallocated files, read and
 *        written through io_uring (raw system calls, no liburing) or a small pool of I/O threads
 *        (`preadv`/`pwritev`), `O_DIRECT` where the file system allows; rebuilt from the records'
 *        headers on restart, never serving wrong bytes.
 *
 * Host-only (Linux/POSIX). The format, the recovery and the fault model are in docs/file_tier.md.
 */
#pragma once

#include <strata/error.hpp>
#include <strata/geometry.hpp>
#include <strata/tier/detail/crc32c.hpp>
#include <strata/tier/tier.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#if __has_include(<linux/io_uring.h>) && defined(__NR_io_uring_setup)
#include <linux/io_uring.h>
#define STRATA_FILE_STORE_URING 1
#endif

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace strata {

/// @brief A file-tier operation failed in a way the caller must hear about (files that cannot be
///        created, opened, locked or preallocated — a full disk among them).
class file_store_error : public error {
 public:
  using error::error;
};

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
};

/// @brief How a `file_store` lays out and reaches its files.
struct file_store_options {
  std::string directory;         ///< where the files live (created if missing)
  int files = 1;                 ///< files the records are spread over (contiguous slot ranges)
  int tp_rank = 0;               ///< tensor-parallel rank of this store (part of the file names and hash)
  int tp_size = 1;               ///< tensor-parallel ranks
  std::string tag;               ///< model and dtype, e.g. "Llama-3.1-8B/bf16": records of another tag are dropped
  bool use_direct_io = true;     ///< `O_DIRECT` where the file system accepts it
  bool use_io_uring = true;      ///< io_uring where the kernel allows it and `io` is the default back end
  int io_threads = 4;            ///< I/O threads; each moves one run of adjacent records at a time
  bool reopen = false;           ///< keep existing files and recover their intact records
  bool verify_on_reopen = true;  ///< on reopen, check every payload's checksum too (else headers only)
  bool sync_writes = false;      ///< `fdatasync` after every write run (survives power loss, not just crashes)
  std::int64_t max_io_bytes = std::int64_t{16} << 20;  ///< largest merged transfer
  /// How long to wait for another store's lock on the files: a killed process's lock outlives it
  /// while the kernel cancels its io_uring requests.
  int lock_wait_ms = 2000;
  io_backend io{};  ///< system calls (tests inject faults here)
};

/// @brief An intact record found when reopening a store: its slot, and what it says of its page.
struct recovered_record {
  std::int64_t slot{};            ///< record slot (allocated in `slots()`)
  std::uint64_t key{};            ///< content key it was written with
  std::uint64_t parent_key{};     ///< key of the page before it in its prefix (0: a first page, or not given)
  std::vector<std::int32_t> ids;  ///< the page's ids (token ids), as written; empty when not given
  friend bool operator==(recovered_record const&, recovered_record const&) = default;
};

/// @brief An asynchronous read or write in flight (`file_store::submit_read` / `submit_write`).
struct io_ticket {
  std::uint64_t id{};  ///< 0 is never issued
};

/// @brief State of an asynchronous operation.
enum class io_status {
  pending,    ///< still moving
  succeeded,  ///< every record moved intact
  failed      ///< at least one record did not (see `file_store::last_error()`)
};

namespace detail {

/// @brief The on-disk header of a record: the first 64 bytes of a zero-padded 4 KiB block.
struct file_record_header {
  std::uint64_t magic;          ///< `file_record_magic`
  std::uint32_t version;        ///< `file_format_version`
  std::uint32_t header_bytes;   ///< 4096
  std::uint64_t geometry_hash;  ///< `file_store::geometry_hash()` of the writer
  std::uint64_t key;            ///< content key of the page
  std::uint64_t payload_bytes;  ///< `page_bytes()` of the writer
  std::uint64_t sequence;       ///< store-wide write counter: tells a record from an older one in its slot
  std::uint64_t slot;           ///< the slot it was written to (catches misplaced bytes)
  std::uint32_t payload_crc;    ///< CRC-32C of the payload
  std::uint32_t header_crc;     ///< CRC-32C of the whole 4 KiB header block with this field zero
};
static_assert(sizeof(file_record_header) == 64);
static_assert(std::endian::native == std::endian::little, "file_store's format is little-endian");

inline constexpr std::uint64_t file_record_magic = 0x31564b4154525453ULL;  // "STRATKV1"
inline constexpr std::uint32_t file_format_version = 2;  // 2: the page's identity after the 64-byte header
inline constexpr std::int64_t file_header_bytes = 4096;
inline constexpr std::int64_t file_alignment = 4096;
/// @brief Where a record's identity starts in its header block: parent key (8 bytes), id count (4),
///        zero (4), then the ids (4 bytes each).
inline constexpr std::size_t file_identity_offset = sizeof(file_record_header);
inline constexpr std::size_t file_ids_offset = file_identity_offset + 16;

/// @brief CRC-32C of a 4 KiB header block, taking its `header_crc` field as zero.
[[nodiscard]] inline std::uint32_t file_header_crc(std::byte const* block) noexcept
{
  constexpr std::size_t field = offsetof(file_record_header, header_crc);
  std::uint32_t const zero = 0;
  std::uint32_t c = crc32c(0, block, field);
  c = crc32c(c, &zero, sizeof zero);
  return crc32c(c, block + field + sizeof zero, static_cast<std::size_t>(file_header_bytes) - field - sizeof zero);
}

[[nodiscard]] constexpr std::int64_t round_up(std::int64_t v, std::int64_t a) noexcept { return (v + a - 1) / a * a; }

/// @brief 64-bit FNV-1a, for the geometry hash.
struct fnv1a {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  void bytes(void const* p, std::size_t n) noexcept
  {
    auto const* b = static_cast<unsigned char const*>(p);
    for (std::size_t i = 0; i < n; ++i) {
      h = (h ^ b[i]) * 0x100000001b3ULL;
    }
  }
  void i64(std::int64_t v) noexcept { bytes(&v, sizeof v); }
};

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
  int stalls = 0;
  while (iovcnt > 0) {
    ssize_t const r = write ? io.pwritev(io.context, fd, iov, std::min(iovcnt, IOV_MAX), offset)
                            : io.preadv(io.context, fd, iov, std::min(iovcnt, IOV_MAX), offset);
    if (r < 0) {
      if (errno == EINTR && ++stalls < 64) { continue; }
      return errno != 0 ? errno : EIO;
    }
    if (r == 0) {
      if (++stalls >= 4) { return write ? EIO : ENODATA; }
      continue;
    }
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

/// @brief Worker threads taking jobs `f(worker_index)` in order.
class io_thread_pool {
 public:
  explicit io_thread_pool(int threads)
  {
    for (int i = 0; i < threads; ++i) {
      threads_.emplace_back([this, i] { run(i); });
    }
  }
  io_thread_pool(io_thread_pool const&) = delete;
  io_thread_pool& operator=(io_thread_pool const&) = delete;
  ~io_thread_pool()
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
  void post(std::function<void(int)> job)
  {
    {
      std::lock_guard lock{mutex_};
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }
  [[nodiscard]] int size() const noexcept { return static_cast<int>(threads_.size()); }

 private:
  void run(int worker)
  {
    for (;;) {
      std::function<void(int)> job;
      {
        std::unique_lock lock{mutex_};
        cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) { return; }  // stopping, and every job ran
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job(worker);
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void(int)>> jobs_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

#ifdef STRATA_FILE_STORE_URING
/**
 * @brief A minimal io_uring (raw system calls, no liburing) used from one thread: vectored reads
 *        and writes pushed to the submission queue, completions popped from the completion queue.
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
  unsigned pending_ = 0;
  unsigned in_flight_ = 0;
};
#endif

}  // namespace detail

/**
 * @brief The file tier: `capacity()` page records on local disk, a `record_store`.
 *
 * Slot `s` lives in file `s / slots_per_file()` at offset `(s % slots_per_file()) * record_bytes()`:
 * a 4 KiB header (magic, format version, geometry hash, content key, payload length, sequence
 * number, slot, CRC-32C of the payload and of the header) followed by the page-first payload,
 * padded to 4 KiB so that every transfer stays `O_DIRECT`-aligned. Runs of adjacent slots move in
 * one vectored transfer of up to `max_io_bytes`, submitted to io_uring where the kernel allows it
 * (`uses_io_uring()`), else run on `io_threads` threads in parallel.
 *
 * What a read returns true for is exactly what the last successful write to those slots stored:
 * every record's header, payload checksum, key and sequence number are checked against the
 * store's index; any mismatch, I/O error or short file fails the batch. A failed write leaves its
 * slots holding no record (reads fail until they are rewritten). Reopening the files
 * (`file_store::open`, or `reopen = true`) recovers every intact record into `recovered()` and marks
 * its slot allocated; torn, corrupt, misplaced and foreign records are dropped.
 *
 * Thread safety: one owner calls the store (as for `slot_allocator`); the I/O threads are internal.
 * Files are locked (`flock`) against a second store on the same files.
 */
class file_store {
 public:
  static constexpr tier kind = tier::file;  ///< the tier it serves
  /// Most ids a record keeps for its page (what fits its 4 KiB header): pages of up to 1,004 tokens.
  static constexpr std::int64_t max_record_ids =
      std::int64_t(detail::file_header_bytes - std::int64_t(detail::file_ids_offset)) / 4;

  /**
   * @brief Creates (or, with `options.reopen`, reopens) the store's files.
   * @param geometry shape of the cache on this rank
   * @param pages records the store holds
   * @param options directory, file count, TP rank and size, tag, I/O settings
   * @throw strata::invalid_argument for an invalid geometry, page count or option, or a size that
   *        overflows 64 bits
   * @throw strata::file_store_error when a file cannot be created, opened, locked or preallocated
   *        (a full disk says "no space"); nothing is left open then
   */
  file_store(kv_geometry const& geometry, std::int64_t pages, file_store_options options)
      : geometry_{(geometry.validate(), geometry)}, slots_{pages}, options_{std::move(options)}
  {
    STRATA_EXPECTS(options_.files > 0 && options_.files <= pages, "file_store: files must be in [1, pages=", pages,
                   "], got ", options_.files);
    STRATA_EXPECTS(options_.tp_size > 0 && options_.tp_rank >= 0 && options_.tp_rank < options_.tp_size,
                   "file_store: tp_rank=", options_.tp_rank, " is not in [0, tp_size=", options_.tp_size, ")");
    STRATA_EXPECTS(options_.io_threads > 0 && options_.io_threads <= 256,
                   "file_store: io_threads must be in [1, 256], got ", options_.io_threads);
    STRATA_EXPECTS(!options_.directory.empty(), "file_store: directory must not be empty");
    STRATA_EXPECTS(options_.max_io_bytes > 0, "file_store: max_io_bytes must be positive, got ", options_.max_io_bytes);
    STRATA_EXPECTS(options_.io.preadv && options_.io.pwritev && options_.io.allocate && options_.io.sync,
                   "file_store: io_backend has a null function");
    page_bytes_ = geometry_.page_bytes();
    STRATA_EXPECTS(page_bytes_ <= (std::int64_t{1} << 40), "file_store: page_bytes ", page_bytes_, " is too large");
    record_bytes_ = detail::file_header_bytes + detail::round_up(page_bytes_, detail::file_alignment);
    slots_per_file_ = (pages + options_.files - 1) / options_.files;
    STRATA_EXPECTS(detail::checked_mul(slots_per_file_, record_bytes_).has_value(), "file_store: ", slots_per_file_,
                   " records of ", record_bytes_, " bytes overflow a file");
    runs_max_ = std::max<std::int64_t>(1, std::min<std::int64_t>(IOV_MAX / 3, options_.max_io_bytes / record_bytes_));
    geometry_hash_ = compute_geometry_hash();
    index_.assign(static_cast<std::size_t>(pages), slot_state{});
    open_files();
    worker_buffers_.resize(static_cast<std::size_t>(options_.io_threads));
    pool_ = std::make_unique<detail::io_thread_pool>(options_.io_threads);
    if (options_.reopen) { recover(); }
#ifdef STRATA_FILE_STORE_URING
    io_backend const posix{};
    bool const default_io = options_.io.context == nullptr && options_.io.preadv == posix.preadv &&
                            options_.io.pwritev == posix.pwritev && options_.io.sync == posix.sync;
    if (options_.use_io_uring && (default_io || options_.io.filter_completion != nullptr)) {
      ring_ = detail::io_uring_ring::create(256);
    }
#endif
  }

  /**
   * @brief Reopens a store's existing files (creating missing ones) and recovers their intact records.
   * @throw as the constructor
   */
  [[nodiscard]] static file_store open(kv_geometry const& geometry, std::int64_t pages, file_store_options options)
  {
    options.reopen = true;
    return file_store{geometry, pages, std::move(options)};
  }

  file_store(file_store const&) = delete;
  file_store& operator=(file_store const&) = delete;
  file_store(file_store&&) = delete;
  file_store& operator=(file_store&&) = delete;

  /// @brief Waits for every operation in flight, then closes the files.
  ~file_store()
  {
#ifdef STRATA_FILE_STORE_URING
    while (ring_ && ring_->in_flight() > 0) {  // the kernel must not write into freed buffers
      try {
        reap(true);
      } catch (...) {
        std::this_thread::yield();
      }
    }
#endif
    pool_.reset();
  }

  /// @brief Shape of the cache.
  [[nodiscard]] kv_geometry geometry() const noexcept { return geometry_; }
  /// @brief Records in the store.
  [[nodiscard]] std::int64_t capacity() const noexcept { return slots_.capacity(); }
  /// @brief The record slots (allocated by the prefix index).
  [[nodiscard]] slot_allocator& slots() noexcept { return slots_; }
  /// @brief The record slots.
  [[nodiscard]] slot_allocator const& slots() const noexcept { return slots_; }
  /// @brief Bytes a record takes on disk: 4 KiB of header and the payload rounded up to 4 KiB.
  [[nodiscard]] std::int64_t record_bytes() const noexcept { return record_bytes_; }
  /// @brief Records per file (the last file may hold fewer).
  [[nodiscard]] std::int64_t slots_per_file() const noexcept { return slots_per_file_; }
  /// @brief Whether transfers go through io_uring (else through the I/O threads).
  [[nodiscard]] bool uses_io_uring() const noexcept
  {
#ifdef STRATA_FILE_STORE_URING
    return ring_ != nullptr;
#else
    return false;
#endif
  }
  /// @brief Whether the files are open with `O_DIRECT`.
  [[nodiscard]] bool direct_io() const noexcept { return direct_; }
  /// @brief Hash of everything a record must agree on: format, geometry, TP rank and size, tag.
  [[nodiscard]] std::uint64_t geometry_hash() const noexcept { return geometry_hash_; }
  /// @brief Paths of the files, in slot order.
  [[nodiscard]] std::vector<std::string> const& paths() const noexcept { return paths_; }
  /// @brief Intact records found when the store was reopened, in slot order.
  [[nodiscard]] std::span<recovered_record const> recovered() const noexcept { return recovered_; }
  /// @brief Records dropped when the store was reopened (corrupt, torn, foreign or unreadable).
  [[nodiscard]] std::int64_t dropped() const noexcept { return dropped_; }
  /// @brief What went wrong in the last failed operation ("" when none failed yet).
  [[nodiscard]] std::string const& last_error() const noexcept { return last_error_; }

  /// @brief The key of the record slot `slot` holds, or nothing (never written, or its write failed).
  [[nodiscard]] std::optional<std::uint64_t> key(std::int64_t slot) const
  {
    STRATA_EXPECTS(slot >= 0 && slot < capacity(), "file_store: slot ", slot, " out of range [0, ", capacity(), ")");
    auto const& s = index_[static_cast<std::size_t>(slot)];
    return s.valid ? std::optional{s.key} : std::nullopt;
  }

  /**
   * @brief Stores one record per slot, with content key 0.
   * @return whether every record was written; on false the batch's slots hold no record
   * @throw strata::invalid_argument as `submit_write`
   */
  [[nodiscard]] bool write(std::span<std::int64_t const> slots, std::span<std::byte const* const> sources)
  { return wait(submit_write(slots, sources, {})); }

  /**
   * @brief Stores one record per slot with its page's content key (a hash chained over the prefix).
   * @return whether every record was written; on false the batch's slots hold no record
   * @throw strata::invalid_argument as `submit_write`
   */
  [[nodiscard]] bool write(std::span<std::int64_t const> slots, std::span<std::byte const* const> sources,
                           std::span<std::uint64_t const> keys)
  { return wait(submit_write(slots, sources, keys)); }

  /**
   * @brief As above, with each page's identity (see `submit_write`): what a restart rebuilds the
   *        prefix index from.
   */
  [[nodiscard]] bool write(std::span<std::int64_t const> slots, std::span<std::byte const* const> sources,
                           std::span<std::uint64_t const> keys, std::span<std::uint64_t const> parent_keys,
                           std::span<std::int32_t const> ids)
  { return wait(submit_write(slots, sources, keys, parent_keys, ids)); }

  /**
   * @brief Fetches one record per slot into `records` (`page_bytes()` each).
   * @return whether every record arrived intact; on false the destination bytes are unspecified
   *         and must not be used (a miss: the engine recomputes)
   * @throw strata::invalid_argument as `submit_read`
   */
  [[nodiscard]] bool read(std::span<std::int64_t const> slots, std::span<std::byte* const> records)
  { return wait(submit_read(slots, records, {})); }

  /**
   * @brief As `read`, and also fails unless each record's key is `expected_keys[i]`.
   */
  [[nodiscard]] bool read(std::span<std::int64_t const> slots, std::span<std::byte* const> records,
                          std::span<std::uint64_t const> expected_keys)
  { return wait(submit_read(slots, records, expected_keys)); }

  /**
   * @brief Starts writing one record per slot; `sources` must stay valid until the ticket completes.
   *        The slots hold no record until then (a read of them fails).
   * @param keys content keys, one per slot, or empty for key 0
   * @param parent_keys the key of the page before each one in its prefix (0: a first page), or empty
   * @param ids the pages' ids, the same number per slot (at most `max_record_ids`), or empty: kept in
   *        the records (copied now) so that a restart can rebuild the prefix index (`recovered()`)
   * @throw strata::invalid_argument for a size mismatch, a null source, a slot out of range, not
   *        allocated, listed twice or with an operation in flight; nothing is written then
   */
  [[nodiscard]] io_ticket submit_write(std::span<std::int64_t const> slots, std::span<std::byte const* const> sources,
                                       std::span<std::uint64_t const> keys,
                                       std::span<std::uint64_t const> parent_keys = {},
                                       std::span<std::int32_t const> ids = {})
  {
    validate(slots, sources.size(), keys.size(), "write");
    for (auto const* p : sources) {
      STRATA_EXPECTS(p != nullptr, "file_store: write: null source");
    }
    STRATA_EXPECTS(parent_keys.empty() || parent_keys.size() == slots.size(), "file_store: write: ", slots.size(),
                   " slots but ", parent_keys.size(), " parent keys");
    std::size_t const per_page = slots.empty() ? 0 : ids.size() / slots.size();
    STRATA_EXPECTS(per_page * slots.size() == ids.size() && std::int64_t(per_page) <= max_record_ids,
                   "file_store: write: ", ids.size(), " ids for ", slots.size(),
                   " slots (the same number per slot, at most ", max_record_ids, ")");
    auto b = std::make_shared<batch>();
    b->write = true;
    b->items.resize(slots.size());
    for (std::size_t i = 0; i < slots.size(); ++i) {
      auto& it = b->items[i];
      it.slot = slots[i];
      it.src = sources[i];
      it.key = keys.empty() ? 0 : keys[i];
      it.parent_key = parent_keys.empty() ? 0 : parent_keys[i];
      it.ids.assign(ids.begin() + std::ptrdiff_t(i * per_page), ids.begin() + std::ptrdiff_t((i + 1) * per_page));
      it.sequence = next_sequence_++;
      auto& s = index_[static_cast<std::size_t>(it.slot)];
      s.valid = false;  // its content is unknown until the write completes
    }
    return launch(std::move(b));
  }

  /**
   * @brief Starts reading one record per slot; `records` must stay valid until the ticket completes.
   * @param expected_keys the key each record must carry, or empty to accept the key it was written with
   * @throw strata::invalid_argument as `submit_write`, or for a null destination
   */
  [[nodiscard]] io_ticket submit_read(std::span<std::int64_t const> slots, std::span<std::byte* const> records,
                                      std::span<std::uint64_t const> expected_keys)
  {
    validate(slots, records.size(), expected_keys.size(), "read");
    for (auto* p : records) {
      STRATA_EXPECTS(p != nullptr, "file_store: read: null destination");
    }
    auto b = std::make_shared<batch>();
    b->items.resize(slots.size());
    for (std::size_t i = 0; i < slots.size(); ++i) {
      auto& it = b->items[i];
      auto const& s = index_[static_cast<std::size_t>(slots[i])];
      it.slot = slots[i];
      it.dst = records[i];
      it.key = s.key;
      it.sequence = s.sequence;
      if (!s.valid) {
        b->fail(detail::concat("file_store: slot ", it.slot, " holds no record"));
      } else if (!expected_keys.empty() && expected_keys[i] != s.key) {
        b->fail(detail::concat("file_store: slot ", it.slot, " holds key ", s.key, ", not the expected ",
                               expected_keys[i]));
      }
    }
    if (b->failed.load()) {  // no I/O for a batch that cannot succeed
      auto const id = next_ticket_++;
      tickets_.emplace(id, std::move(b));
      return io_ticket{id};
    }
    return launch(std::move(b));
  }

  /**
   * @brief Whether an operation is done; a completed ticket is consumed (a write's slots then hold
   *        their records, or none on failure).
   * @throw strata::invalid_argument for an unknown or consumed ticket
   */
  [[nodiscard]] io_status poll(io_ticket t)
  {
    auto it = find(t);
#ifdef STRATA_FILE_STORE_URING
    if (ring_) { reap(false); }
#endif
    if (it->second->remaining.load() > 0) { return io_status::pending; }
    return finish(it) ? io_status::succeeded : io_status::failed;
  }

  /**
   * @brief Waits for an operation and consumes its ticket.
   * @return whether every record moved intact
   * @throw strata::invalid_argument for an unknown or consumed ticket
   */
  [[nodiscard]] bool wait(io_ticket t)
  {
    auto it = find(t);
#ifdef STRATA_FILE_STORE_URING
    while (ring_ && it->second->remaining.load() > 0) {
      reap(true);
    }
#endif
    {
      std::unique_lock lock{done_mutex_};
      done_cv_.wait(lock, [&] { return it->second->remaining.load() == 0; });
    }
    return finish(it);
  }

 private:
  struct slot_state {
    std::uint64_t key = 0;
    std::uint64_t sequence = 0;
    bool valid = false;
    bool busy = false;  // a write or read in flight
  };
  struct item {
    std::int64_t slot = 0;
    std::byte const* src = nullptr;
    std::byte* dst = nullptr;
    std::uint64_t key = 0;
    std::uint64_t sequence = 0;
    std::uint64_t parent_key = 0;  // writes: the page's identity
    std::vector<std::int32_t> ids;
  };
  struct batch {
    bool write = false;
    std::vector<item> items;
    std::atomic<int> remaining{0};
    std::atomic<bool> failed{false};
    std::mutex error_mutex;
    std::string error;
    void fail(std::string message)
    {
      std::lock_guard lock{error_mutex};
      if (!failed.exchange(true)) { error = std::move(message); }
    }
  };
  struct worker_buffers {
    detail::aligned_buffer headers, staging, pad;
  };

  [[nodiscard]] std::uint64_t compute_geometry_hash() const noexcept
  {
    detail::fnv1a h;
    h.i64(detail::file_format_version);
    for (auto v :
         {geometry_.layers, geometry_.page_tokens, geometry_.kv_heads, geometry_.head_dim, geometry_.elem_bytes,
          geometry_.planes, std::int64_t{options_.tp_rank}, std::int64_t{options_.tp_size}, record_bytes_}) {
      h.i64(v);
    }
    h.bytes(options_.tag.data(), options_.tag.size());
    return h.h;
  }

  void validate(std::span<std::int64_t const> slots, std::size_t buffers, std::size_t keys, char const* what) const
  {
    STRATA_EXPECTS(buffers == slots.size(), "file_store: ", what, ": ", slots.size(), " slots but ", buffers,
                   " buffers");
    STRATA_EXPECTS(keys == 0 || keys == slots.size(), "file_store: ", what, ": ", slots.size(), " slots but ", keys,
                   " keys");
    std::vector<std::int64_t> sorted(slots.begin(), slots.end());
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t i = 0; i < sorted.size(); ++i) {
      auto const s = sorted[i];
      STRATA_EXPECTS(s >= 0 && s < capacity(), "file_store: ", what, ": slot ", s, " out of range [0, ", capacity(),
                     ")");
      STRATA_EXPECTS(slots_.is_allocated(s), "file_store: ", what, ": slot ", s, " is not allocated");
      STRATA_EXPECTS(i == 0 || sorted[i - 1] != s, "file_store: ", what, ": slot ", s, " is listed twice");
      STRATA_EXPECTS(!index_[static_cast<std::size_t>(s)].busy, "file_store: ", what, ": slot ", s,
                     " has an operation in flight");
    }
  }

  void open_files()
  {
    std::error_code ec;
    std::filesystem::create_directories(options_.directory, ec);
    STRATA_EXPECTS_AS(file_store_error, !ec, "file_store: cannot create directory ", options_.directory, ": ",
                      ec.message());
    direct_ = options_.use_direct_io;
    for (int f = 0; f < options_.files; ++f) {
      auto const path = (std::filesystem::path{options_.directory} /
                         detail::concat("strata-kv.rank", options_.tp_rank, ".", f, ".dat"))
                            .string();
      int flags = O_RDWR | O_CREAT | O_CLOEXEC;
      int fd = direct_ ? ::open(path.c_str(), flags | O_DIRECT, 0644) : -1;
      if (fd < 0) {
        direct_ = false;  // the file system refuses O_DIRECT (tmpfs): buffered I/O for every file
        fd = ::open(path.c_str(), flags, 0644);
      }
      STRATA_EXPECTS_AS(file_store_error, fd >= 0, "file_store: cannot open ", path, ": ", detail::errno_text(errno));
      detail::unique_fd file{fd};
      int locked = ::flock(fd, LOCK_EX | LOCK_NB);
      for (int waited = 0; locked != 0 && errno == EWOULDBLOCK && waited < options_.lock_wait_ms; ++waited) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        locked = ::flock(fd, LOCK_EX | LOCK_NB);
      }
      STRATA_EXPECTS_AS(file_store_error, locked == 0, "file_store: ", path,
                        " is in use by another store (flock: ", detail::errno_text(errno), ")");
      std::int64_t const slots_here = std::min(slots_per_file_, capacity() - f * slots_per_file_);
      auto const bytes = static_cast<off_t>(slots_here * record_bytes_);
      if (!options_.reopen) {
        STRATA_EXPECTS_AS(file_store_error, ::ftruncate(fd, 0) == 0, "file_store: cannot truncate ", path, ": ",
                          detail::errno_text(errno));
      }
      int const e =
          bytes > 0 ? options_.io.allocate(options_.io.context, fd, 0, bytes) : 0;  // 9 pages in 4 files: 3+3+3+0
      STRATA_EXPECTS_AS(file_store_error, e == 0, "file_store: cannot preallocate ", bytes, " bytes for ", path, ": ",
                        e == ENOSPC ? "no space left on the device" : "", e == ENOSPC ? "" : detail::errno_text(e));
      files_.push_back(std::move(file));
      paths_.push_back(path);
    }
    if (!direct_) {  // a later file refused O_DIRECT: reopen the earlier ones buffered, so that all agree
      for (std::size_t f = 0; f < files_.size(); ++f) {
        int const flags = ::fcntl(files_[f].get(), F_GETFL);
        if (flags >= 0 && (flags & O_DIRECT)) { (void)::fcntl(files_[f].get(), F_SETFL, flags & ~O_DIRECT); }
      }
    }
  }

  /// Location of slot `s`.
  [[nodiscard]] std::pair<int, off_t> where(std::int64_t s) const noexcept
  {
    auto const f = s / slots_per_file_;
    return {files_[static_cast<std::size_t>(f)].get(), static_cast<off_t>((s - f * slots_per_file_) * record_bytes_)};
  }

  /// Checks a header block against what the slot must hold; returns the reason it fails, or nullptr.
  [[nodiscard]] char const* check_header(std::byte const* block, std::int64_t slot,
                                         detail::file_record_header& h) const noexcept
  {
    std::memcpy(&h, block, sizeof h);
    if (h.magic != detail::file_record_magic) { return "bad magic (no record, or overwritten)"; }
    if (h.version != detail::file_format_version) { return "another format version"; }
    if (h.header_bytes != detail::file_header_bytes) { return "bad header size"; }
    if (detail::file_header_crc(block) != h.header_crc) { return "header checksum mismatch"; }
    if (h.geometry_hash != geometry_hash_) { return "another geometry, tag or tensor-parallel rank"; }
    if (h.payload_bytes != static_cast<std::uint64_t>(page_bytes_)) { return "bad payload length"; }
    if (h.slot != static_cast<std::uint64_t>(slot)) { return "record of another slot"; }
    return nullptr;
  }

  void fill_header(std::byte* block, item const& it, std::uint32_t payload_crc) const noexcept
  {
    std::memset(block, 0, static_cast<std::size_t>(detail::file_header_bytes));
    detail::file_record_header h{};
    h.magic = detail::file_record_magic;
    h.version = detail::file_format_version;
    h.header_bytes = static_cast<std::uint32_t>(detail::file_header_bytes);
    h.geometry_hash = geometry_hash_;
    h.key = it.key;
    h.payload_bytes = static_cast<std::uint64_t>(page_bytes_);
    h.sequence = it.sequence;
    h.slot = static_cast<std::uint64_t>(it.slot);
    h.payload_crc = payload_crc;
    std::memcpy(block, &h, sizeof h);
    auto const count = static_cast<std::uint32_t>(it.ids.size());
    std::memcpy(block + detail::file_identity_offset, &it.parent_key, sizeof it.parent_key);
    std::memcpy(block + detail::file_identity_offset + 8, &count, sizeof count);
    if (count > 0) { std::memcpy(block + detail::file_ids_offset, it.ids.data(), count * sizeof(std::int32_t)); }
    h.header_crc = detail::file_header_crc(block);
    std::memcpy(block, &h, sizeof h);
  }

  [[nodiscard]] io_ticket launch(std::shared_ptr<batch> b)
  {
    // Runs of adjacent slots in one file, at most runs_max_ records each.
    std::vector<std::size_t> order(b->items.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::sort(order.begin(), order.end(), [&](auto x, auto y) { return b->items[x].slot < b->items[y].slot; });
    std::vector<std::pair<std::size_t, std::size_t>> runs;  // [first, last) into `order`
    for (std::size_t i = 0; i < order.size();) {
      std::size_t j = i + 1;
      auto const file = b->items[order[i]].slot / slots_per_file_;
      while (j < order.size() && j - i < static_cast<std::size_t>(runs_max_) &&
             b->items[order[j]].slot == b->items[order[j - 1]].slot + 1 &&
             b->items[order[j]].slot / slots_per_file_ == file) {
        ++j;
      }
      runs.emplace_back(i, j);
      i = j;
    }
    for (auto const& it : b->items) {
      index_[static_cast<std::size_t>(it.slot)].busy = true;
    }
    auto const id = next_ticket_++;
    tickets_.emplace(id, b);
    b->remaining.store(static_cast<int>(runs.size()));
    auto shared_order = std::make_shared<std::vector<std::size_t> const>(std::move(order));
#ifdef STRATA_FILE_STORE_URING
    if (ring_) {
      for (auto const& r : runs) {
        start_uring_run(b, shared_order, r);
      }
      return io_ticket{id};
    }
#endif
    for (auto const& r : runs) {
      pool_->post([this, b, shared_order, r](int worker) {
        std::span<std::size_t const> const run{shared_order->data() + r.first, r.second - r.first};
        try {
          thread_run(*b, run, worker);
        } catch (std::exception const& e) {  // allocation failure of a staging buffer
          b->fail(detail::concat("file_store: ", e.what()));
        }
        {
          std::lock_guard lock{done_mutex_};
          b->remaining.fetch_sub(1);
        }
        done_cv_.notify_all();
      });
    }
    return io_ticket{id};
  }

  [[nodiscard]] bool aligned_for_direct(void const* p) const noexcept
  {
    return !direct_ || (reinterpret_cast<std::uintptr_t>(p) % detail::file_alignment == 0 &&
                        page_bytes_ % detail::file_alignment == 0);
  }

  [[nodiscard]] std::string io_failure(char const* what, std::int64_t first_slot, std::size_t n, int e) const
  {
    auto const [fd, off] = where(first_slot);
    (void)fd;
    return detail::concat("file_store: ", what, " of slots [", first_slot, ", ",
                          first_slot + static_cast<std::int64_t>(n), ") in ",
                          paths_[static_cast<std::size_t>(first_slot / slots_per_file_)], " at offset ", off,
                          " failed: ", e == ENOSPC ? "no space left on the device: " : "", detail::errno_text(e));
  }

  /// Builds a run's vectors in `buf` (for a write, its headers and checksums too); returns whether
  /// the run is staged (one aligned buffer instead of the caller's records).
  bool prepare_run(batch& b, std::span<std::size_t const> run, worker_buffers& buf, std::vector<iovec>& iov) const
  {
    auto const n = run.size();
    auto const pad = static_cast<std::size_t>(record_bytes_ - detail::file_header_bytes - page_bytes_);
    auto const rb = static_cast<std::size_t>(record_bytes_);
    auto const hb = static_cast<std::size_t>(detail::file_header_bytes);
    auto const pb = static_cast<std::size_t>(page_bytes_);
    bool const staged = std::any_of(run.begin(), run.end(), [&](auto i) {
      return !aligned_for_direct(b.write ? static_cast<void const*>(b.items[i].src) : b.items[i].dst);
    });
    iov.clear();
    if (staged) {
      buf.staging.ensure(n * rb);
      if (b.write) {
        for (std::size_t k = 0; k < n; ++k) {
          auto const& it = b.items[run[k]];
          auto* rec = buf.staging.data() + k * rb;
          std::memcpy(rec + hb, it.src, pb);
          std::memset(rec + hb + pb, 0, pad);
          fill_header(rec, it, detail::crc32c(0, rec + hb, pb));
        }
      }
      iov.push_back({buf.staging.data(), n * rb});
      return true;
    }
    buf.headers.ensure(n * hb);
    buf.pad.ensure(static_cast<std::size_t>(detail::file_alignment));
    if (b.write) { std::memset(buf.pad.data(), 0, static_cast<std::size_t>(detail::file_alignment)); }
    for (std::size_t k = 0; k < n; ++k) {
      auto const& it = b.items[run[k]];
      auto* h = buf.headers.data() + k * hb;
      if (b.write) { fill_header(h, it, detail::crc32c(0, it.src, pb)); }
      iov.push_back({h, hb});
      iov.push_back({b.write ? const_cast<std::byte*>(it.src) : it.dst, pb});
      if (pad > 0) { iov.push_back({buf.pad.data(), pad}); }
    }
    return false;
  }

  /// Checks every record of a run that was read into `buf` and the caller's records.
  void verify_read(batch& b, std::span<std::size_t const> run, worker_buffers const& buf, bool staged) const
  {
    for (std::size_t k = 0; k < run.size(); ++k) {
      auto const& it = b.items[run[k]];
      std::byte const* header = staged ? buf.staging.data() + k * static_cast<std::size_t>(record_bytes_)
                                       : buf.headers.data() + k * static_cast<std::size_t>(detail::file_header_bytes);
      std::byte const* payload = staged ? header + detail::file_header_bytes : it.dst;
      detail::file_record_header h{};
      char const* why = check_header(header, it.slot, h);
      if (why == nullptr && (h.key != it.key || h.sequence != it.sequence)) {
        why = "the record is not the one last written (stale or torn write)";
      }
      if (why == nullptr && detail::crc32c(0, payload, static_cast<std::size_t>(page_bytes_)) != h.payload_crc) {
        why = "payload checksum mismatch";
      }
      if (why != nullptr) {
        b.fail(detail::concat("file_store: read of slot ", it.slot, " in ",
                              paths_[static_cast<std::size_t>(it.slot / slots_per_file_)], ": ", why));
        return;
      }
      if (staged) { std::memcpy(it.dst, payload, static_cast<std::size_t>(page_bytes_)); }
    }
  }

  /// A run on an I/O thread: prepare, transfer (continuing after short transfers), verify.
  void thread_run(batch& b, std::span<std::size_t const> run, int worker)
  {
    auto& buf = worker_buffers_[static_cast<std::size_t>(worker)];
    std::vector<iovec> iov;
    bool const staged = prepare_run(b, run, buf, iov);
    auto const first = b.items[run[0]].slot;
    auto const [fd, off] = where(first);
    int e = detail::transfer_all(options_.io, b.write, fd, iov.data(), static_cast<int>(iov.size()), off);
    if (e == 0 && b.write && options_.sync_writes) { e = options_.io.sync(options_.io.context, fd) == 0 ? 0 : errno; }
    if (e != 0) {
      b.fail(io_failure(b.write ? "write" : "read", first, run.size(), e));
      return;
    }
    if (!b.write) { verify_read(b, run, buf, staged); }
  }

#ifdef STRATA_FILE_STORE_URING
  struct uring_run {
    std::shared_ptr<batch> b;
    std::shared_ptr<std::vector<std::size_t> const> order;
    std::size_t first = 0, last = 0;
    worker_buffers buf;
    std::vector<iovec> iov;
    bool staged = false;
    std::size_t bytes = 0;
    [[nodiscard]] std::span<std::size_t const> run() const noexcept { return {order->data() + first, last - first}; }
  };

  /// Prepares a run on the calling thread and submits it; its checksums overlap the runs in flight.
  void start_uring_run(std::shared_ptr<batch> const& b, std::shared_ptr<std::vector<std::size_t> const> const& order,
                       std::pair<std::size_t, std::size_t> r)
  {
    auto u = std::make_unique<uring_run>();
    u->b = b;
    u->order = order;
    u->first = r.first;
    u->last = r.second;
    try {
      u->staged = prepare_run(*b, u->run(), u->buf, u->iov);
    } catch (std::exception const& e) {  // allocation failure of a staging buffer
      b->fail(detail::concat("file_store: ", e.what()));
      b->remaining.fetch_sub(1);
      return;
    }
    for (auto const& v : u->iov) {
      u->bytes += v.iov_len;
    }
    while (ring_->in_flight() >= ring_->entries()) {
      reap(true);
    }
    auto const [fd, off] = where(b->items[u->run()[0]].slot);
    auto const id = next_run_++;
    ring_->push(b->write, fd, u->iov.data(), static_cast<unsigned>(u->iov.size()), off, id);
    uring_runs_.emplace(id, std::move(u));
    (void)ring_->enter(false);  // a refused submission is retried by the next reap
  }

  /// Completes the runs whose transfers finished; with `block`, waits for at least one.
  void reap(bool block)
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
      if (got || !block || ring_->in_flight() == 0) { return; }
      int const e = ring_->enter(true);
      if (e == 0) { continue; }
      STRATA_EXPECTS_AS(file_store_error, (e == EAGAIN || e == EBUSY || e == ENOMEM) && ++tries < 100000,
                        "file_store: io_uring_enter failed: ", detail::errno_text(e));
      std::this_thread::yield();
    }
  }

  void complete_uring_run(std::uint64_t id, std::int32_t result)
  {
    auto it = uring_runs_.find(id);
    if (it == uring_runs_.end()) { return; }
    auto const u = std::move(it->second);
    uring_runs_.erase(it);
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
      b.fail(io_failure(b.write ? "write" : "read", first, run.size(), e));
    } else if (!b.write) {
      verify_read(b, run, u->buf, u->staged);
    }
    b.remaining.fetch_sub(1);
  }
#endif

  [[nodiscard]] std::map<std::uint64_t, std::shared_ptr<batch>>::iterator find(io_ticket t)
  {
    auto it = tickets_.find(t.id);
    STRATA_EXPECTS(it != tickets_.end(), "file_store: unknown or consumed ticket ", t.id);
    return it;
  }

  bool finish(std::map<std::uint64_t, std::shared_ptr<batch>>::iterator it)
  {
    auto const b = std::move(it->second);
    tickets_.erase(it);
    bool const ok = !b->failed.load();
    for (auto const& x : b->items) {
      auto& s = index_[static_cast<std::size_t>(x.slot)];
      s.busy = false;
      if (b->write) {
        s.valid = ok;
        s.key = x.key;
        s.sequence = x.sequence;
      }
    }
    if (!ok) {
      std::lock_guard lock{b->error_mutex};
      last_error_ = b->error;
    }
    return ok;
  }

  /// Rebuilds the index from the files: every slot's header (and payload) is checked in parallel.
  void recover()
  {
    std::vector<detail::file_record_header> found(static_cast<std::size_t>(capacity()));
    std::vector<char> intact(static_cast<std::size_t>(capacity()), 0);
    std::vector<recovered_record> identity(static_cast<std::size_t>(capacity()));
    std::int64_t const chunk = runs_max_;
    std::atomic<std::int64_t> remaining{(capacity() + chunk - 1) / chunk};
    std::mutex m;
    std::condition_variable cv;
    std::string first_error;
    for (std::int64_t first = 0; first < capacity(); first += chunk) {
      pool_->post([&, first](int worker) {
        auto& buf = worker_buffers_[static_cast<std::size_t>(worker)];
        bool have_buffer = true;
        try {
          buf.staging.ensure(static_cast<std::size_t>(record_bytes_));
        } catch (std::exception const& e) {  // no memory for a record: its slots are dropped
          have_buffer = false;
          std::lock_guard lock{m};
          if (first_error.empty()) { first_error = detail::concat("file_store: recovery: ", e.what()); }
        }
        for (std::int64_t s = first; have_buffer && s < std::min(first + chunk, capacity()); ++s) {
          auto const [fd, off] = where(s);
          iovec v{buf.staging.data(),
                  static_cast<std::size_t>(options_.verify_on_reopen ? record_bytes_ : detail::file_header_bytes)};
          int const e = detail::transfer_all(options_.io, false, fd, &v, 1, off);
          detail::file_record_header h{};
          bool ok = e == 0 && check_header(buf.staging.data(), s, h) == nullptr;
          if (ok && options_.verify_on_reopen) {
            ok = detail::crc32c(0, buf.staging.data() + detail::file_header_bytes,
                                static_cast<std::size_t>(page_bytes_)) == h.payload_crc;
          }
          if (ok) {  // the header checksum covers the identity
            auto& r = identity[static_cast<std::size_t>(s)];
            std::uint32_t count = 0;
            std::memcpy(&r.parent_key, buf.staging.data() + detail::file_identity_offset, sizeof r.parent_key);
            std::memcpy(&count, buf.staging.data() + detail::file_identity_offset + 8, sizeof count);
            ok = std::int64_t(count) <= max_record_ids;
            if (ok) {
              r.ids.resize(count);
              if (count > 0) {
                std::memcpy(r.ids.data(), buf.staging.data() + detail::file_ids_offset, count * sizeof(std::int32_t));
              }
            }
          }
          if (e != 0) {
            std::lock_guard lock{m};
            if (first_error.empty()) { first_error = io_failure("recovery read", s, 1, e); }
          }
          found[static_cast<std::size_t>(s)] = h;
          intact[static_cast<std::size_t>(s)] = ok ? 1 : 0;
        }
        // Notified under the lock: the waiting thread returns (and its `cv` and `m` go) only once
        // this thread has let go of both.
        std::lock_guard lock{m};
        remaining.fetch_sub(1);
        cv.notify_all();
      });
    }
    {
      std::unique_lock lock{m};
      cv.wait(lock, [&] { return remaining.load() == 0; });
    }
    last_error_ = first_error;
    // The allocator hands out slots from the back of its free stack: allocate everything, then
    // release the slots without an intact record (in descending order, so that ascending ids come
    // out first again).
    (void)slots_.allocate(capacity());
    std::vector<std::int64_t> free_slots;
    for (std::int64_t s = capacity() - 1; s >= 0; --s) {
      auto const& h = found[static_cast<std::size_t>(s)];
      if (intact[static_cast<std::size_t>(s)]) {
        index_[static_cast<std::size_t>(s)] = slot_state{h.key, h.sequence, true, false};
        next_sequence_ = std::max(next_sequence_, h.sequence + 1);
      } else {
        free_slots.push_back(s);
      }
    }
    if (!free_slots.empty()) { slots_.release(free_slots); }
    for (std::int64_t s = 0; s < capacity(); ++s) {
      if (!intact[static_cast<std::size_t>(s)]) { continue; }
      auto& r = identity[static_cast<std::size_t>(s)];
      r.slot = s;
      r.key = found[static_cast<std::size_t>(s)].key;
      recovered_.push_back(std::move(r));
    }
    dropped_ = 0;
    for (std::int64_t s = 0; s < capacity(); ++s) {
      auto const& h = found[static_cast<std::size_t>(s)];
      if (!intact[static_cast<std::size_t>(s)] && h.magic != 0) { ++dropped_; }  // zeros: never written
    }
  }

  kv_geometry geometry_;
  slot_allocator slots_;
  file_store_options options_;
  std::int64_t page_bytes_ = 0;
  std::int64_t record_bytes_ = 0;
  std::int64_t slots_per_file_ = 0;
  std::int64_t runs_max_ = 1;
  std::uint64_t geometry_hash_ = 0;
  bool direct_ = false;
  std::vector<detail::unique_fd> files_;
  std::vector<std::string> paths_;
  std::vector<slot_state> index_;
  std::vector<recovered_record> recovered_;
  std::int64_t dropped_ = 0;
  std::uint64_t next_sequence_ = 1;
  std::uint64_t next_ticket_ = 1;
  std::map<std::uint64_t, std::shared_ptr<batch>> tickets_;
  std::string last_error_;
  std::mutex done_mutex_;
  std::condition_variable done_cv_;
  std::vector<worker_buffers> worker_buffers_;
#ifdef STRATA_FILE_STORE_URING
  std::unique_ptr<detail::io_uring_ring> ring_;  // used by the owner thread only
  std::map<std::uint64_t, std::unique_ptr<uring_run>> uring_runs_;
  std::uint64_t next_run_ = 1;
#endif
  std::unique_ptr<detail::io_thread_pool> pool_;  // last: its threads stop before anything they use goes
};
static_assert(record_store<file_store>);

}  // namespace strata
