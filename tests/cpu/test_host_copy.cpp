// SPDX-License-Identifier: Apache-2.0
#include "../support/catch.hpp"
#include "../support/pools.hpp"

#include <strata/strata.hpp>

#include <algorithm>
#include <numeric>
#include <optional>
#include <random>
#include <tuple>
#include <vector>

using namespace strata;
using strata::test::layout_kind;

namespace {

/// The runs of a plan as (source, destination, length) columns, in `for_each_run`'s order or, with
/// `page_major`, in that order of `for_each_run_in`.
template <class Plan>
auto runs_of(Plan const& plan, std::optional<bool> page_major = std::nullopt)
{
  std::vector<std::uint64_t> src, dst;
  std::vector<std::size_t> bytes;
  auto const sink = [&](copy_run const& r) {
    src.push_back(reinterpret_cast<std::uint64_t>(r.src));
    dst.push_back(reinterpret_cast<std::uint64_t>(r.dst));
    bytes.push_back(std::size_t(r.bytes));
  };
  if (page_major) {
    detail::for_each_run_in(plan, *page_major, sink);
  } else {
    for_each_run(plan, sink);
  }
  return std::tuple{src, dst, bytes};
}

/// At least 40 page pairs in stretches of consecutive pairs (each side +1) of 1-9 pages at random
/// places of an `n`-page pool, wrapping around it; no destination twice.
std::vector<page_pair> random_stretches(std::mt19937_64& rng, std::int64_t n)
{
  std::vector<page_pair> pairs;
  std::vector<bool> used(static_cast<std::size_t>(n));
  while (pairs.size() < 40) {
    std::int64_t const len = 1 + std::int64_t(rng() % 9), s0 = std::int64_t(rng() % n), d0 = std::int64_t(rng() % n);
    for (std::int64_t i = 0; i < len; ++i) {
      std::int64_t const d = (d0 + i) % n;
      if (!used[std::size_t(d)]) {
        used[std::size_t(d)] = true;
        pairs.push_back({(s0 + i) % n, d});
      }
    }
  }
  return pairs;
}

layer_range random_layers(kv_geometry const& g, std::mt19937_64& rng)
{
  std::int64_t const a = std::uniform_int_distribution<std::int64_t>{0, g.layers - 1}(rng);
  std::int64_t const b = std::uniform_int_distribution<std::int64_t>{a + 1, g.layers}(rng);
  return {a, b};
}

/// Runs `copy` on the plan's destination and checks the result against the row-by-row reference
/// applied to the same starting bytes: right rows written, every other byte unchanged.
template <class S, class D, class Storage>
void check_against_reference(copy_plan<S, D> const& plan, Storage& dst_storage)
{
  auto const before = dst_storage;
  host_copy{}.copy(plan);
  auto const actual = dst_storage;
  std::copy(before.begin(), before.end(), dst_storage.begin());
  test::reference_copy(plan);
  CHECK(test::first_difference(actual, dst_storage) == -1);
}

/// Every destination byte the plan covers is written by exactly one run; no other byte is.
template <class S, class D>
void check_runs_write_once(copy_plan<S, D> const& plan, std::vector<std::byte> const& dst_storage)
{
  kv_geometry const g = plan.src.geometry();
  std::vector<int> expected(dst_storage.size()), actual(dst_storage.size());
  bool inside = true;
  test::for_each_row(plan, [&](std::byte const*, std::byte* d) {
    auto const off = d - dst_storage.data();
    for (std::int64_t i = 0; i < g.head_bytes(); ++i) {
      ++expected[static_cast<std::size_t>(off + i)];
    }
  });
  std::int64_t total = 0;
  for_each_run(plan, [&](copy_run const& r) {
    std::int64_t const off = r.dst - dst_storage.data();
    total += r.bytes;
    if (off < 0 || off + r.bytes > static_cast<std::int64_t>(actual.size())) {
      inside = false;
      return;
    }
    for (std::int64_t i = 0; i < r.bytes; ++i) {
      ++actual[static_cast<std::size_t>(off + i)];
    }
  });
  REQUIRE(inside);
  CHECK(total == plan.bytes());
  CHECK(test::first_difference(actual, expected) == -1);
  CHECK(std::all_of(expected.begin(), expected.end(), [](int c) { return c <= 1; }));
}

/// Copies, by storage offset, the rows of `pages` (source side of each pair) over `layers` from
/// `from` into `to`, both images of the storage `layout` addresses.
template <class L>
void copy_rows(L const& layout, std::byte const* base, std::span<page_pair const> pages, layer_range layers,
               std::vector<std::byte> const& from, std::vector<std::byte>& to)
{
  kv_geometry const g = layout.geometry();
  for (auto const p : pages) {
    for (std::int64_t l = layers.begin; l < layers.end; ++l) {
      for (std::int64_t k = 0; k < g.planes; ++k) {
        block_ref const b = layout.block(p.src, l, k);
        for (std::int64_t t = 0; t < g.page_tokens; ++t) {
          for (std::int64_t h = 0; h < g.kv_heads; ++h) {
            auto const off = b.data + t * b.token_stride + h * b.head_stride - base;
            std::copy_n(from.begin() + off, g.head_bytes(), to.begin() + off);
          }
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("host_copy round trips A -> B -> A for every pair of layouts", "[cpu][host_copy]")
{
  std::mt19937_64 rng{7};
  int checked = 0;
  for (int trial = 0; trial < 40; ++trial) {
    kv_geometry const g = test::random_geometry(rng);
    std::int64_t const a_pages = std::uniform_int_distribution<std::int64_t>{1, 8}(rng);
    std::int64_t const b_pages = std::uniform_int_distribution<std::int64_t>{1, 8}(rng);
    for (layout_kind const ka : test::all_layout_kinds) {
      for (layout_kind const kb : test::all_layout_kinds) {
        if (!test::supports(ka, g) || !test::supports(kb, g)) { continue; }
        test::with_pool(ka, g, a_pages, rng, [&](auto& a) {
          test::with_pool(kb, g, b_pages, rng, [&](auto& b) {
            INFO(test::to_string(ka) << " -> " << test::to_string(kb) << ", geometry " << g << ", trial " << trial);
            std::int64_t const n_max = std::min(a.layout.num_pages(), b.layout.num_pages());
            std::int64_t const n = std::uniform_int_distribution<std::int64_t>{1, n_max}(rng);
            auto const there = test::random_map(n, a.layout.num_pages(), b.layout.num_pages(), rng);
            std::vector<page_pair> back;
            for (auto const p : there) {
              back.push_back({p.dst, p.src});
            }
            layer_range const layers = random_layers(g, rng);

            test::fill_random(a.storage, rng);
            auto const original = a.storage;
            test::fill_poison(b.storage);
            copy_plan const forward{a.layout, b.layout, std::span<page_pair const>{there}, layers};
            check_runs_write_once(forward, b.storage);
            check_against_reference(forward, b.storage);
            host_copy{}.copy(forward);

            test::fill_poison(a.storage);
            host_copy{}.copy(copy_plan{b.layout, a.layout, std::span<page_pair const>{back}, layers});
            std::vector<std::byte> expected(a.storage.size());
            test::fill_poison(expected);
            copy_rows(a.layout, a.storage.data(), there, layers, original, expected);
            CHECK(test::first_difference(a.storage, expected) == -1);
            ++checked;
          });
        });
      }
    }
  }
  CHECK(checked > 500);
}

TEST_CASE("host_copy handles adversarial page maps", "[cpu][host_copy]")
{
  std::mt19937_64 rng{11};
  kv_geometry const g{3, 4, 2, 16, 2, 2};
  std::int64_t const pages = 7;
  for (layout_kind const ka : test::all_layout_kinds) {
    for (layout_kind const kb : test::all_layout_kinds) {
      if (!test::supports(ka, g) || !test::supports(kb, g)) { continue; }
      test::with_pool(ka, g, pages, rng, [&](auto& a) {
        test::with_pool(kb, g, pages, rng, [&](auto& b) {
          INFO(test::to_string(ka) << " -> " << test::to_string(kb));
          std::int64_t const na = a.layout.num_pages(), nb = b.layout.num_pages();
          std::int64_t const n = std::min(na, nb);
          std::vector<page_pair> reversed, duplicated, last;
          for (std::int64_t i = 0; i < n; ++i) {
            reversed.push_back({i, nb - 1 - i});
          }
          for (std::int64_t i = 0; i < n; ++i) {
            duplicated.push_back({na - 1, i});
          }  // one source, many copies
          last.push_back({na - 1, nb - 1});
          test::fill_random(a.storage, rng);
          for (auto const* map : {&reversed, &duplicated, &last}) {
            test::fill_poison(b.storage);
            copy_plan const plan{a.layout, b.layout, std::span<page_pair const>{*map}, layer_range::all(g)};
            check_runs_write_once(plan, b.storage);
            check_against_reference(plan, b.storage);
          }
        });
      });
    }
  }
}

TEST_CASE("host_copy moves real models' pages between engine layouts", "[cpu][host_copy]")
{
  std::mt19937_64 rng{3};
  kv_geometry const geometries[] = {models::llama31_8b.geometry(16), models::llama31_8b.geometry(32, 2, 8),
                                    models::deepseek_v3.geometry(16)};
  for (kv_geometry const& g : geometries) {
    for (layout_kind const ka : test::all_layout_kinds) {
      for (layout_kind const kb : test::all_layout_kinds) {
        if (!test::supports(ka, g) || !test::supports(kb, g)) { continue; }
        test::with_pool(ka, g, 3, rng, [&](auto& a) {
          test::with_pool(kb, g, 3, rng, [&](auto& b) {
            INFO(test::to_string(ka) << " -> " << test::to_string(kb) << ", geometry " << g);
            test::fill_random(a.storage, rng);
            test::fill_poison(b.storage);
            auto const map = test::random_map(2, a.layout.num_pages(), b.layout.num_pages(), rng);
            check_against_reference(copy_plan{a.layout, b.layout, std::span<page_pair const>{map}, layer_range::all(g)},
                                    b.storage);
          });
        });
      }
    }
  }
}

TEST_CASE("for_each_run merges adjacent blocks into maximal runs", "[cpu][host_copy]")
{
  kv_geometry const g{4, 8, 2, 16, 2, 2};
  std::int64_t const n = 6;
  std::vector<std::byte> m1(n * g.page_bytes()), m2(n * g.page_bytes());
  page_first const pf1{m1.data(), g, n}, pf2{m2.data(), g, n};
  layer_first const lf1{m1.data(), g, n}, lf2{m2.data(), g, n};
  std::vector<page_pair> const consecutive{{1, 2}, {2, 3}, {3, 4}};
  std::vector<page_pair> const scattered{{4, 0}, {0, 5}, {2, 2}};
  auto count = [](auto const& plan) {
    int runs = 0;
    for_each_run(plan, [&](copy_run const&) { ++runs; });
    return runs;
  };
  auto const all = layer_range::all(g);
  CHECK(count(copy_plan{pf1, pf2, std::span<page_pair const>{consecutive}, all}) == 1);  // 3 whole records
  CHECK(count(copy_plan{pf1, pf2, std::span<page_pair const>{scattered}, all}) == 3);    // one record each
  CHECK(count(copy_plan{lf1, lf2, std::span<page_pair const>{consecutive}, all}) == 8);  // one per (layer, plane)
  CHECK(count(copy_plan{lf1, lf2, std::span<page_pair const>{consecutive}, layer_range{1, 3}}) == 4);
  CHECK(count(copy_plan{pf1, lf2, std::span<page_pair const>{scattered}, all}) == 3 * 8);  // a block each
}

TEST_CASE("strided runs cover every run once, in order, and gather strided ones", "[cpu][host_copy]")
{
  kv_geometry const g{4, 8, 2, 16, 2, 2};
  std::int64_t const n = 64;
  std::vector<std::byte> m1(n * g.page_bytes()), m2(n * g.page_bytes());
  page_first const pf{m1.data(), g, n};
  layer_first const lf{m2.data(), g, n};
  auto const all = layer_range::all(g);
  SECTION("page-first records into layer-first tensors (a load)")
  {
    std::mt19937_64 rng{7};
    for (int trial = 0; trial < 200; ++trial) {
      auto const pairs = random_stretches(rng, n);
      auto const [src, dst, bytes] = runs_of(copy_plan{pf, lf, std::span<page_pair const>{pairs}, all});
      auto const groups = detail::strided_runs<std::uint64_t>(src, dst, bytes);
      std::size_t i = 0;
      for (auto const& grp : groups) {  // expanded in order, the groups are the runs
        REQUIRE(grp.count >= 1);
        if (grp.count > 1) { CHECK((grp.src_step >= grp.bytes && grp.dst_step >= grp.bytes)); }
        for (std::size_t k = 0; k < grp.count; ++k, ++i) {
          REQUIRE(i < src.size());
          CHECK(src[i] == grp.src + k * grp.src_step);
          CHECK(dst[i] == grp.dst + k * grp.dst_step);
          CHECK(bytes[i] == grp.bytes);
        }
      }
      CHECK(i == src.size());
    }
    // Consecutive pages on both sides: one strided copy per (layer, plane).
    std::vector<page_pair> consecutive;
    for (std::int64_t p = 0; p < 40; ++p) {
      consecutive.push_back({p + 3, p + 10});
    }
    auto const [src, dst, bytes] = runs_of(copy_plan{pf, lf, std::span<page_pair const>{consecutive}, all});
    CHECK(src.size() == std::size_t(40 * g.layers * g.planes));
    auto const groups = detail::strided_runs<std::uint64_t>(src, dst, bytes);
    REQUIRE(groups.size() == std::size_t(g.layers * g.planes));
    CHECK(groups[0].count == 40);
    CHECK(groups[0].src_step == std::size_t(g.page_bytes()));
    CHECK(groups[0].dst_step == std::size_t(g.block_bytes()));
  }
  SECTION(
      "layer-first tensors into page-first records (a backup): layer by layer, the same runs, a copy per (layer, "
      "plane)")
  {
    using run = std::tuple<std::uint64_t, std::uint64_t, std::size_t>;
    auto const sorted_runs = [](auto const& columns) {
      auto const& [s, d, b] = columns;
      std::vector<run> out;
      for (std::size_t i = 0; i < s.size(); ++i) {
        out.emplace_back(s[i], d[i], b[i]);
      }
      std::sort(out.begin(), out.end());
      return out;
    };
    // Consecutive device pages backed up to consecutive records: page by page, a group per page at
    // best; layer by layer, one strided copy per (layer, plane).
    std::vector<page_pair> consecutive;
    for (std::int64_t p = 0; p < 40; ++p) {
      consecutive.push_back({p + 5, p + 17});
    }
    copy_plan const backup{lf, pf, std::span<page_pair const>{consecutive}, all};
    auto const by_page = runs_of(backup);
    auto const [src, dst, bytes] = runs_of(backup, false);
    REQUIRE(src.size() == std::size_t(40 * g.layers * g.planes));
    CHECK(sorted_runs(by_page) == sorted_runs(std::tuple{src, dst, bytes}));  // the same runs
    CHECK(
        detail::strided_runs<std::uint64_t>(std::get<0>(by_page), std::get<1>(by_page), std::get<2>(by_page)).size() >=
        40);
    auto const groups = detail::strided_runs<std::uint64_t>(src, dst, bytes);
    REQUIRE(groups.size() == std::size_t(g.layers * g.planes));
    CHECK(groups[0].count == 40);
    CHECK(groups[0].src_step == std::size_t(g.block_bytes()));
    CHECK(groups[0].dst_step == std::size_t(g.page_bytes()));
    // Random stretches: layer by layer, the same runs as page by page, and stretches of 4.4 pages on
    // average at least halve the copies.
    std::mt19937_64 rng{11};
    for (int trial = 0; trial < 200; ++trial) {
      auto const pairs = random_stretches(rng, n);
      copy_plan const plan{lf, pf, std::span<page_pair const>{pairs}, all};
      auto const layered = runs_of(plan, false);
      CHECK(sorted_runs(layered) == sorted_runs(runs_of(plan)));
      auto const& [s, d, b] = layered;
      CHECK(2 * detail::strided_runs<std::uint64_t>(s, d, b).size() <= s.size());
    }
  }
  SECTION("a table of separate tensors: no strided copy spans two (layer, plane) blocks")
  {
    // Tensors in ascending order with gaps, as an engine's allocations may lie: the last run of
    // one block and the first of the next can continue "a stride" of two rows across a gap.
    std::int64_t const tensor = n * g.block_bytes(), gap = 4096;
    std::vector<std::byte> m3(std::size_t(g.layers * g.planes * (tensor + gap)));
    std::vector<std::byte*> table;
    for (std::int64_t t = 0; t < g.layers * g.planes; ++t) {
      table.push_back(m3.data() + t * (tensor + gap));
    }
    layer_first_table const tab{table, g, n};
    auto const tensor_of = [&](std::uint64_t a) {
      return (a - reinterpret_cast<std::uint64_t>(m3.data())) / std::uint64_t(tensor + gap);
    };
    auto const spans_tensors = [&](auto const& grp, bool dst_side) {
      std::uint64_t const first = dst_side ? grp.dst : grp.src;
      std::size_t const step = dst_side ? grp.dst_step : grp.src_step;
      return tensor_of(first) != tensor_of(first + (grp.count - 1) * step);
    };
    std::mt19937_64 rng{13};
    int spanning_without_starts = 0;
    for (int trial = 0; trial < 100; ++trial) {
      auto const scattered = test::scattered_pairs(n, 9, rng);
      for (bool const load : {true, false}) {
        std::vector<std::uint64_t> src, dst;
        std::vector<std::size_t> bytes, starts;
        auto const sink = [&](copy_run const& r) {
          src.push_back(reinterpret_cast<std::uint64_t>(r.src));
          dst.push_back(reinterpret_cast<std::uint64_t>(r.dst));
          bytes.push_back(std::size_t(r.bytes));
        };
        auto const mark = [&] { starts.push_back(src.size()); };
        if (load) {
          detail::for_each_run_in(copy_plan{pf, tab, std::span<page_pair const>{scattered}, all}, false, sink, mark);
        } else {
          std::vector<page_pair> back;
          for (auto const p : scattered) {
            back.push_back({p.dst, p.src});
          }
          detail::for_each_run_in(copy_plan{tab, pf, std::span<page_pair const>{back}, all}, false, sink, mark);
        }
        REQUIRE(starts.size() == std::size_t(g.layers * g.planes));
        REQUIRE(src.size() == std::size_t(9 * g.layers * g.planes));  // a block each: no run spans two
        std::size_t covered = 0;
        for (auto const& grp : detail::strided_runs<std::uint64_t>(src, dst, bytes, starts)) {
          CHECK_FALSE(spans_tensors(grp, load));
          covered += grp.count;
        }
        CHECK(covered == src.size());
        for (auto const& grp : detail::strided_runs<std::uint64_t>(src, dst, bytes)) {
          spanning_without_starts += spans_tensors(grp, load) ? 1 : 0;
        }
      }
    }
    CHECK(spanning_without_starts > 0);  // what the block starts prevent does happen without them
  }
}

TEST_CASE("bad plans are rejected before any byte moves", "[cpu][host_copy]")
{
  std::mt19937_64 rng{5};
  kv_geometry const g{2, 4, 2, 16, 2, 2};
  std::int64_t const n = 4;
  std::vector<std::byte> src_mem(n * g.page_bytes()), dst_mem(n * g.page_bytes());
  test::fill_random(src_mem, rng);
  test::fill_poison(dst_mem);
  auto const untouched = dst_mem;
  page_first const src{src_mem.data(), g, n};
  layer_first const dst{dst_mem.data(), g, n};
  auto const all = layer_range::all(g);
  auto attempt = [&](std::vector<page_pair> const& pages, layer_range layers) {
    host_copy{}.copy(copy_plan{src, dst, std::span<page_pair const>{pages}, layers});
  };
  // A valid plan goes through (so the rejections below are about the one thing each changes).
  std::vector<page_pair> const good{{0, 3}, {2, 1}};

  SECTION("source page out of range")
  {
    STRATA_REQUIRE_THROWS(invalid_argument, "pair 1: source page 4 out of range [0, 4)",
                          attempt({{0, 0}, {4, 1}}, all));
    STRATA_REQUIRE_THROWS(invalid_argument, "source page -1 out of range", attempt({{-1, 0}}, all));
  }
  SECTION("destination page out of range")
  {
    STRATA_REQUIRE_THROWS(invalid_argument, "pair 0: destination page 9 out of range [0, 4)", attempt({{0, 9}}, all));
    STRATA_REQUIRE_THROWS(invalid_argument, "destination page -2 out of range", attempt({{0, -2}}, all));
  }
  SECTION("duplicate destinations")
  {
    STRATA_REQUIRE_THROWS(invalid_argument, "destination page 1 appears more than once",
                          attempt({{0, 1}, {2, 3}, {3, 1}}, all));
  }
  SECTION("duplicate destinations in a pool much larger than the plan")
  {
    std::int64_t const big = 100000;
    std::vector<std::byte> big_mem(static_cast<std::size_t>(big * g.block_bytes()));
    std::byte* table[] = {big_mem.data(), big_mem.data(), big_mem.data(), big_mem.data()};
    layer_first_table const huge{table, g, big};
    std::vector<page_pair> const pages{{0, 99999}, {1, 5}, {2, 99999}};
    STRATA_REQUIRE_THROWS(invalid_argument, "destination page 99999 appears more than once",
                          host_copy{}.copy(copy_plan{src, huge, std::span<page_pair const>{pages}, all}));
  }
  SECTION("empty and oversized plans")
  {
    STRATA_REQUIRE_THROWS(invalid_argument, "no pages to copy", attempt({}, all));
    STRATA_REQUIRE_THROWS(invalid_argument, "5 pairs exceed the 4 pages of the destination",
                          attempt({{0, 0}, {1, 1}, {2, 2}, {3, 3}, {0, 0}}, all));
  }
  SECTION("null page list")
  {
    STRATA_REQUIRE_THROWS(invalid_argument, "page list is a null pointer",
                          host_copy{}.copy(copy_plan{
                              src, dst, std::span<page_pair const>{static_cast<page_pair const*>(nullptr), 2}, all}));
  }
  SECTION("empty or out-of-range layer ranges")
  {
    STRATA_REQUIRE_THROWS(invalid_argument, "layer range [1, 1) is empty or outside [0, 2)", attempt(good, {1, 1}));
    STRATA_REQUIRE_THROWS(invalid_argument, "layer range [0, 3) is empty", attempt(good, {0, 3}));
    STRATA_REQUIRE_THROWS(invalid_argument, "layer range [-1, 1) is empty", attempt(good, {-1, 1}));
  }
  SECTION("mismatched geometries")
  {
    kv_geometry const other{2, 4, 1, 16, 2, 2};
    layer_first const narrow{dst_mem.data(), other, n};
    STRATA_REQUIRE_THROWS(invalid_argument, "differs from destination geometry",
                          host_copy{}.copy(copy_plan{src, narrow, std::span<page_pair const>{good}, all}));
  }
  CHECK(test::first_difference(dst_mem, untouched) == -1);

  attempt(good, all);
  CHECK(test::first_difference(dst_mem, untouched) != -1);
}
