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

#include <strata/detail/thread_pool.hpp>
#include <strata/error.hpp>
#include <strata/geometry.hpp>
#include <strata/tier/concepts.hpp>
#include <strata/tier/detail/file_store/format.hpp>
#include <strata/tier/detail/file_store/io_uring_ring.hpp>
#include <strata/tier/detail/file_store/posix.hpp>
#include <strata/tier/io_backend.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <span>
#include <sstream>
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

/// @brief How a `file_store` lays out and reaches its files.
struct file_store_options {
  std::string directory;  ///< where the files live (created if missing): one drive (else `directories`)
  /// One directory per drive (created if missing), instead of `directory`: records are striped
  /// across them one by one (slot `s` on drive `s % N`), so that a run of pages reads from every
  /// drive at once, each drive with its own I/O queue. Give them in the same order on every reopen.
  std::vector<std::string> directories;
  int files = 1;              ///< files per directory the records are spread over (contiguous slot ranges)
  int tp_rank = 0;            ///< tensor-parallel rank of this store (part of the file names and hash)
  int tp_size = 1;            ///< tensor-parallel ranks
  std::string tag;            ///< model and dtype, e.g. "Llama-3.1-8B/bf16": records of another tag are dropped
  bool use_direct_io = true;  ///< `O_DIRECT` where the file system accepts it
  /// io_uring (where the kernel allows it and `io` is the default back end) instead of the I/O
  /// threads. Off by default: its owner thread checksums every record (and copies page-cache
  /// reads), one core for all drives, where the threads spread that work (docs/file_tier.md).
  bool use_io_uring = false;
  /// I/O threads per directory; each moves one run of adjacent records at a time. 8: a drive
  /// needs many bytes in flight to reach its rate (measured on the GPU machine's disk, 512 MiB reads
  /// at 1.82 GB/s with 4 threads of 16 MiB, 2.32 with 8, as fast as one 64 MiB-chunk sequential
  /// read), while a run stays `max_io_bytes` long so that a read waits little behind a write.
  int io_threads = 8;
  /// io_uring: how long one transfer may take. Past it the transfer is cancelled, its batch fails,
  /// and the store moves every later transfer to the I/O threads; one the kernel does not let go
  /// of within as long again is abandoned (its batch fails; its buffers are never reused).
  int io_timeout_ms = 30000;
  /// io_uring: bytes of read transfers in flight. Reads land in the store's own staging (then
  /// checked and copied out), never straight in the caller's memory, so that an abandoned transfer
  /// cannot write there later; this bounds that staging.
  std::int64_t uring_staging_bytes = std::int64_t{64} << 20;
  bool reopen = false;  ///< keep existing files and recover their intact records
  /// On reopen, check every payload's checksum too. Off by default: reopening reads the headers
  /// only (a 1 TB store restarts in seconds, not minutes), and payloads are checked on every read,
  /// where a bad one fails its own page (`page_status_store`), as a reopen would have dropped it.
  bool verify_on_reopen = false;
  bool sync_writes = false;  ///< `fdatasync` after every write run (survives power loss, not just crashes)
  std::int64_t max_io_bytes = std::int64_t{16} << 20;  ///< largest merged transfer
  /// How long to wait for another store's lock on the files: a killed process's lock outlives it
  /// while the kernel cancels its io_uring requests.
  int lock_wait_ms = 2000;
  io_backend io{};  ///< system calls (tests inject faults here)
};

/// @brief The directories of `options`, one per drive: `directories`, or `directory` alone.
/// @param what the caller, for the error message
/// @throw strata::invalid_argument unless exactly one of the two is given
[[nodiscard]] inline std::vector<std::string> drive_directories(file_store_options const& options, char const* what)
{
  STRATA_EXPECTS(options.directory.empty() != options.directories.empty(), what,
                 ": give one of directory (one drive) and directories (one per drive), got ",
                 options.directory.empty() ? "neither" : "both");
  return options.directories.empty() ? std::vector<std::string>{options.directory} : options.directories;
}

/// @brief An intact record found when reopening a store: its slot, and what it says of its page.
struct recovered_record {
  std::int64_t slot{};            ///< record slot (allocated in `slots()`)
  std::uint64_t key{};            ///< content key it was written with
  std::uint64_t parent_key{};     ///< key of the page before it in its prefix (0: a first page, or not given)
  std::vector<std::int32_t> ids;  ///< the page's ids (token ids), as written; empty when not given
  friend bool operator==(recovered_record const&, recovered_record const&) = default;
};

