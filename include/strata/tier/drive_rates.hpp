// SPDX-License-Identifier: Apache-2.0
/**
 * @file tier/drive_rates.hpp
 * @brief Calibrates the file tier: the plain sequential write and read rate of each directory
 *        (drive) of a `file_store_options`, measured on all drives at once, and their aggregate,
 *        which is what the cost model charges (`cost_model::set_file_tier`).
 *
 * Host-only (Linux/POSIX).
 */
#pragma once

#include <strata/error.hpp>
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
#include <string>
#include <thread>
#include <vector>

namespace strata {

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
      for (std::size_t i = 0; i < chunk; i += 8) {  // not zeros: no drive may compress them away
        std::uint64_t const v = (i + 1) * 0x9e3779b97f4a7c15ULL;
        std::memcpy(b.data() + i, &v, 8);
      }
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

}  // namespace strata
