// SPDX-License-Identifier: Apache-2.0
// Local drives as a keyed store (keyed_file_store): pages by content key in a file_store over one
// or several directories, least recently used pages replaced, kept across restarts. Page bytes come
// from a generator keyed by a hash of the prefix's tokens that shares nothing with the store
// (tests/support/keyed_pages.hpp). The rule throughout: a page `get` reports intact holds exactly
// the bytes written for that prefix; everything else is a miss.
//
// STRATA_TEST_QUICK=1 runs fewer rounds (the sanitizer builds).
#include "../support/catch.hpp"
#include "../support/keyed_pages.hpp"

#include <strata/tier/keyed_file_store.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

using strata::content_key;
using strata::keyed_file_store;
using strata::keyed_file_store_options;
using strata::keyed_page;
using strata::test::document;
using strata::test::get_checked;
using strata::test::landing;
namespace fs = std::filesystem;

namespace {

bool quick() { return std::getenv("STRATA_TEST_QUICK") != nullptr; }

strata::kv_geometry small_geometry() { return {2, 4, 2, 64, 2, 2}; }  // 4 KiB pages

struct scratch_dir {
  fs::path path;
  explicit scratch_dir(char const* name)
      : path(fs::temp_directory_path() / (std::string("strata-kfs-") + name + "-" + std::to_string(::getpid())))
  { fs::remove_all(path); }
  ~scratch_dir() { fs::remove_all(path); }
  [[nodiscard]] std::string sub(std::string const& s) const { return (path / s).string(); }
};

keyed_file_store_options options(std::vector<std::string> dirs, std::int64_t pages, std::string dtype = "bf16")
{
  keyed_file_store_options o;
  o.files.directories = std::move(dirs);
  o.files.io_threads = 2;
  o.space = {"test-model", std::move(dtype), "page_first", small_geometry(), 0, 1};
  o.pages = pages;
  return o;
}

std::int64_t put(keyed_file_store& s, document const& d, std::size_t first = 0, std::size_t count = SIZE_MAX)
{
  auto pages = d.pages(first, count);
  auto src = d.sources(first, count);
  std::unique_ptr<bool[]> ok(new bool[pages.size() + 1]());
  return s.set(pages, src, {ok.get(), pages.size()});
}

}  // namespace

TEST_CASE("keyed file store: pages round-trip and exists counts the leading ones", "[cpu][keyed_file]")
{
  scratch_dir dir("roundtrip");
  keyed_file_store s(options({dir.sub("a"), dir.sub("b"), dir.sub("c")}, 64));
  document d(small_geometry(), 12, 1);
  CHECK(s.exists(d.keys) == 0);
  CHECK(get_checked(s, d) == 0);
  CHECK(put(s, d, 0, 5) == 5);
  CHECK(s.exists(d.keys) == 5);
  CHECK(put(s, d, 6, 6) == 6);  // a hole at page 5
  CHECK(s.exists(d.keys) == 5);
  {
    std::unique_ptr<bool[]> have(new bool[12]());
    CHECK(s.contains(d.keys, {have.get(), 12}) == 11);  // every key but the hole, in any order
    for (std::size_t p = 0; p < 12; ++p) {
      CHECK(have[p] == (p != 5));
    }
    CHECK_THROWS_AS(s.contains(d.keys, {have.get(), 11}), strata::invalid_argument);
  }
  CHECK(get_checked(s, d) == 11);
  CHECK(put(s, d) == 12);  // 11 already held
  CHECK(s.stats().pages_present == 11);
  CHECK(s.exists(d.keys) == 12);
  CHECK(get_checked(s, d) == 12);
  CHECK(s.size() == 12);
  for (std::string const& p : s.files().directories()) {  // striped: every drive holds records
    CHECK(fs::exists(p));
    CHECK(p.find("strata-") != std::string::npos);
  }

  // Other ids under a key that is held: a miss, counted as rejected.
  auto pages = d.pages(0, 1);
  std::vector<std::int32_t> other(d.ids(0).begin(), d.ids(0).end());
  other.back() += 1;
  pages[0].ids = other;
  landing l(1, d.g.page_bytes());
  CHECK(s.get(pages, l.ptrs, l.intact()) == 0);
  CHECK(s.stats().pages_rejected == 1);
  CHECK(s.exists(d.keys) == 12);  // the record itself is fine
}

TEST_CASE("keyed file store: namespaces share a directory without sharing pages", "[cpu][keyed_file]")
{
  scratch_dir dir("namespaces");
  keyed_file_store bf(options({dir.sub("d")}, 16, "bf16"));
  keyed_file_store fp(options({dir.sub("d")}, 16, "fp16"));  // same size, another dtype
  document d(small_geometry(), 4, 2);
  REQUIRE(put(bf, d) == 4);
  CHECK(fp.exists(d.keys) == 0);
  CHECK(get_checked(fp, d) == 0);
  CHECK(!(bf.space_key() == fp.space_key()));
}