/**
 * @brief The file tier: `capacity()` page records on local disk, a `record_store`.
 *
 * Over N directories (drives), slot `s` lives on drive `d = s % N` as its record `l = s / N`, in
 * that drive's file `l / slots_per_file()` at offset `(l % slots_per_file()) * record_bytes()`
 * (one drive: slot `s` is record `s`): a 4 KiB header (magic, format version, geometry hash, content key, payload
 * length, sequence number, slot, CRC-32C of the payload and of the header) followed by the page-first payload, padded
 * to 4 KiB so that every transfer stays `O_DIRECT`-aligned. Runs of adjacent records of one file move in one vectored
 * transfer of up to `max_io_bytes` (slots `s, s + N, s + 2N, ...` are adjacent on their drive), a drive's share of a
 * batch split so that each of its `io_threads` has a run (never below 1 MiB a transfer), on each drive's own
 * `io_threads` threads (which also compute and check the checksums), or, with `use_io_uring`, submitted to one io_uring
 * ring, the runs of the drives interleaved (`uses_io_uring()`).
 *
 * What a read returns true for is exactly what the last successful write to those slots stored:
 * every record's header, payload checksum, key and sequence number are checked against the
 * store's index; any mismatch, I/O error or short file fails the batch. Reads report each record
 * (`read(..., intact)`, `poll` / `wait` with `intact`, a `page_status_store`): a mismatch fails
 * its record alone and an I/O error the records of its transfer, while the batch's other records
 * still arrive intact. A failed write leaves all of its slots holding no record (reads fail until
 * they are rewritten). Reopening the files
 * (`file_store::open`, or `reopen = true`) recovers every intact record into `recovered()` and marks
 * its slot allocated; torn, corrupt, misplaced and foreign records are dropped.
 *
 * Thread safety: every operation (`read`, `write`, `submit_read`, `submit_write`, `poll`, `wait`,
 * `key`, `last_error`) may be called from any thread, beside the prefix index allocating and
 * releasing `slots()` on its own (one internal lock guards the index of records and the tickets;
 * the transfers and checksums run outside it, on the I/O threads): the executors read and write
 * from their record threads. Reads queue before writes on every drive: a backup in flight delays
 * a load by at most the runs already moving. Files are locked (`flock`) against a second store on
 * the same files.
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
   * @param options directory (or directories), file count, TP rank and size, tag, I/O settings
   * @throw strata::invalid_argument for an invalid geometry, page count or option (both or neither
   *        of `directory` and `directories`, an empty or repeated directory, more drives than
   *        pages, more files than a drive's records), or a size that overflows 64 bits
   * @throw strata::file_store_error when a file cannot be created, opened, locked or preallocated
   *        (a full disk says "no space"); nothing is left open then
   */
  file_store(kv_geometry const& geometry, std::int64_t pages, file_store_options options);

  /**
   * @brief Reopens a store's existing files (creating missing ones) and recovers their intact records.
   * @throw as the constructor
   * @throw strata::file_store_error, with nothing on disk changed, when the store was written with
   *        another geometry (page size included), tag, tensor-parallel size or file count (its
   *        descriptor says so, on each drive: drives given in another order or number are refused
   *        too; without one, its records are all of another configuration: reopen
   *        with the configuration that wrote them, or remove the directory), or when
   *        recovery cannot finish (no memory for its buffers): a record is never dropped for that
   */
  [[nodiscard]] static file_store open(kv_geometry const& geometry, std::int64_t pages, file_store_options options);

  file_store(file_store const&) = delete;
  file_store& operator=(file_store const&) = delete;
  file_store(file_store&&) = delete;
  file_store& operator=(file_store&&) = delete;

  /// @brief Waits for every operation in flight, then closes the files.
  ~file_store();

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
  /// @brief Records per file (the last file of a drive may hold fewer).
  [[nodiscard]] std::int64_t slots_per_file() const noexcept { return slots_per_file_; }
  /// @brief The directories, one per drive (`directory` alone: one).
  [[nodiscard]] std::vector<std::string> const& directories() const noexcept { return dirs_; }
  /// @brief The drive (index into `directories()`) that holds slot `s`: `s % directories().size()`.
  /// @throw strata::invalid_argument for a slot out of range
  [[nodiscard]] std::int64_t drive(std::int64_t s) const
  {
    STRATA_EXPECTS(s >= 0 && s < capacity(), "file_store: slot ", s, " out of range [0, ", capacity(), ")");
    return s % drives_;
  }
  /// @brief Whether transfers go through io_uring (else through the I/O threads).
  [[nodiscard]] bool uses_io_uring() const noexcept;
  /// @brief Whether the files are open with `O_DIRECT`.
  [[nodiscard]] bool direct_io() const noexcept { return direct_; }
  /// @brief Hash of everything a record must agree on: format, geometry, TP rank and size, tag.
  [[nodiscard]] std::uint64_t geometry_hash() const noexcept { return geometry_hash_; }
  /// @brief Paths of the files, drive by drive (each drive's in slot order).
  [[nodiscard]] std::vector<std::string> const& paths() const noexcept { return paths_; }
  /// @brief Intact records found when the store was reopened, in slot order.
  [[nodiscard]] std::span<recovered_record const> recovered() const noexcept { return recovered_; }
  /// @brief Records dropped when the store was reopened (corrupt, torn, foreign or unreadable).
  [[nodiscard]] std::int64_t dropped() const noexcept { return dropped_; }
  /// @brief What went wrong in the last failed operation ("" when none failed yet).
  [[nodiscard]] std::string last_error() const
  {
    std::lock_guard lock{state_mutex_};
    return last_error_;
  }

  /// @brief The key of the record slot `slot` holds, or nothing (never written, or its write failed).
  [[nodiscard]] std::optional<std::uint64_t> key(std::int64_t slot) const;

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
   * @brief As `read` with `expected_keys` (empty: any key), and says which records arrived:
   *        `intact[i]` is true exactly when record `i` is the one last written to `slots[i]` and
   *        arrived whole (its bytes may be used even when the batch failed).
   * @throw strata::invalid_argument as `submit_read`, or when `intact` is not one per slot
   */
  [[nodiscard]] bool read(std::span<std::int64_t const> slots, std::span<std::byte* const> records,
                          std::span<std::uint64_t const> expected_keys, std::span<bool> intact)
  {
    STRATA_EXPECTS(intact.size() == slots.size(), "file_store: read: ", intact.size(), " statuses for ", slots.size(),
                   " slots");
    return wait(submit_read(slots, records, expected_keys), intact);
  }

  /**
   * @brief Starts writing one record per slot; `sources` must stay valid until the ticket completes.
   *        The slots hold no record until then (a read of them fails).
   * @param keys content keys, one per slot, or empty for key 0
   * @param parent_keys the key of the page before each one in its prefix (0: a first page), or empty
   * @param ids the pages' ids, the same number per slot (at most `max_record_ids`), or empty: kept in
   *        the records (copied now) so that a restart can rebuild the prefix index (`recovered()`)
   * @throw strata::invalid_argument for a size mismatch, a null source, a slot out of range, not
   *        allocated, listed twice or with an operation in flight (a read or a write; reads of one
   *        record may overlap each other, not a write); nothing is written then
   */
  [[nodiscard]] io_ticket submit_write(std::span<std::int64_t const> slots, std::span<std::byte const* const> sources,
                                       std::span<std::uint64_t const> keys,
                                       std::span<std::uint64_t const> parent_keys = {},
                                       std::span<std::int32_t const> ids = {});

  /**
   * @brief Starts reading one record per slot; `records` must stay valid until the ticket completes.
   * @param expected_keys the key each record must carry, or empty to accept the key it was written with
   * @throw strata::invalid_argument as `submit_write`, or for a null destination
   */
  [[nodiscard]] io_ticket submit_read(std::span<std::int64_t const> slots, std::span<std::byte* const> records,
                                      std::span<std::uint64_t const> expected_keys);

  /**
   * @brief Whether an operation is done; a completed ticket is consumed (a write's slots then hold
   *        their records, or none on failure).
   * @throw strata::invalid_argument for an unknown or consumed ticket
   */
  [[nodiscard]] io_status poll(io_ticket t) { return poll(t, {}); }

  /**
   * @brief As `poll`; once the operation is done, `intact` (empty, or one per record of the
   *        submission) says which records moved intact (a failed write: none).
   * @throw strata::invalid_argument for an unknown or consumed ticket, or an `intact` of another size
   */
  [[nodiscard]] io_status poll(io_ticket t, std::span<bool> intact);

  /**
   * @brief Waits for an operation and consumes its ticket.
   * @return whether every record moved intact
   * @throw strata::invalid_argument for an unknown or consumed ticket
   */
  [[nodiscard]] bool wait(io_ticket t) { return wait(t, {}); }

  /// @brief As `wait`, with what each record did in `intact` (see `poll`).
  [[nodiscard]] bool wait(io_ticket t, std::span<bool> intact);

 private:
  struct slot_state {
    std::uint64_t key = 0;
    std::uint64_t sequence = 0;
    bool valid = false;
    std::int32_t readers = 0;  // reads in flight (several may read a record at once)
    bool writing = false;      // a write in flight (alone)
  };
  struct item {
    std::int64_t slot = 0;
    std::byte const* src = nullptr;
    std::byte* dst = nullptr;
    std::uint64_t key = 0;
    std::uint64_t sequence = 0;
    std::uint64_t parent_key = 0;  // writes: the page's identity
    std::vector<std::int32_t> ids;
    bool failed = false;  // this record did not move intact (set by the thread of its run)
  };
  struct batch {
    bool write = false;
    std::vector<item> items;
    std::atomic<int> remaining{0};
    std::atomic<bool> failed{false};
    std::mutex error_mutex;
    std::string error;
    /// Items `run` (indices into `items`) failed; the batch with them. `message()` says why (the
    /// first failure's is kept). Never throws: without memory for the message, a fixed one.
    template <class Message>
    void fail(std::span<std::size_t const> run, Message&& message) noexcept
    {
      for (auto i : run) {
        items[i].failed = true;
      }
      std::lock_guard lock{error_mutex};
      if (failed.exchange(true)) { return; }
      try {
        error = message();
      } catch (...) {
        error.clear();  // at most 15 characters fit the string itself: no allocation
        error.shrink_to_fit();
        error = "out of memory";
      }
    }
  };
  struct worker_buffers {
    detail::aligned_buffer headers, staging, pad;
  };

  [[nodiscard]] std::uint64_t compute_geometry_hash() const noexcept;
  /// `pages`, checked before anything is allocated for them.
  static std::int64_t checked_pages(kv_geometry const& geometry, std::int64_t pages);

  /// Refuses a batch that another operation on its slots forbids: a write in flight, or for a
  /// write any operation in flight (reads of one record may overlap).
  void validate(std::span<std::int64_t const> slots, std::size_t buffers, std::size_t keys, bool write) const;

  void open_files();
  /// The store's descriptor on each drive (strata-kv.rank<R>.meta): the configuration its records
  /// need and the drive's place, written once the files exist and checked before a reopen changes
  /// anything.
  [[nodiscard]] std::string descriptor_path(std::int64_t drive) const;
  [[nodiscard]] std::string descriptor_text(std::int64_t drive) const;
  void check_descriptor() const;
  void write_descriptor() const;

  /// Index into `files_` and `paths_` of slot `s`'s file, and the record's index in that file.
  [[nodiscard]] std::pair<std::size_t, std::int64_t> place(std::int64_t s) const noexcept;
  /// Location of slot `s`.
  [[nodiscard]] std::pair<int, off_t> where(std::int64_t s) const noexcept;

  /// Checks a header block against what the slot must hold; returns the reason it fails, or nullptr.
  [[nodiscard]] char const* check_header(std::byte const* block, std::int64_t slot,
                                         detail::file_record_header& h) const noexcept;

  void fill_header(std::byte* block, item const& it, std::uint32_t payload_crc) const noexcept;

  [[nodiscard]] io_ticket launch(std::shared_ptr<batch> b);

  [[nodiscard]] bool aligned_for_direct(void const* p) const noexcept;

  [[nodiscard]] std::string io_failure(char const* what, std::int64_t first_slot, std::size_t n, int e) const;

  /// Builds a run's vectors in `buf` (for a write, its headers and checksums too); returns whether
  /// the run is staged (one aligned buffer instead of the caller's records).
  /// `stage`: a read lands in `buf`'s staging whatever its alignment.
  bool prepare_run(batch& b, std::span<std::size_t const> run, worker_buffers& buf, std::vector<iovec>& iov,
                   bool stage = false) const;

  /// Checks every record of a run that was read into `buf` and the caller's records.
  void verify_read(batch& b, std::span<std::size_t const> run, worker_buffers const& buf, bool staged) const;

  /// A run on an I/O thread: prepare, transfer (continuing after short transfers), verify.
  void thread_run(batch& b, std::span<std::size_t const> run, std::size_t buffers);

