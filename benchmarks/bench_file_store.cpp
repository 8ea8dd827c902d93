// SPDX-License-Identifier: Apache-2.0
// The file tier's page reads and writes against a plain sequential read and write of the same
// bytes, on the same disk, in the same run.
//
// Each iteration moves every page of a 512 MiB batch through `file_store` (one checksummed record
// per page, adjacent records merged, `io_threads` threads, O_DIRECT where the file system allows)
// and then the same number of payload bytes through one file with `pread`/`pwrite` of 64 MiB
// (the same O_DIRECT setting): `GB/s` is the store's rate, `seq_GB/s` the reference's,
// `vs_seq` their ratio. Run with --benchmark_repetitions=5 (the default here) and read the median
// rows. STRATA_BENCH_DIR picks the directory (default: the system's temporary directory);
// STRATA_BENCH_IO_URING (0/1), STRATA_BENCH_IO_THREADS and STRATA_BENCH_MAX_IO_MIB override the
// store's I/O settings.
#include <strata/geometry.hpp>
#include <strata/tier/file_store.hpp>

#include "bench_main.hpp"

#include <benchmark/benchmark.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;
namespace fs = std::filesystem;

constexpr std::int64_t batch_bytes = std::int64_t{512} << 20;
constexpr std::size_t reference_chunk = std::size_t{64} << 20;

fs::path bench_dir()
{
  char const* env = std::getenv("STRATA_BENCH_DIR");
  return fs::path{env ? env : fs::temp_directory_path().string()} /
         ("strata-bench-file-store-" + std::to_string(::getpid()));
}

/// Page-aligned host memory (as a pinned host pool's records), random bytes.
struct host_memory {
  struct deleter {
    void operator()(std::byte* p) const noexcept { ::operator delete(p, std::align_val_t{4096}); }
  };
  std::unique_ptr<std::byte, deleter> buffer;
  explicit host_memory(std::size_t bytes)
      : buffer{static_cast<std::byte*>(::operator new(bytes, std::align_val_t{4096}))}
  {
    std::mt19937_64 rng{7};
    auto* p = reinterpret_cast<std::uint64_t*>(buffer.get());
    for (std::size_t i = 0; i < bytes / 8; ++i) {
      p[i] = rng();
    }
  }
};

/// The store, its records, and the reference file of the same size.
struct setup {
  std::unique_ptr<strata::file_store> store;
  /// A descriptor closed on destruction.
  struct owned_fd {
    int fd = -1;
    owned_fd() = default;
    owned_fd(owned_fd const&) = delete;
    owned_fd& operator=(owned_fd const&) = delete;
    ~owned_fd()
    {
      if (fd >= 0) { ::close(fd); }
    }
    [[nodiscard]] int get() const noexcept { return fd; }
  } reference;
  std::vector<std::int64_t> slots, shuffled;
  std::vector<std::byte*> records, shuffled_records;
  std::vector<std::uint64_t> keys, shuffled_keys;
  std::size_t bytes = 0;
};

std::byte* shared_memory()
{
  static host_memory memory{static_cast<std::size_t>(batch_bytes)};
  return memory.buffer.get();
}

setup& make_setup(std::string const& name, strata::kv_geometry const& g)
{
  static std::vector<std::unique_ptr<setup>> keep;
  auto& s = *keep.emplace_back(std::make_unique<setup>());
  auto const dir = bench_dir() / name;
  fs::create_directories(dir);
  std::int64_t const pages = batch_bytes / g.page_bytes();
  strata::file_store_options o;
  o.directory = dir.string();
  o.tag = name;
  if (char const* t = std::getenv("STRATA_BENCH_IO_THREADS")) { o.io_threads = std::atoi(t); }
  if (char const* u = std::getenv("STRATA_BENCH_IO_URING")) { o.use_io_uring = std::atoi(u) != 0; }
  if (char const* m = std::getenv("STRATA_BENCH_MAX_IO_MIB")) { o.max_io_bytes = std::int64_t{std::atoi(m)} << 20; }
  s.store = std::make_unique<strata::file_store>(g, pages, o);
  s.slots = s.store->slots().allocate(pages);
  auto* base = shared_memory();
  for (std::int64_t i = 0; i < pages; ++i) {
    s.records.push_back(base + i * g.page_bytes());
    s.keys.push_back(static_cast<std::uint64_t>(i) * 0x9e3779b97f4a7c15ULL);
  }
  std::vector<std::size_t> perm(static_cast<std::size_t>(pages));
  std::iota(perm.begin(), perm.end(), std::size_t{0});
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64{2});
  for (auto i : perm) {
    s.shuffled.push_back(s.slots[i]);
    s.shuffled_records.push_back(s.records[i]);
    s.shuffled_keys.push_back(s.keys[i]);
  }
  s.bytes = static_cast<std::size_t>(pages * g.page_bytes());
  auto const ref_path = (dir / "reference.dat").string();
  int fd =
      ::open(ref_path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | (s.store->direct_io() ? O_DIRECT : 0), 0644);
  if (fd < 0) {
    std::perror("bench_file_store: reference file");
    std::exit(1);
  }
  s.reference.fd = fd;
  if (::posix_fallocate(fd, 0, static_cast<off_t>(s.bytes)) != 0) {
    std::fprintf(stderr, "bench_file_store: cannot preallocate %zu bytes in %s\n", s.bytes, dir.c_str());
    std::exit(1);
  }
  // First writes of both (allocated extents become written ones), so that no run pays for it.
  std::vector<std::byte const*> sources(s.records.begin(), s.records.end());
  if (!s.store->write(s.slots, sources, s.keys)) {
    std::fprintf(stderr, "bench_file_store: %s\n", s.store->last_error().c_str());
    std::exit(1);
  }
  for (std::size_t off = 0; off < s.bytes; off += reference_chunk) {
    (void)::pwrite(fd, base + off, std::min(reference_chunk, s.bytes - off), static_cast<off_t>(off));
  }
  return s;
}