TEST_CASE("keyed file store: a restart keeps every page, under both halves of its key", "[cpu][keyed_file]")
{
  scratch_dir dir("restart");
  document d(small_geometry(), 10, 3);
  {
    keyed_file_store s(options({dir.sub("x"), dir.sub("y")}, 32));
    REQUIRE(put(s, d) == 10);
  }
  keyed_file_store s(options({dir.sub("x"), dir.sub("y")}, 32));
  CHECK(s.size() == 10);
  CHECK(s.exists(d.keys) == 10);
  CHECK(get_checked(s, d) == 10);
  // The same low half under another high half is another page.
  std::vector<content_key> twisted{{d.keys[0].hi ^ 1, d.keys[0].lo}};
  CHECK(s.exists(twisted) == 0);
  // Ids survive the restart: other ids under the key are refused.
  auto pages = d.pages(0, 1);
  std::vector<std::int32_t> other(d.ids(0).begin(), d.ids(0).end());
  other.front() ^= 7;
  pages[0].ids = other;
  landing l(1, d.g.page_bytes());
  CHECK(s.get(pages, l.ptrs, l.intact()) == 0);
  // Another capacity over the same files is refused, nothing changed.
  CHECK_THROWS_AS(keyed_file_store(options({dir.sub("x"), dir.sub("y")}, 64)), strata::error);
  CHECK(get_checked(s, d) == 10);
}

TEST_CASE("keyed file store: when full, the least recently used pages go first", "[cpu][keyed_file]")
{
  scratch_dir dir("lru");
  keyed_file_store s(options({dir.sub("d")}, 8));
  document a(small_geometry(), 4, 4), b(small_geometry(), 4, 5), c(small_geometry(), 4, 6);
  REQUIRE(put(s, a) == 4);
  REQUIRE(put(s, b) == 4);
  CHECK(get_checked(s, a) == 4);  // a is now more recent than b
  REQUIRE(put(s, c) == 4);        // replaces b
  CHECK(s.stats().pages_evicted == 4);
  CHECK(s.exists(b.keys) == 0);
  CHECK(get_checked(s, b) == 0);
  CHECK(get_checked(s, a) == 4);
  CHECK(get_checked(s, c) == 4);
  CHECK(s.size() == 8);
}