#ifdef STRATA_FILE_STORE_URING
  struct uring_run {
    std::shared_ptr<batch> b;
    std::shared_ptr<std::vector<std::size_t> const> order;
    std::size_t first = 0, last = 0;
    worker_buffers buf;
    std::vector<iovec> iov;
    bool staged = false;
    std::size_t bytes = 0;
    std::size_t staging = 0;  // bytes of `uring_staged_` it holds (a read's)
    std::chrono::steady_clock::time_point started;
    std::optional<std::chrono::steady_clock::time_point> cancelled;  // when its cancellation was asked
    [[nodiscard]] std::span<std::size_t const> run() const noexcept { return {order->data() + first, last - first}; }
  };

  /// Prepares a run on the calling thread and submits it; its checksums overlap the runs in flight.
  /// False when the ring gave up meanwhile (the run goes to the I/O threads).
  bool start_uring_run(std::shared_ptr<batch> const& b, std::shared_ptr<std::vector<std::size_t> const> const& order,
                       std::pair<std::size_t, std::size_t> r);

  /// Completes the runs whose transfers finished; with `block`, waits for at least one, at most
  /// until a run is overdue (`io_timeout_ms`), which it cancels, or abandons once cancelled that long.
  void reap(bool block);

  /// Cancels the runs past `io_timeout_ms`, abandons those cancelled that long ago.
  void expire_uring_runs(std::chrono::steady_clock::time_point now);

  void complete_uring_run(std::uint64_t id, std::int32_t result);
