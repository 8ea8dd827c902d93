// SPDX-License-Identifier: Apache-2.0
// The file tier over several drives: aggregate sequential reads through one `file_store` over N
// directories (records striped across them, a queue per drive) against plain sequential reads of
// the same directories, in the same run.
//
// STRATA_BENCH_DIRS lists the directories, one per drive, separated by ':' (default: four under the
// system's temporary directory); STRATA_BENCH_DRIVE_MIB the bytes each drive holds (default 512);
// STRATA_BENCH_IO_URING (0/1) and STRATA_BENCH_IO_THREADS override the store's I/O settings.
// For N = 1 .. the number of directories, each iteration reads every record of a store over the
// first N directories (Llama-3.1-8B pages of 16 tokens, 2 MiB records, in slot order: one batch),
// then the references: one plain file per directory of the same bytes, read with `pread` of 16 MiB
// (O_DIRECT as the store), first all directories at once (one thread each: `together_GB/s`),
// then each alone (`alone_sum_GB/s`, the sum of the N rates). `vs_together` and `vs_alone_sum`
// are the store's rate over each. Directories on one disk share its bandwidth: there the alone
// sum counts the disk N times, and `vs_together` is the ratio that means something. Run with
// --benchmark_repetitions=5 (the default here) and read the median rows. Before the runs,
// `measure_drives` (the calibration the cost model takes) is printed for the same directories.
#include <strata/geometry.hpp>
#include <strata/tier/drive_rates.hpp>
#include <strata/tier/file_store.hpp>

#include "bench_main.hpp"

#include <benchmark/benchmark.h>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;
namespace fs = std::filesystem;

constexpr std::size_t reference_chunk = std::size_t{16} << 20;

std::int64_t drive_bytes()
{
  char const* env = std::getenv("STRATA_BENCH_DRIVE_MIB");
  return std::int64_t{env ? std::atoi(env) : 512} << 20;
}

/// The drives' directories (a subdirectory of each, removed at the end).
std::vector<fs::path> const& drive_dirs()
{
  static std::vector<fs::path> dirs = [] {
    std::vector<fs::path> v;
    std::string list;
    if (char const* env = std::getenv("STRATA_BENCH_DIRS")) { list = env; }
    std::istringstream in{list};
    for (std::string d; std::getline(in, d, ':');) {
      if (!d.empty()) { v.emplace_back(d); }
    }
    if (v.empty()) {
      for (int i = 0; i < 4; ++i) {
        v.push_back(fs::temp_directory_path() / ("drive" + std::to_string(i)));
      }
    }
    for (auto& d : v) {
      d /= "strata-bench-drives-" + std::to_string(::getpid());
      fs::create_directories(d);
    }
    return v;
  }();
  return dirs;
}

/// Page-aligned host memory for every drive's records.
std::byte* host_memory()
{
  struct deleter {
    void operator()(std::byte* p) const noexcept { ::operator delete(p, std::align_val_t{4096}); }
  };
  static std::unique_ptr<std::byte, deleter> memory{static_cast<std::byte*>(
      ::operator new(static_cast<std::size_t>(drive_bytes()) * drive_dirs().size(), std::align_val_t{4096}))};
  return memory.get();
}

/// A plain file of `drive_bytes()` in each directory, as the reference reads it.
struct reference_files {
  std::vector<int> fds;
  explicit reference_files(bool direct)
  {
    auto* base = host_memory();
    std::memset(base, 0x5a, static_cast<std::size_t>(drive_bytes()));
    for (auto const& d : drive_dirs()) {
      auto const path = (d / "reference.dat").string();
      int const fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | (direct ? O_DIRECT : 0), 0644);
      if (fd < 0) {
        std::perror("bench_file_drives: reference file");
        std::exit(1);
      }
      for (std::int64_t off = 0; off < drive_bytes(); off += std::int64_t(reference_chunk)) {
        if (::pwrite(fd, base, reference_chunk, off) != static_cast<ssize_t>(reference_chunk)) {
          std::perror("bench_file_drives: reference write");
          std::exit(1);
        }
      }
      ::fdatasync(fd);
      fds.push_back(fd);
    }
  }
  reference_files(reference_files const&) = delete;
  reference_files& operator=(reference_files const&) = delete;
  ~reference_files()
  {
    for (int fd : fds) {
      ::close(fd);
    }
  }
  /// One sequential pass over file `d` into drive `d`'s part of the host memory; returns seconds.
  double read(std::size_t d) const
  {
    auto* dst = host_memory() + d * static_cast<std::size_t>(drive_bytes());
    auto const t0 = clock_type::now();
    for (std::int64_t off = 0; off < drive_bytes(); off += std::int64_t(reference_chunk)) {
      if (::pread(fds[d], dst + off, reference_chunk, off) != static_cast<ssize_t>(reference_chunk)) {
        std::perror("bench_file_drives: reference read");
        std::exit(1);
      }
    }
    return std::chrono::duration<double>(clock_type::now() - t0).count();
  }
};