TEST_CASE("keyed file store: a damaged record fails its own page and is forgotten", "[cpu][keyed_file]")
{
  scratch_dir dir("damage");
  auto o = options({dir.sub("d")}, 8);
  o.files.use_direct_io = false;  // the test writes the file behind the store's back
  keyed_file_store s(o);
  document d(small_geometry(), 4, 7);
  REQUIRE(put(s, d, 0, 1) == 1);  // page 0 in slot 0 (a fresh store hands out slots in order)
  REQUIRE(put(s, d, 1, 3) == 3);
  {
    int fd = ::open(s.files().paths().front().c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    char byte = 0;
    off_t const at = 4096 + 100;  // slot 0's payload
    REQUIRE(::pread(fd, &byte, 1, at) == 1);
    byte = char(byte ^ 0x10);
    REQUIRE(::pwrite(fd, &byte, 1, at) == 1);
    ::close(fd);
  }
  CHECK(get_checked(s, d) == 3);
  CHECK(s.stats().pages_rejected == 1);
  CHECK(s.exists(d.keys) == 0);  // page 0 forgotten
  CHECK(s.exists(std::span(d.keys).subspan(1)) == 3);
  CHECK(put(s, d, 0, 1) == 1);  // and written again
  CHECK(get_checked(s, d) == 4);
}

TEST_CASE("keyed file store: a page two sets wrote at once is recovered once, its other slot free",
          "[cpu][keyed_file][threads]")
{
  scratch_dir dir("race");
  int const docs = 16;
  std::vector<document> all, more;
  for (int i = 0; i < docs; ++i) {
    all.emplace_back(small_geometry(), 2, 500 + std::uint32_t(i));
  }
  {
    keyed_file_store s(options({dir.sub("a")}, 4 * docs));
    // Two threads store every page at the same moment: both miss them in the index and write
    // records; the later one finds them stored and gives its slots back, the records left on the
    // drive (nothing written afterwards reuses the slots).
    std::vector<keyed_page> pages;
    std::vector<std::byte const*> sources;
    for (document const& d : all) {
      for (keyed_page const& p : d.pages()) {
        pages.push_back(p);
      }
      for (std::byte const* b : d.sources()) {
        sources.push_back(b);
      }
    }
    std::barrier sync(2);
    auto writer = [&] {
      std::unique_ptr<bool[]> ok(new bool[pages.size()]());
      sync.arrive_and_wait();
      CHECK(s.set(pages, sources, {ok.get(), pages.size()}) == 2 * docs);
    };
    std::thread other(writer);
    writer();
    other.join();
    CHECK(s.size() == 2 * docs);
  }
  keyed_file_store s(options({dir.sub("a")}, 4 * docs));
  CHECK(s.size() == 2 * docs);
  for (document const& d : all) {
    CHECK(get_checked(s, d) == 2);
  }
  // Every slot is usable: a whole store's worth of new pages replaces the old ones, all held.
  for (int i = 0; i < 2 * docs; ++i) {
    more.emplace_back(small_geometry(), 2, 900 + std::uint32_t(i));
    CHECK(put(s, more.back()) == 2);
  }
  CHECK(s.size() == 4 * docs);
  for (document const& d : more) {
    CHECK(get_checked(s, d) == 2);
  }
}

TEST_CASE("keyed file store: a page listed twice with other ids is not served", "[cpu][keyed_file]")
{
  scratch_dir dir("twice");
  keyed_file_store s(options({dir.sub("a")}, 8));
  document const d(small_geometry(), 1, 61);
  REQUIRE(put(s, d) == 1);
  std::vector<std::int32_t> other(d.ids(0).begin(), d.ids(0).end());
  other.front() += 1;
  std::vector<keyed_page> const pages{{d.keys[0], d.ids(0)}, {d.keys[0], other}, {d.keys[0], d.ids(0)}};
  landing l(3, d.g.page_bytes());
  CHECK(s.get(pages, l.ptrs, l.intact()) == 2);
  CHECK(l.flags[0]);
  CHECK_FALSE(l.flags[1]);
  CHECK(l.flags[2]);
  CHECK(l.bufs[0] == d.bytes[0]);
  CHECK(l.bufs[2] == d.bytes[0]);
  CHECK(s.stats().pages_rejected == 1);
}

TEST_CASE("keyed file store: bad input changes nothing", "[cpu][keyed_file]")
{
  scratch_dir dir("bad");
  CHECK_THROWS_AS(keyed_file_store(options({dir.sub("d")}, 0)), strata::invalid_argument);
  auto both = options({dir.sub("d")}, 4);
  both.files.directory = dir.sub("e");
  CHECK_THROWS_AS(keyed_file_store(both), strata::invalid_argument);
  auto bad_ns = options({dir.sub("d")}, 4);
  bad_ns.space.model.clear();
  CHECK_THROWS_AS(keyed_file_store(bad_ns), strata::invalid_argument);

  keyed_file_store s(options({dir.sub("d")}, 4));
  document d(small_geometry(), 2, 8);
  auto pages = d.pages();
  auto src = d.sources();
  std::unique_ptr<bool[]> ok(new bool[2]());
  CHECK_THROWS_AS(s.set(pages, std::span(src).first(1), {ok.get(), 2}), strata::invalid_argument);
  src[1] = nullptr;
  CHECK_THROWS_AS(s.set(pages, src, {ok.get(), 2}), strata::invalid_argument);
  CHECK(s.size() == 0);
  CHECK(s.exists(d.keys) == 0);
}

TEST_CASE("keyed file store: threads writing, reading and replacing never see wrong bytes",
          "[cpu][keyed_file][threads]")
{
  scratch_dir dir("threads");
  keyed_file_store s(options({dir.sub("a"), dir.sub("b")}, 48));  // smaller than the documents: churn
  int const docs = 12, rounds = quick() ? 30 : 150;
  std::vector<document> all;
  for (int i = 0; i < docs; ++i) {
    all.emplace_back(small_geometry(), 6, 100 + std::uint32_t(i));
  }
  std::atomic<std::int64_t> read{0}, wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(std::uint32_t(t) * 7919u + 1);
      for (int r = 0; r < rounds; ++r) {
        document const& d = all[rng() % all.size()];
        if (rng() % 3 == 0) {
          (void)put(s, d);
        } else {
          std::int64_t const held = s.exists(d.keys);
          auto pages = d.pages(0, std::size_t(held));
          landing l(pages.size(), d.g.page_bytes());
          (void)s.get(pages, l.ptrs, l.intact());
          for (std::size_t i = 0; i < pages.size(); ++i) {
            if (l.flags[i]) {
              read.fetch_add(1);
              if (l.bufs[i] != d.bytes[i]) { wrong.fetch_add(1); }
            }
          }
        }
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  CHECK(wrong.load() == 0);
  CHECK(read.load() > 0);
  CHECK(s.size() <= 48);
  auto const st = s.stats();
  CHECK(st.pages_evicted > 0);
  CHECK(st.pages_read == read.load());
}
