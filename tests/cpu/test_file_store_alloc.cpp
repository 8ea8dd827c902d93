// SPDX-License-Identifier: Apache-2.0
// The file tier when memory runs out, as SQLite tests malloc failures: each operation (a write, a
// read, a reopen, on the I/O threads and on io_uring) is first run once to count the allocations it
// makes on every thread, then once per allocation point N in a process of its own, with the Nth
// allocation failing (std::bad_alloc). Whatever the point, the process must not end (no exception
// escapes an I/O thread, nothing calls std::terminate), the call either succeeds or reports the
// failure (false, or an exception from the call), and afterwards, with memory back, the store is
// whole: no slot is left in flight, every acknowledged record reads back intact, a failed write
// reads as a miss, and a reopen recovers every record (it throws rather than drop one).
//
// This executable replaces the global operator new; it has no other tests.
#include "../support/catch.hpp"

#include <strata/tier/file_store.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <string>
#include <vector>

namespace {

std::atomic<bool> armed{false};     // count (and maybe fail) allocations now
std::atomic<long> allocations{0};   // counted since armed
std::atomic<long> fail_at{0};       // the allocation to fail (1-based; 0: none)
std::atomic<long> failed_count{0};  // failures injected

void* allocate(std::size_t n)
{
  if (armed.load(std::memory_order_relaxed)) {
    long const c = allocations.fetch_add(1, std::memory_order_relaxed) + 1;
    if (c == fail_at.load(std::memory_order_relaxed)) {
      failed_count.fetch_add(1, std::memory_order_relaxed);
      throw std::bad_alloc{};
    }
  }
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) { throw std::bad_alloc{}; }
  return p;
}

}  // namespace