#endif

  [[nodiscard]] std::map<std::uint64_t, std::shared_ptr<batch>>::iterator find(io_ticket t);

  /// Consumes a completed ticket; `intact` (empty, or one per record) says which records moved.
  bool finish(std::map<std::uint64_t, std::shared_ptr<batch>>::iterator it, std::span<bool> intact = {});

  /// Rebuilds the index from the files: every slot's header (and payload) is checked in parallel.
  void recover();

  kv_geometry geometry_;
  slot_allocator slots_;
  file_store_options options_;
  std::int64_t page_bytes_ = 0;
  std::int64_t record_bytes_ = 0;
  std::int64_t slots_per_file_ = 0;
  std::int64_t drives_ = 1;
  std::vector<std::string> dirs_;
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
  mutable std::mutex state_mutex_;  // guards index_, tickets_, next_*, last_error_ and the ring
  std::mutex done_mutex_;
  std::condition_variable done_cv_;
  std::vector<worker_buffers> worker_buffers_;
#ifdef STRATA_FILE_STORE_URING
  std::unique_ptr<detail::io_uring_ring> ring_;  // used by the owner thread only
  std::map<std::uint64_t, std::unique_ptr<uring_run>> uring_runs_;
  std::uint64_t next_run_ = 1;
  static constexpr std::uint64_t cancel_tag = std::uint64_t{1} << 63;  // marks a cancellation's completion
  std::size_t uring_staged_ = 0;                                       // read staging of the runs in flight
  bool ring_gave_up_ = false;                          // a transfer timed out: every later one goes to the I/O threads
  std::vector<std::unique_ptr<uring_run>> abandoned_;  // the kernel may still use their buffers
#endif
  // Last: their threads stop before anything they use goes. One per drive; thread w of drive d
  // uses worker_buffers_[d * io_threads + w].
  std::vector<std::unique_ptr<detail::thread_pool>> pools_;
};
static_assert(restorable_store<file_store>);
static_assert(async_record_store<file_store>);

}  // namespace strata

#include <strata/tier/detail/file_store/file_store.inl>
#include <strata/tier/detail/file_store/recovery.inl>
#include <strata/tier/detail/file_store/uring_runs.inl>