struct setup {
  std::unique_ptr<strata::file_store> store;
  std::vector<std::int64_t> slots;
  std::vector<std::byte*> records;
  std::vector<std::uint64_t> keys;
  std::size_t drives = 0;
  std::int64_t bytes = 0;
};

strata::kv_geometry geometry() { return strata::models::llama31_8b.geometry(16); }

setup& make_setup(std::size_t drives)
{
  static std::vector<std::unique_ptr<setup>> keep;
  auto& s = *keep.emplace_back(std::make_unique<setup>());
  auto const g = geometry();
  std::int64_t const pages = drive_bytes() / g.page_bytes() * std::int64_t(drives);
  strata::file_store_options o;
  for (std::size_t d = 0; d < drives; ++d) {
    o.directories.push_back((drive_dirs()[d] / ("store" + std::to_string(drives))).string());
  }
  o.tag = "bench";
  if (char const* t = std::getenv("STRATA_BENCH_IO_THREADS")) { o.io_threads = std::atoi(t); }
  if (char const* u = std::getenv("STRATA_BENCH_IO_URING")) { o.use_io_uring = std::atoi(u) != 0; }
  s.store = std::make_unique<strata::file_store>(g, pages, o);
  s.slots = s.store->slots().allocate(pages);
  auto* base = host_memory();
  for (std::int64_t i = 0; i < pages; ++i) {
    s.records.push_back(base + i * g.page_bytes());
    s.keys.push_back(static_cast<std::uint64_t>(i) * 0x9e3779b97f4a7c15ULL + 1);
  }
  s.drives = drives;
  s.bytes = pages * g.page_bytes();
  std::vector<std::byte const*> sources(s.records.begin(), s.records.end());
  if (!s.store->write(s.slots, sources, s.keys)) {
    std::fprintf(stderr, "bench_file_drives: %s\n", s.store->last_error().c_str());
    std::exit(1);
  }
  return s;
}

void run(benchmark::State& state, setup& s, reference_files const& ref)
{
  double store_s = 0, together_s = 0, alone_rate = 0;
  double const per_drive = static_cast<double>(drive_bytes());
  for (auto _ : state) {
    auto const t0 = clock_type::now();
    bool const ok = s.store->read(s.slots, s.records, s.keys);
    double const t = std::chrono::duration<double>(clock_type::now() - t0).count();
    if (!ok) {
      state.SkipWithError(s.store->last_error().c_str());
      return;
    }
    store_s += t;
    state.SetIterationTime(t);
    auto const r0 = clock_type::now();
    std::vector<std::thread> threads;
    for (std::size_t d = 0; d < s.drives; ++d) {
      threads.emplace_back([&ref, d] { (void)ref.read(d); });
    }
    for (auto& th : threads) {
      th.join();
    }
    together_s += std::chrono::duration<double>(clock_type::now() - r0).count();
    for (std::size_t d = 0; d < s.drives; ++d) {
      alone_rate += per_drive / ref.read(d);
    }
  }
  double const n = static_cast<double>(state.iterations());
  double const rate = static_cast<double>(s.bytes) * n / store_s;
  double const together = per_drive * static_cast<double>(s.drives) * n / together_s;
  double const alone_sum = alone_rate / n;
  state.counters["drives"] = static_cast<double>(s.drives);
  state.counters["GB/s"] = rate / 1e9;
  state.counters["together_GB/s"] = together / 1e9;
  state.counters["alone_sum_GB/s"] = alone_sum / 1e9;
  state.counters["vs_together"] = rate / together;
  state.counters["vs_alone_sum"] = rate / alone_sum;
  state.counters["direct"] = s.store->direct_io() ? 1 : 0;
  state.counters["uring"] = s.store->uses_io_uring() ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv)
{
  auto const& dirs = drive_dirs();
  {
    strata::file_store_options o;
    for (auto const& d : dirs) {
      o.directories.push_back(d.string());
    }
    auto const r = strata::measure_drives(o, drive_bytes());
    for (auto const& d : r.drives) {
      std::printf("measure_drives: %s read %.2f GB/s, write %.2f GB/s (all drives at once)\n", d.directory.c_str(),
                  d.read_bytes_per_s / 1e9, d.write_bytes_per_s / 1e9);
    }
    std::printf("measure_drives: aggregate read %.2f GB/s, write %.2f GB/s\n", r.read_bytes_per_s / 1e9,
                r.write_bytes_per_s / 1e9);
  }
  std::vector<setup*> setups;
  for (std::size_t n = 1; n <= dirs.size(); ++n) {
    setups.push_back(&make_setup(n));
  }
  reference_files const ref{setups[0]->store->direct_io()};
  for (auto* s : setups) {
    benchmark::RegisterBenchmark(("read/drives:" + std::to_string(s->drives)).c_str(),
                                 [s, &ref](benchmark::State& st) { run(st, *s, ref); })
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(3);
  }
  strata::bench::run_benchmarks(argc, argv);
  setups.clear();
  for (auto const& d : dirs) {
    std::error_code ec;
    fs::remove_all(d, ec);
  }
}
