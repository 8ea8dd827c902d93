// SPDX-License-Identifier: Apache-2.0
#include "gpu_support.cuh"

#include <strata/tier/pinned_host_pool.cuh>
#include <strata/transfer/gpu_assisted.cuh>
#include <strata/transfer/staged.cuh>

#include <set>

using namespace strata;

namespace {

/// Loads random records from the pool into a layer-first device pool and back, through `b`.
template <class Backend>
void pool_round_trip(pinned_host_pool& pool, Backend& b, std::uint64_t seed)
{
  cuda_stream stream;
  kv_geometry const g = pool.geometry();
  page_first_chunked const host = pool.layout();
  std::mt19937_64 rng{seed};
  auto const slots = pool.slots().allocate(std::min<std::int64_t>(6, pool.num_pages()));
  // Write random records through the CPU (the pool is ordinary host memory too).
  std::vector<std::vector<std::byte>> records;
  for (auto s : slots) {
    std::vector<std::byte> r(static_cast<std::size_t>(g.page_bytes()));
    test::fill_random(r, rng);
    std::copy(r.begin(), r.end(), host.page_data(s));
    records.push_back(std::move(r));
  }
  std::int64_t const n = static_cast<std::int64_t>(slots.size());
  test::device_storage dev(n * g.page_bytes());
  layer_first const device{dev.data(), g, n};
  std::vector<page_pair> load, back;
  for (std::int64_t i = 0; i < n; ++i) {
    load.push_back({slots[i], n - 1 - i});
    back.push_back({n - 1 - i, slots[i]});
  }
  submit(b, copy_plan{host, device, std::span<page_pair const>{load}, layer_range::all(g)}, stream.get()).synchronize();
  for (auto s : slots) {
    std::fill_n(host.page_data(s), g.page_bytes(), test::poison);
  }
  submit(b, copy_plan{device, host, std::span<page_pair const>{back}, layer_range::all(g)}, stream.get()).synchronize();
  for (std::int64_t i = 0; i < n; ++i) {
    INFO("slot " << slots[i]);
    CHECK(std::equal(records[i].begin(), records[i].end(), host.page_data(slots[i])));
  }
  pool.slots().release(slots);
}

}  // namespace

TEST_CASE("pinned host pools allocate chunks of whole records that never touch", "[gpu][tier]")
{
  kv_geometry const g = models::llama31_8b.geometry(16, 2, 8);  // 256 KiB records
  for (auto alloc : {pinned_allocation::host_alloc, pinned_allocation::registered}) {
    pinned_host_pool pool{g, 10, {.allocation = alloc, .chunk_bytes = 3 * g.page_bytes() + 100}};
    CHECK(pool.pages_per_chunk() == 3);
    CHECK(pool.num_chunks() == 4);
    CHECK(pool.bytes() == 10 * g.page_bytes());
    auto const l = pool.layout();
    CHECK(l.num_pages() == 10);
    for (std::int64_t c = 0; c + 1 < pool.num_chunks(); ++c) {
      // the last record of a chunk is never followed by the first record of another chunk
      std::byte* const end_of_chunk = l.page_data(c * 3 + 2) + g.page_bytes();
      for (std::int64_t p = 0; p < 10; ++p) {
        CHECK(l.page_data(p) != end_of_chunk);
      }
    }
    std::set<std::byte*> distinct;
    for (std::int64_t p = 0; p < 10; ++p) {
      distinct.insert(l.page_data(p));
    }
    CHECK(distinct.size() == 10);
  }
}

TEST_CASE("pinned host pools move pages with the GPU backends", "[gpu][tier]")
{
  kv_geometry const g = models::llama31_8b.geometry(32);
  gpu_assisted kernel;
  staged staging{{.chunk_bytes = 1}};
  pinned_host_pool allocated{g, 8, {.chunk_bytes = 3 * g.page_bytes()}};
  pool_round_trip(allocated, kernel, 1);
  pool_round_trip(allocated, staging, 2);
  pinned_host_pool registered{g,
                              8,
                              {.allocation = pinned_allocation::registered,
                               .chunk_bytes = 5 * g.page_bytes(),
                               .huge = huge_pages::transparent}};
  pool_round_trip(registered, kernel, 3);
  pool_round_trip(registered, staging, 4);
}

TEST_CASE("pinned host pool slots fail cleanly and stay usable", "[gpu][tier]")
{
  kv_geometry const g = models::llama31_8b.geometry(16, 2, 8);
  pinned_host_pool pool{g, 4};
  auto const a = pool.slots().allocate(3);
  STRATA_REQUIRE_THROWS(out_of_memory, "asked for 2 slots, 1 of 4 available", (void)pool.slots().allocate(2));
  CHECK(pool.slots().allocate(1).size() == 1);
  pool.slots().release(a);
  CHECK(pool.slots().available() == 3);
}

TEST_CASE("pinned host pools reject bad options", "[gpu][tier]")
{
  kv_geometry const g = models::llama31_8b.geometry(16, 2, 8);
  STRATA_REQUIRE_THROWS(invalid_argument, "num_pages must be positive", pinned_host_pool(g, 0));
  STRATA_REQUIRE_THROWS(invalid_argument, "chunk_bytes must be positive", pinned_host_pool(g, 4, {.chunk_bytes = 0}));
  STRATA_REQUIRE_THROWS(invalid_argument, "huge pages need pinned_allocation::registered",
                        pinned_host_pool(g, 4, {.huge = huge_pages::transparent}));
  STRATA_REQUIRE_THROWS(invalid_argument, "more than the 512 a layout holds",
                        pinned_host_pool(g, 1000, {.chunk_bytes = g.page_bytes()}));
  STRATA_REQUIRE_THROWS(invalid_argument, "layers must be positive", pinned_host_pool(kv_geometry{}, 4));
}