/// One sequential pass over the reference file; returns seconds.
double reference_pass(setup& s, bool write)
{
  auto* base = shared_memory();
  auto const t0 = clock_type::now();
  for (std::size_t off = 0; off < s.bytes; off += reference_chunk) {
    auto const n = std::min(reference_chunk, s.bytes - off);
    ssize_t const r = write ? ::pwrite(s.reference.get(), base + off, n, static_cast<off_t>(off))
                            : ::pread(s.reference.get(), base + off, n, static_cast<off_t>(off));
    if (r != static_cast<ssize_t>(n)) {
      std::perror("bench_file_store: reference I/O");
      std::exit(1);
    }
  }
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

/// CPU seconds of the whole process (every thread), user and system.
double process_cpu_s()
{
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto const s = [](timeval const& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

enum class op { write, read, read_shuffled };

void run(benchmark::State& state, setup& s, op what)
{
  double store_s = 0, ref_s = 0, store_cpu = 0, ref_cpu = 0;
  std::vector<std::byte const*> sources(s.records.begin(), s.records.end());
  for (auto _ : state) {
    auto const c0 = process_cpu_s();
    auto const t0 = clock_type::now();
    bool ok = true;
    switch (what) {
      case op::write:
        ok = s.store->write(s.slots, sources, s.keys);
        break;
      case op::read:
        ok = s.store->read(s.slots, s.records, s.keys);
        break;
      case op::read_shuffled:
        ok = s.store->read(s.shuffled, s.shuffled_records, s.shuffled_keys);
        break;
    }
    double const t = std::chrono::duration<double>(clock_type::now() - t0).count();
    auto const c1 = process_cpu_s();
    if (!ok) {
      state.SkipWithError(s.store->last_error().c_str());
      return;
    }
    ref_s += reference_pass(s, what == op::write);
    ref_cpu += process_cpu_s() - c1;
    store_cpu += c1 - c0;
    store_s += t;
    state.SetIterationTime(t);
  }
  double const n = static_cast<double>(state.iterations());
  state.counters["GB/s"] = static_cast<double>(s.bytes) * n / store_s / 1e9;
  state.counters["seq_GB/s"] = static_cast<double>(s.bytes) * n / ref_s / 1e9;
  state.counters["vs_seq"] = ref_s / store_s;
  state.counters["MiB"] = static_cast<double>(s.bytes) / (1 << 20);
  // CPU seconds (all threads, user + system) per GB moved: checksums and copies are the store's extra.
  state.counters["cpu_s/GB"] = store_cpu / (static_cast<double>(s.bytes) * n / 1e9);
  state.counters["seq_cpu_s/GB"] = ref_cpu / (static_cast<double>(s.bytes) * n / 1e9);
  state.counters["direct"] = s.store->direct_io() ? 1 : 0;
  state.counters["uring"] = s.store->uses_io_uring() ? 1 : 0;
}

void register_geometry(std::string const& name, strata::kv_geometry const& g)
{
  auto& s = make_setup(name, g);
  auto add = [&](std::string const& what, op o) {
    benchmark::RegisterBenchmark((name + "/" + what).c_str(), [&s, o](benchmark::State& st) { run(st, s, o); })
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->MinTime(1.0);
  };
  add("write", op::write);
  add("read", op::read);
  add("read(shuffled slots)", op::read_shuffled);
}

}  // namespace

int main(int argc, char** argv)
{
  register_geometry("llama3.1-8b-p32", strata::models::llama31_8b.geometry(32));  // 4 MiB records
  register_geometry("llama3.1-8b-p16", strata::models::llama31_8b.geometry(16));  // 2 MiB records
  strata::bench::run_benchmarks(argc, argv);
  std::error_code ec;
  fs::remove_all(bench_dir(), ec);
}