void* operator new(std::size_t n) { return allocate(n); }
void* operator new[](std::size_t n) { return allocate(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
// The nothrow forms too (std::stable_sort's temporary buffer uses them): every allocation the
// sized deletes above free must come from malloc, or a sanitizer's allocator sees a mismatch.
void* operator new(std::size_t n, std::nothrow_t const&) noexcept
{
  try {
    return allocate(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, std::nothrow_t const& t) noexcept { return operator new(n, t); }
void operator delete(void* p, std::nothrow_t const&) noexcept { std::free(p); }
void operator delete[](void* p, std::nothrow_t const&) noexcept { std::free(p); }

namespace {

namespace fs = std::filesystem;
using strata::file_store;
using strata::file_store_options;
using strata::kv_geometry;

constexpr kv_geometry geo{1, 16, 1, 64, 2, 2};  // 4 KiB pages
constexpr std::int64_t pages = 8;

std::uint64_t mix(std::uint64_t x)
{
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
void fill(std::byte* p, std::uint64_t key)
{
  for (std::int64_t i = 0; i < geo.page_bytes(); i += 8) {
    std::uint64_t const v = mix(key + std::uint64_t(i));
    std::memcpy(p + i, &v, 8);
  }
}
bool holds(std::byte const* p, std::uint64_t key)
{
  std::vector<std::byte> want(std::size_t(geo.page_bytes()));
  fill(want.data(), key);
  return std::memcmp(want.data(), p, want.size()) == 0;
}

/// Pages of content `key_base + slot`, and the calls to write and read them.
struct pages_of {
  std::vector<std::vector<std::byte>> bytes;
  std::vector<std::uint64_t> keys;
  explicit pages_of(std::uint64_t key_base) : bytes(pages, std::vector<std::byte>(std::size_t(geo.page_bytes())))
  {
    for (std::int64_t s = 0; s < pages; ++s) {
      keys.push_back(key_base + std::uint64_t(s));
      fill(bytes[std::size_t(s)].data(), keys.back());
    }
  }
  [[nodiscard]] std::vector<std::byte const*> sources() const
  {
    std::vector<std::byte const*> out;
    for (auto const& b : bytes) {
      out.push_back(b.data());
    }
    return out;
  }
};

std::vector<std::int64_t> slots()
{
  std::vector<std::int64_t> s(pages);
  for (std::int64_t i = 0; i < pages; ++i) {
    s[std::size_t(i)] = i;
  }
  return s;
}

file_store_options options(fs::path const& dir, bool uring)
{
  file_store_options o;
  o.directory = dir.string();
  o.tag = "alloc-test";
  o.io_threads = 2;
  o.max_io_bytes = 3 * (geo.page_bytes() + 4096);  // several runs per batch
  o.use_io_uring = uring;
  return o;
}

enum class operation { write, read, reopen };

/// Reads every slot; true when each holds the record of `expect` (or, where `expect_old` is given
/// and the read fails or holds another, that one's: a write that failed before it started).
int check_all(file_store& s, pages_of const& expect, pages_of const* either)
{
  std::vector<std::vector<std::byte>> out(pages, std::vector<std::byte>(std::size_t(geo.page_bytes())));
  std::vector<std::byte*> dst;
  for (auto& b : out) {
    dst.push_back(b.data());
  }
  auto const sl = slots();
  for (std::int64_t i = 0; i < pages; ++i) {
    std::span<std::int64_t const> one{&sl[std::size_t(i)], 1};
    std::span<std::byte* const> d{&dst[std::size_t(i)], 1};
    bool const ok = s.read(one, d);
    bool const right = ok && (holds(out[std::size_t(i)].data(), expect.keys[std::size_t(i)]) ||
                              (either != nullptr && holds(out[std::size_t(i)].data(), either->keys[std::size_t(i)])));
    if (either == nullptr && !right) {
      std::fprintf(stderr, "slot %lld: %s\n", (long long)i, ok ? "wrong bytes" : s.last_error().c_str());
      return 20;
    }
    if (ok && !right) {
      std::fprintf(stderr, "slot %lld: wrong bytes served\n", (long long)i);
      return 21;
    }
  }
  return 0;
}

/// One run of `op` with allocation `n` failing (0: none); returns a process exit code (0: the store
/// behaved). `count`: the allocations the operation made.
int run(operation op, bool uring, fs::path const& dir, long n, long* count)
{
  fs::remove_all(dir);
  pages_of const first{1000}, second{2000};
  auto const sl = slots();
  {
    file_store s{geo, pages, options(dir, uring)};
    (void)s.slots().allocate(pages);
    if (!s.write(sl, first.sources(), first.keys)) { return 10; }
    if (op == operation::reopen) {
      // The store goes; the reopen below runs with the failure armed.
    } else {
      std::vector<std::vector<std::byte>> out(pages, std::vector<std::byte>(std::size_t(geo.page_bytes())));
      std::vector<std::byte*> dst;
      for (auto& b : out) {
        dst.push_back(b.data());
      }
      auto const sources = second.sources();
      bool ok = false;
      bool threw = false;
      fail_at = n;
      allocations = 0;
      armed = true;
      try {
        ok = op == operation::write ? s.write(sl, sources, second.keys) : s.read(sl, dst, first.keys);
      } catch (std::bad_alloc const&) {
        threw = true;
      } catch (strata::error const&) {
        threw = true;
      }
      armed = false;
      if (count != nullptr) { *count = allocations.load(); }
      if (op == operation::read && ok) {
        for (std::int64_t i = 0; i < pages; ++i) {
          if (!holds(out[std::size_t(i)].data(), first.keys[std::size_t(i)])) { return 11; }  // true: every byte right
        }
      }
      if (n == 0 && (!ok || threw)) { return 12; }  // without a failure, it works
      // Memory is back: the records are whole, and no slot is left in flight.
      if (op == operation::write) {
        // A failed write: the slots read as misses or (failed before it started) the first records.
        if (int const e = check_all(s, second, ok ? nullptr : &first); e != 0) { return e; }
        if (!s.write(sl, second.sources(), second.keys)) { return 13; }  // not in flight
        if (int const e = check_all(s, second, nullptr); e != 0) { return e; }
      } else {
        if (int const e = check_all(s, first, nullptr); e != 0) { return e; }  // nothing was lost
        if (!s.write(sl, second.sources(), second.keys)) { return 14; }        // not in flight
      }
      return 0;
    }
  }
  // Reopen: throws, or recovers every record; then a reopen with memory recovers them all.
  bool opened = false;
  fail_at = n;
  allocations = 0;
  armed = true;
  try {
    file_store s = file_store::open(geo, pages, options(dir, uring));
    armed = false;
    opened = true;
    if (s.recovered().size() != std::size_t(pages)) {
      std::fprintf(stderr, "reopen recovered %zu of %lld records\n", s.recovered().size(), (long long)pages);
      return 15;
    }
  } catch (std::bad_alloc const&) {
  } catch (strata::error const&) {
  }
  armed = false;
  if (count != nullptr) { *count = allocations.load(); }
  if (n == 0 && !opened) { return 16; }
  file_store s = file_store::open(geo, pages, options(dir, uring));
  if (s.recovered().size() != std::size_t(pages)) { return 17; }
  return check_all(s, first, nullptr);  // (a reopened store's recovered slots are allocated)
}

}  // namespace

TEST_CASE("file_store: an allocation that fails at any point is a clean failure, never a lost or stuck record",
          "[cpu][file][alloc]")
{
  fs::path const dir = fs::temp_directory_path() / ("strata_alloc_" + std::to_string(::getpid()));
  for (bool uring : {false, true}) {
    for (operation op : {operation::write, operation::read, operation::reopen}) {
      char const* const name = op == operation::write ? "write" : op == operation::read ? "read" : "reopen";
      INFO(name << (uring ? " on io_uring" : " on the I/O threads"));
      long points = 0;
      REQUIRE(run(op, uring, dir, 0, &points) == 0);  // the count, in this process (its threads are gone after)
      REQUIRE(points > 0);
      int failed = 0;
      for (long n = 1; n <= points; ++n) {
        pid_t const child = ::fork();
        REQUIRE(child >= 0);
        if (child == 0) {
          int code = 0;
          try {
            code = run(op, uring, dir.string() + "-" + std::to_string(n), n, nullptr);
          } catch (std::exception const& e) {
            std::fprintf(stderr, "exception out of the operation: %s\n", e.what());
            code = 30;  // of a kind the store does not document
          } catch (...) {
            code = 31;
          }
          std::error_code ec;
          fs::remove_all(dir.string() + "-" + std::to_string(n), ec);
          std::_Exit(code);
        }
        int status = 0;
        REQUIRE(::waitpid(child, &status, 0) == child);
        bool const ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok) {
          ++failed;
          std::fprintf(stderr, "%s%s: allocation %ld of %ld failed the check (status %d)\n", name,
                       uring ? " on io_uring" : "", n, points, status);
          UNSCOPED_INFO("allocation " << n << " of " << points << ": "
                                      << (WIFEXITED(status) ? "exit code " + std::to_string(WEXITSTATUS(status))
                                                            : "killed by signal " + std::to_string(WTERMSIG(status))));
        }
      }
      WARN(name << (uring ? " (io_uring)" : " (I/O threads)") << ": " << points
                << " allocation points, each failed once in a process of its own");
      CHECK(failed == 0);
    }
  }
  fs::remove_all(dir);
}
