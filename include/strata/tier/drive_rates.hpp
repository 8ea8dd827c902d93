// SPDX-License-Identifier: Apache-2.0
/**
 * @file tier/drive_rates.hpp
 * @brief Calibrates the file tier: the plain sequential write and read rate of each directory
 *        (drive) of a `file_store_options`, measured on all drives at once, and their aggregate
 *        (`measure_drives`); and what a scratch `file_store` of those options itself moves, records
 *        checksummed into memory as large as the batch (`measure_store`): what the cost model
 *        charges (`cost_model::set_file_tier`).
 *
 * Host-only (Linux/POSIX).
 */
#pragma once

#include <strata/error.hpp>
#include <strata/geometry.hpp>
#include <strata/tier/detail/file_store/posix.hpp>
#include <strata/tier/file_store.hpp>

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

namespace strata {

namespace detail {
/// Fills `n` bytes with a pattern no drive can compress away (not zeros).
inline void fill_calibration_bytes(std::byte* p, std::size_t n) noexcept
{
  for (std::size_t i = 0; i < n; i += 8) {
    std::uint64_t const v = (i + 1) * 0x9e3779b97f4a7c15ULL;
    std::memcpy(p + i, &v, std::min<std::size_t>(8, n - i));
  }
}
}  // namespace detail

/// @brief One drive's measured rates.
struct drive_rate {
  std::string directory;         ///< the drive's directory
  double read_bytes_per_s = 0;   ///< its sequential reads (`io_threads` at once), while every drive read
  double write_bytes_per_s = 0;  ///< its sequential writes (made durable), while every drive wrote
};

/// @brief The file tier's measured rates: per drive, and of all drives together.
struct drive_rates {
  std::vector<drive_rate> drives;  ///< in the order of the options' directories
  /// Bytes of all drives over the time all took, reading at once: what `cost_model::set_file_tier`
  /// takes (drives that share one disk, or a link, are not counted twice).
  double read_bytes_per_s = 0;
  double write_bytes_per_s = 0;  ///< the same for writes
};

/**
 * @brief Measures each drive of `options` (its `directory` or `directories`): every drive writes
 *        `bytes_per_drive` to a scratch file with transfers of `options.max_io_bytes`, made durable
 *        (`fdatasync`), all drives at once, each on `options.io_threads` threads (the store's
 *        queue depth), then reads them back the same way;
 *        the scratch files are removed. `O_DIRECT` as the store would use it (`use_direct_io`,
 *        where the file system accepts it), so that reads come from the drive, not the page cache.
 * @param options the store's options (its records are not touched)
 * @param bytes_per_drive bytes each drive moves each way (a multiple of 4 KiB, at least 4 KiB)
 * @throw strata::invalid_argument for no directory, both `directory` and `directories`, or a bad size
 * @throw strata::file_store_error when a scratch file cannot be created or moved (a full disk
 *        among them); nothing is left behind then
 */
[[nodiscard]] inline drive_rates measure_drives(file_store_options const& options,
                                                std::int64_t bytes_per_drive = std::int64_t{256} << 20)
{
  std::vector<std::string> const dirs = drive_directories(options, "measure_drives");
  STRATA_EXPECTS(bytes_per_drive >= 4096 && bytes_per_drive % 4096 == 0,
                 "measure_drives: bytes_per_drive must be a positive multiple of 4096, got ", bytes_per_drive);
  STRATA_EXPECTS(options.max_io_bytes > 0, "measure_drives: max_io_bytes must be positive, got ", options.max_io_bytes);
  auto const chunk = static_cast<std::size_t>(
      std::min<std::int64_t>(bytes_per_drive, detail::round_up(options.max_io_bytes, detail::file_alignment)));
  struct drive {
    std::string path;
    detail::unique_fd fd;
    std::vector<detail::aligned_buffer> buffers;  // one per thread
    double seconds = 0;
    ~drive()
    {
      if (fd.get() >= 0) { ::unlink(path.c_str()); }
    }
  };
  std::vector<drive> drives(dirs.size());
  for (std::size_t d = 0; d < dirs.size(); ++d) {
    STRATA_EXPECTS(!dirs[d].empty(), "measure_drives: directory ", d, " must not be empty");
    std::error_code ec;
    std::filesystem::create_directories(dirs[d], ec);
    STRATA_EXPECTS_AS(file_store_error, !ec, "measure_drives: cannot create directory ", dirs[d], ": ", ec.message());
    auto& x = drives[d];
    x.path = (std::filesystem::path{dirs[d]} / detail::concat("strata-calibrate.", ::getpid(), ".tmp")).string();
    int const flags = O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC;
    int fd = options.use_direct_io ? ::open(x.path.c_str(), flags | O_DIRECT, 0600) : -1;
    if (fd < 0) { fd = ::open(x.path.c_str(), flags, 0600); }
    STRATA_EXPECTS_AS(file_store_error, fd >= 0, "measure_drives: cannot create ", x.path, ": ",
                      detail::errno_text(errno));
    x.fd = detail::unique_fd{fd};
    x.buffers.resize(static_cast<std::size_t>(options.io_threads));
    for (auto& b : x.buffers) {
      b.ensure(chunk);
      detail::fill_calibration_bytes(b.data(), chunk);
    }
  }
  // Each drive moves its bytes on `io_threads` threads (as the store's queue does), thread t taking
  // chunks t, t + T, ...; a drive's time runs from the common start to its last thread's end.
  auto const per_drive_threads = static_cast<std::size_t>(options.io_threads);
  std::vector<int> errors(drives.size() * per_drive_threads, 0);
  std::vector<double> ends(errors.size(), 0);
  std::vector<std::thread> threads;
  auto join_all = [&] {
    for (auto& t : threads) {
      if (t.joinable()) { t.join(); }
    }
    threads.clear();
  };
  auto pass = [&](bool write) {
    auto const t0 = std::chrono::steady_clock::now();
    for (std::size_t d = 0; d < drives.size(); ++d) {
      for (std::size_t t = 0; t < per_drive_threads; ++t) {
        threads.emplace_back([&, d, t] {
          auto& x = drives[d];
          auto const k = d * per_drive_threads + t;
          for (std::int64_t off = std::int64_t(t * chunk); off < bytes_per_drive && errors[k] == 0;
               off += std::int64_t(per_drive_threads * chunk)) {
            iovec v{x.buffers[t].data(), std::min<std::size_t>(chunk, std::size_t(bytes_per_drive - off))};
            errors[k] = detail::transfer_all(io_backend{}, write, x.fd.get(), &v, 1, off);
          }
          ends[k] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        });
      }
    }
    join_all();
    std::vector<double> synced(drives.size(), 0);
    if (write) {  // made durable, each drive on its own thread: part of the drive's time
      for (std::size_t d = 0; d < drives.size(); ++d) {
        threads.emplace_back([&, d] {
          if (::fdatasync(drives[d].fd.get()) != 0 && errors[d * per_drive_threads] == 0) {
            errors[d * per_drive_threads] = errno;
          }
          synced[d] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        });
      }
      join_all();
    }
    double const wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (std::size_t d = 0; d < drives.size(); ++d) {
      drives[d].seconds = synced[d];
      for (std::size_t t = 0; t < per_drive_threads; ++t) {
        auto const k = d * per_drive_threads + t;
        STRATA_EXPECTS_AS(file_store_error, errors[k] == 0, "measure_drives: ", write ? "writing " : "reading ",
                          drives[d].path, " failed: ", detail::errno_text(errors[k]));
        drives[d].seconds = std::max(drives[d].seconds, ends[k]);
      }
    }
    return wall;
  };
  auto timed = [&](bool write) {
    try {
      return pass(write);
    } catch (...) {  // a thread that could not start: the others finish first
      join_all();
      throw;
    }
  };
  drive_rates r;
  double const total = double(bytes_per_drive) * double(drives.size());
  r.write_bytes_per_s = total / timed(true);
  for (std::size_t d = 0; d < dirs.size(); ++d) {
    r.drives.push_back({dirs[d], 0, double(bytes_per_drive) / drives[d].seconds});
    (void)::posix_fadvise(drives[d].fd.get(), 0, 0, POSIX_FADV_DONTNEED);  // buffered: read the drive, not the cache
  }
  r.read_bytes_per_s = total / timed(false);
  for (std::size_t d = 0; d < dirs.size(); ++d) {
    r.drives[d].read_bytes_per_s = double(bytes_per_drive) / drives[d].seconds;
  }
  return r;
}

/// @brief What a `file_store` moved in `measure_store`: payload bytes per second.
struct store_rates {
  double read_bytes_per_s = 0;   ///< one batch of every record read back, checksums checked
  double write_bytes_per_s = 0;  ///< one batch of every record written (durable with `sync_writes`)
  std::int64_t records = 0;      ///< records in the batch
};

/**
 * @brief Measures the store itself: a scratch `file_store` with `options`' settings (I/O threads,
 *        io_uring, `O_DIRECT`, files, `sync_writes`, `max_io_bytes`) over a scratch subdirectory
 *        of each of its directories writes `bytes` of `geometry`'s records (at least one per drive)
 *        from host memory as large as the batch, then reads them all back in one batch (the page
 *        cache dropped first where it is used); the scratch subdirectories are removed on every
 *        exit path. Unlike `measure_drives` (plain transfers into buffers that stay in the CPU's
 *        caches), this includes what a read of a document costs: headers, checksums, memory that
 *        is not cached. On the H200 machine's RAM-backed directory the two differ by ~3×
 *        (docs/benchmarks.md), which is why the engine loop calibrates with this one.
 * @param geometry the records' shape (the store's)
 * @param options the store's options (its own files are not touched: `directory` or `directories`
 *        only name where the scratch stores go)
 * @param bytes payload bytes to move each way (at least one record per drive)
 * @throw strata::invalid_argument for bad options or geometry, as `file_store`
 * @throw strata::file_store_error when the scratch store cannot be created, written or read
 */
[[nodiscard]] inline store_rates measure_store(kv_geometry const& geometry, file_store_options const& options,
                                               std::int64_t bytes = std::int64_t{512} << 20)
{
  std::vector<std::string> const dirs = drive_directories(options, "measure_store");
  STRATA_EXPECTS(geometry.page_bytes() > 0, "measure_store: invalid geometry");
  auto const drives = std::int64_t(dirs.size());
  std::int64_t const n = std::max(drives, bytes / geometry.page_bytes());
  struct scratch {  // removed on every exit path
    std::vector<std::filesystem::path> paths;
    ~scratch()
    {
      for (auto const& p : paths) {
        std::error_code ec;
        std::filesystem::remove_all(p, ec);
      }
    }
  } made;
  file_store_options o = options;
  o.directory.clear();
  o.directories.clear();
  o.reopen = false;
  o.tag = "strata measure_store";
  for (auto const& d : dirs) {
    made.paths.push_back(std::filesystem::path{d} / detail::concat("strata-calibrate.", ::getpid(), ".store"));
    o.directories.push_back(made.paths.back().string());
  }
  std::vector<std::int64_t> slots(static_cast<std::size_t>(n));
  std::iota(slots.begin(), slots.end(), std::int64_t{0});
  auto const page = static_cast<std::size_t>(geometry.page_bytes());
  detail::aligned_buffer memory;
  memory.ensure(page * static_cast<std::size_t>(n));
  detail::fill_calibration_bytes(memory.data(), page * static_cast<std::size_t>(n));
  std::vector<std::byte*> records;
  for (std::int64_t i = 0; i < n; ++i) {
    records.push_back(memory.data() + static_cast<std::size_t>(i) * page);
  }
  std::vector<std::byte const*> const sources(records.begin(), records.end());
  file_store s{geometry, n, o};
  (void)s.slots().allocate(n);
  store_rates r;
  r.records = n;
  double const total = double(page) * double(n);
  auto t0 = std::chrono::steady_clock::now();
  STRATA_EXPECTS_AS(file_store_error, s.write(slots, sources),
                    "measure_store: writing the scratch records failed: ", s.last_error());
  r.write_bytes_per_s = total / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!s.direct_io()) {
    for (auto const& p : s.paths()) {  // buffered: read the drive, not the page cache
      detail::unique_fd const fd{::open(p.c_str(), O_RDONLY | O_CLOEXEC)};
      if (fd.get() >= 0) { (void)::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED); }
    }
  }
  t0 = std::chrono::steady_clock::now();
  STRATA_EXPECTS_AS(file_store_error, s.read(slots, records),
                    "measure_store: reading the scratch records failed: ", s.last_error());
  r.read_bytes_per_s = total / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace strata
