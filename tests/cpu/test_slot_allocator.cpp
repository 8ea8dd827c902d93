// SPDX-License-Identifier: Apache-2.0
#include "../support/catch.hpp"

#include <strata/tier/slot_allocator.hpp>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

using strata::slot_allocator;

TEST_CASE("a fresh slot allocator hands out ascending slots", "[cpu][tier]")
{
  slot_allocator a{10};
  CHECK(a.capacity() == 10);
  CHECK(a.allocate(4) == std::vector<std::int64_t>{0, 1, 2, 3});
  CHECK(a.allocate(2) == std::vector<std::int64_t>{4, 5});
  CHECK(a.used() == 6);
  CHECK(a.available() == 4);
  CHECK(a.is_allocated(5));
  CHECK_FALSE(a.is_allocated(6));
  CHECK_FALSE(a.is_allocated(-1));
  CHECK_FALSE(a.is_allocated(10));
}

TEST_CASE("allocation failure names the sizes and leaves the allocator usable", "[cpu][tier]")
{
  slot_allocator a{8};
  auto const first = a.allocate(6);
  STRATA_REQUIRE_THROWS(strata::out_of_memory, "asked for 3 slots, 2 of 8 available", (void)a.allocate(3));
  CHECK(a.available() == 2);
  CHECK(a.allocate(2).size() == 2);
  a.release(first);
  CHECK(a.available() == 6);
}

TEST_CASE("bad releases are rejected and change nothing", "[cpu][tier]")
{
  slot_allocator a{8};
  auto const s = a.allocate(4);  // 0..3
  std::vector<std::int64_t> const out_of_range{1, 8};
  std::vector<std::int64_t> const not_allocated{2, 6};
  std::vector<std::int64_t> const twice{3, 1, 3};
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "slot 8 out of range [0, 8)", a.release(out_of_range));
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "slot 6 is not allocated", a.release(not_allocated));
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "slot 3 is not allocated", a.release(twice));
  CHECK(a.used() == 4);
  for (auto x : s) {
    CHECK(a.is_allocated(x));
  }
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "slots asked must be positive", (void)a.allocate(0));
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "capacity must be positive", slot_allocator{0});
}

TEST_CASE("slot allocator matches a set model under random operations", "[cpu][tier]")
{
  std::mt19937_64 rng{99};
  slot_allocator a{64};
  std::set<std::int64_t> held;
  for (int step = 0; step < 20000; ++step) {
    if (rng() % 2 == 0) {
      auto const n = static_cast<std::int64_t>(rng() % 9) + 1;
      if (n > a.available()) {
        CHECK_THROWS_AS((void)a.allocate(n), strata::out_of_memory);
      } else {
        for (auto s : a.allocate(n)) {
          REQUIRE(held.insert(s).second);
        }
      }
    } else if (!held.empty()) {
      std::vector<std::int64_t> v(held.begin(), held.end());
      std::shuffle(v.begin(), v.end(), rng);
      v.resize(std::min<std::size_t>(v.size(), rng() % 5 + 1));
      a.release(v);
      for (auto s : v) {
        held.erase(s);
      }
    }
    REQUIRE(a.used() == static_cast<std::int64_t>(held.size()));
  }
  for (std::int64_t s = 0; s < 64; ++s) {
    CHECK(a.is_allocated(s) == (held.count(s) == 1));
  }
}

TEST_CASE("claim takes these very slots; allocation skips them; bad claims change nothing", "[cpu][tier]")
{
  strata::slot_allocator a{8};
  a.claim(std::vector<std::int64_t>{0, 5, 2});
  CHECK(a.available() == 5);
  CHECK(a.is_allocated(5));
  CHECK_THROWS_AS(a.claim(std::vector<std::int64_t>{1, 5}), strata::invalid_argument);  // 5 is taken
  CHECK_THROWS_AS(a.claim(std::vector<std::int64_t>{3, 3}), strata::invalid_argument);
  CHECK_THROWS_AS(a.claim(std::vector<std::int64_t>{8}), strata::invalid_argument);
  CHECK_FALSE(a.is_allocated(1));
  CHECK_FALSE(a.is_allocated(3));
  CHECK(a.available() == 5);
  CHECK(a.allocate(5) == std::vector<std::int64_t>{1, 3, 4, 6, 7});  // ascending, the claimed skipped
  CHECK(a.available() == 0);
  a.release(std::vector<std::int64_t>{5, 1});
  a.claim(std::vector<std::int64_t>{5});
  CHECK(a.allocate(1) == std::vector<std::int64_t>{1});
  CHECK(a.available() == 0);
  a.release(std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(a.available() == 8);
  auto all = a.allocate(8);
  std::sort(all.begin(), all.end());
  CHECK(all == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7});
}
