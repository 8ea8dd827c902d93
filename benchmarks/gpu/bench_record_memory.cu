// SPDX-License-Identifier: Apache-2.0
// Where a file-tier read lands: the same `file_store` batch (Llama-3.1-8B 32-token records, 4 MiB)
// read into ordinary host memory and into the pinned host tier's memory by each of its allocation
// routes, with O_DIRECT and buffered, in the same run. A prefetch reads records in place into the
// pinned host tier, so its rate there is what a file hit gets (docs/benchmarks.md).
//
//   bench_record_memory    STRATA_BENCH_DIR: the store's directory (default /dev/shm);
//                          STRATA_BENCH_MIB: bytes read per batch (default 2048);
//                          STRATA_BENCH_IO_THREADS, STRATA_BENCH_FILES: the store's settings
// Also the machine's own copy rate from memory to memory (memcpy of the same bytes on 1 and on
// io_threads threads), the ceiling of any read from a RAM-backed directory.
#include <strata/geometry.hpp>
#include <strata/presets/h200.hpp>
#include <strata/tier/file_store.hpp>
#include <strata/tier/pinned_host_pool.cuh>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

using namespace strata;

namespace {

double median(std::vector<double> v)
{
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main()
{
  kv_geometry const geo = models::llama31_8b.geometry(32);
  char const* dir_env = std::getenv("STRATA_BENCH_DIR");
  char const* mib_env = std::getenv("STRATA_BENCH_MIB");
  std::filesystem::path const dir = std::filesystem::path(dir_env != nullptr ? dir_env : "/dev/shm") /
                                    ("strata_record_memory_" + std::to_string(::getpid()));
  std::int64_t const n = std::max<std::int64_t>(
      1, (mib_env != nullptr ? std::atoll(mib_env) : 2048) * (std::int64_t{1} << 20) / geo.page_bytes());
  std::size_t const bytes = std::size_t(n * geo.page_bytes());
  std::vector<std::int64_t> slots(static_cast<std::size_t>(n));
  std::iota(slots.begin(), slots.end(), std::int64_t{0});

  // Ordinary memory (page-aligned, first touched here; transparent huge pages as the system does).
  auto* plain = static_cast<std::byte*>(std::aligned_alloc(std::size_t{2} << 20, bytes));
  std::memset(plain, 0x5A, bytes);
  std::vector<std::byte*> plain_pages;
  for (std::int64_t i = 0; i < n; ++i) {
    plain_pages.push_back(plain + i * geo.page_bytes());
  }
  struct destination {
    char const* name;
    std::vector<std::byte*> pages;
  };
  std::vector<destination> dests{{"ordinary memory (aligned_alloc)", plain_pages}};
  pinned_pool_options host_alloc;
  pinned_pool_options registered;
  registered.allocation = pinned_allocation::registered;
  pinned_pool_options registered_thp = registered;
  registered_thp.huge = huge_pages::transparent;
  pinned_host_pool const p1{geo, n, host_alloc}, p2{geo, n, registered}, p3{geo, n, registered_thp};
  auto pages_of = [&](pinned_host_pool const& p) {
    std::vector<std::byte*> v;
    for (std::int64_t i = 0; i < n; ++i) {
      v.push_back(p.layout().page_data(i));
      std::memset(v.back(), 0x5A, std::size_t(geo.page_bytes()));
    }
    return v;
  };
  dests.push_back({"pinned host tier, cudaHostAlloc (the default)", pages_of(p1)});
  dests.push_back({"pinned host tier, mmap + cudaHostRegister", pages_of(p2)});
  dests.push_back({"pinned host tier, mmap + THP + cudaHostRegister", pages_of(p3)});

  std::printf("bench_record_memory: %lld records of %lld MiB (%.2f GiB) in %s\n", (long long)n,
              (long long)(geo.page_bytes() >> 20), double(bytes) / double(1 << 30), dir.string().c_str());
  file_store_options base;
  if (char const* t = std::getenv("STRATA_BENCH_IO_THREADS")) { base.io_threads = std::atoi(t); }
  if (char const* f = std::getenv("STRATA_BENCH_FILES")) { base.files = std::atoi(f); }
  {  // memory to memory, the same bytes
    auto* src = static_cast<std::byte*>(std::aligned_alloc(std::size_t{2} << 20, bytes));
    std::memset(src, 0x3C, bytes);
    for (int threads : {1, base.io_threads}) {
      std::vector<double> rates;
      for (int rep = 0; rep < 5; ++rep) {
        auto const t0 = std::chrono::steady_clock::now();
        std::vector<std::thread> ts;
        std::size_t const part = bytes / std::size_t(threads);
        for (int t = 0; t < threads; ++t) {
          ts.emplace_back([&, t] { std::memcpy(plain + std::size_t(t) * part, src + std::size_t(t) * part, part); });
        }
        for (auto& t : ts) {
          t.join();
        }
        rates.push_back(double(bytes) / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                        1e9);
      }
      std::printf("memcpy of the bytes on %d thread%s: %.2f GB/s\n", threads, threads == 1 ? "" : "s", median(rates));
    }
    std::free(src);
  }
  std::printf("store: %d I/O threads, %d file(s)\n", base.io_threads, base.files);
  std::printf("| I/O | destination | read GB/s (median of 5) | vs ordinary memory |\n|---|---|---|---|\n");
  bool ok = true;
  for (bool const direct : {true, false}) {
    std::filesystem::remove_all(dir);
    file_store_options o = base;
    o.directory = dir.string();
    o.use_direct_io = direct;
    file_store s{geo, n, o};
    (void)s.slots().allocate(n);
    std::vector<std::byte const*> sources(plain_pages.begin(), plain_pages.end());
    ok = s.write(slots, sources) && ok;
    double reference = 0;
    for (auto const& d : dests) {
      std::vector<double> rates;
      for (int rep = 0; rep < 5; ++rep) {
        auto const t0 = std::chrono::steady_clock::now();
        ok = s.read(slots, d.pages) && ok;
        double const sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        rates.push_back(double(bytes) / sec / 1e9);
      }
      double const r = median(rates);
      if (reference == 0) { reference = r; }
      std::printf("| %s | %s | %.2f | %.3f |\n", direct && s.direct_io() ? "O_DIRECT" : "buffered", d.name, r,
                  r / reference);
    }
  }
  std::filesystem::remove_all(dir);
  std::free(plain);
  std::printf("bench_record_memory: %s\n", ok ? "PASS" : "FAILED (a read or write failed)");
  return ok ? 0 : 1;
}
