// SPDX-License-Identifier: Apache-2.0
// What every backend that launches the copy kernel rejects before any byte moves: misaligned
// blocks, segments that are not whole 16-byte vectors, memory the device cannot dereference.
#include "gpu_support.cuh"

#include <strata/tier/pinned_host_pool.cuh>
#include <strata/transfer/dma_copy.cuh>
#include <strata/transfer/gpu_assisted.cuh>
#include <strata/transfer/split.cuh>
#include <strata/transfer/staged.cuh>

using namespace strata;

namespace {

/// A head-major layout over one buffer: per (layer, plane) a tensor `[page][head][token][head_bytes]`,
/// for geometries whose head rows are not multiples of 16 bytes (`hf_layout` refuses those).
struct head_major {
  static constexpr layout_order order = layout_order::layer_major;
  static constexpr char const* name = "head_major";
  std::byte* base;
  kv_geometry geometry_;
  std::int64_t pages;

  [[nodiscard]] STRATA_HOST_DEVICE kv_geometry const& geometry() const noexcept { return geometry_; }
  [[nodiscard]] STRATA_HOST_DEVICE std::int64_t num_pages() const noexcept { return pages; }
  [[nodiscard]] STRATA_HOST_DEVICE block_ref block(std::int64_t page, std::int64_t layer,
                                                   std::int64_t plane) const noexcept
  {
    auto const& g = geometry_;
    return {base + ((layer * g.planes + plane) * pages + page) * g.block_bytes(), g.head_bytes(),
            g.page_tokens * g.head_bytes()};
  }
};
static_assert(kv_layout<head_major>);

/// Requires that `go()` throws `invalid_argument` containing `needle`, and that afterwards (the
/// stream drained) `dev` still holds `before`: nothing was enqueued.
template <class Storage, class Go>
void rejected_untouched(Storage const& dev, std::vector<std::byte> const& before, cudaStream_t stream,
                        char const* needle, Go&& go)
{
  STRATA_REQUIRE_THROWS(invalid_argument, needle, go());
  STRATA_CUDA_TRY(cudaStreamSynchronize(stream));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
  CHECK(test::first_difference(test::download(dev), before) == -1);
}

}  // namespace

TEST_CASE("every kernel backend rejects a misaligned device layout before any byte moves", "[gpu][checks]")
{
  cuda_stream stream;
  kv_geometry const g = models::llama31_8b.geometry(16, 2, 8);
  std::int64_t const pages = 4;
  test::device_storage dev(static_cast<std::size_t>(pages * g.page_bytes() + 64));
  test::pinned_storage host(static_cast<std::size_t>(pages * g.page_bytes()));
  std::vector<std::byte> poison(dev.size()), records(host.size());
  test::fill_poison(poison);
  test::upload(dev, poison);
  std::mt19937_64 rng{3};
  test::fill_random(records, rng);
  test::upload(host, records);
  page_first const src{host.data(), g, pages};
  layer_first const misaligned{dev.data() + 8, g, pages};
  std::vector<page_pair> const map{{0, 1}, {1, 0}, {2, 3}, {3, 2}};
  copy_plan const load{src, misaligned, std::span<page_pair const>{map}, layer_range::all(g)};
  copy_plan const backup{misaligned, src, std::span<page_pair const>{map}, layer_range::all(g)};

  staged st;
  rejected_untouched(dev, poison, stream.get(),
                     "staged: layer 0 plane 0 is not 16-byte aligned in the layer_first layout",
                     [&] { (void)submit(st, load, stream.get()); });
  rejected_untouched(dev, poison, stream.get(), "not 16-byte aligned in the layer_first layout",
                     [&] { (void)submit(st, backup, stream.get()); });
  CHECK(test::first_difference(test::download(host), records) == -1);
  split sp;
  rejected_untouched(dev, poison, stream.get(), "split: layer 0 plane 0 is not 16-byte aligned",
                     [&] { (void)submit(sp, load, stream.get()); });
  gpu_assisted k;
  rejected_untouched(dev, poison, stream.get(), "gpu_assisted: layer 0 plane 0 is not 16-byte aligned",
                     [&] { (void)submit(k, load, stream.get()); });
  // The same backends still work afterwards on an aligned layout.
  layer_first const aligned{dev.data(), g, pages};
  copy_plan const good{src, aligned, std::span<page_pair const>{map}, layer_range::all(g)};
  submit(st, good, stream.get()).synchronize();
  auto const expected = test::expected_after(good, records, host.data(), poison, dev.data());
  CHECK(test::first_difference(test::download(dev), expected) == -1);
}

TEST_CASE("head rows that are not whole 16-byte vectors are rejected by kernel backends", "[gpu][checks]")
{
  // head_dim 4, 2-byte elements, 2 heads: 8-byte head rows, 16-byte token rows, 64-byte blocks.
  kv_geometry const g{3, 4, 2, 4, 2, 2};
  REQUIRE(g.head_bytes() == 8);
  REQUIRE(g.block_bytes() % 16 == 0);
  cuda_stream stream;
  std::int64_t const pages = 6;
  test::device_storage dev(static_cast<std::size_t>(pages * g.page_bytes()));
  test::pinned_storage host(static_cast<std::size_t>(pages * g.page_bytes()));
  std::vector<std::byte> poison(dev.size()), records(host.size());
  test::fill_poison(poison);
  test::upload(dev, poison);
  std::mt19937_64 rng{4};
  test::fill_random(records, rng);
  test::upload(host, records);
  page_first const src{host.data(), g, pages};
  head_major const dst{dev.data(), g, pages};
  std::vector<page_pair> const map{{0, 5}, {1, 4}, {2, 0}};
  copy_plan const load{src, dst, std::span<page_pair const>{map}, layer_range::all(g)};

  gpu_assisted k;
  staged st;
  split sp;
  rejected_untouched(dev, poison, stream.get(), "segments of 8 bytes", [&] { (void)submit(k, load, stream.get()); });
  rejected_untouched(dev, poison, stream.get(), "segments of 8 bytes", [&] { (void)submit(st, load, stream.get()); });
  rejected_untouched(dev, poison, stream.get(), "segments of 8 bytes", [&] { (void)submit(sp, load, stream.get()); });
  // Device to host (the transpose the other way) too.
  test::pinned_storage host_dst(host.size());
  page_first const records_dst{host_dst.data(), g, pages};
  copy_plan const backup{dst, records_dst, std::span<page_pair const>{map}, layer_range::all(g)};
  STRATA_REQUIRE_THROWS(invalid_argument, "segments of 8 bytes", (void)submit(k, backup, stream.get()));
  // A DMA backend moves it exactly (runs of any length).
  dma_copy dma;
  submit(dma, load, stream.get()).synchronize();
  CHECK(test::first_difference(test::download(dev),
                               test::expected_after(load, records, host.data(), poison, dev.data())) == -1);
}

TEST_CASE("pageable host memory is rejected by kernel backends; registered memory is accepted", "[gpu][checks]")
{
  cuda_stream stream;
  kv_geometry const g = models::llama31_8b.geometry(16, 2, 8);
  std::int64_t const pages = 4;
  std::vector<page_pair> const map{{0, 2}, {1, 3}, {3, 0}};
  test::device_storage dev(static_cast<std::size_t>(pages * g.page_bytes()));
  std::vector<std::byte> poison(dev.size());
  test::fill_poison(poison);
  test::upload(dev, poison);
  layer_first const device{dev.data(), g, pages};

  // 4 KiB-aligned pageable memory, so that it can be registered afterwards.
  std::size_t const bytes = static_cast<std::size_t>(pages * g.page_bytes());
  void* raw = std::aligned_alloc(4096, bytes);
  REQUIRE(raw != nullptr);
  auto* pageable = static_cast<std::byte*>(raw);
  std::vector<std::byte> records(bytes);
  std::mt19937_64 rng{8};
  test::fill_random(records, rng);
  std::copy(records.begin(), records.end(), pageable);
  page_first const src{pageable, g, pages};
  copy_plan const load{src, device, std::span<page_pair const>{map}, layer_range::all(g)};
  copy_plan const backup{device, src, std::span<page_pair const>{map}, layer_range::all(g)};

  gpu_assisted k;
  split sp;
  rejected_untouched(dev, poison, stream.get(), "pageable host memory", [&] { (void)submit(k, load, stream.get()); });
  rejected_untouched(dev, poison, stream.get(), "pageable host memory", [&] { (void)submit(sp, load, stream.get()); });
  STRATA_REQUIRE_THROWS(invalid_argument, "pageable host memory", (void)submit(k, backup, stream.get()));
  CHECK(std::equal(records.begin(), records.end(), pageable));
  // staged reads records with the copy engine (pageable is fine there) but its relay writes the
  // device-side layout: a pageable one is rejected.
  test::pinned_storage pinned_records(bytes);
  test::upload(pinned_records, records);
  page_first const pinned_src{pinned_records.data(), g, pages};
  layer_first const pageable_device{pageable, g, pages};
  staged st;
  STRATA_REQUIRE_THROWS(
      invalid_argument, "pageable host memory",
      (void)submit(st, copy_plan{pinned_src, pageable_device, std::span<page_pair const>{map}, layer_range::all(g)},
                   stream.get()));
  CHECK(std::equal(records.begin(), records.end(), pageable));

  // Registered and mapped, the same memory is accepted (the same backend: no stale verdict).
  STRATA_CUDA_TRY(cudaHostRegister(pageable, bytes, cudaHostRegisterMapped));
  submit(k, load, stream.get()).synchronize();
  CHECK(test::first_difference(test::download(dev),
                               test::expected_after(load, records, pageable, poison, dev.data())) == -1);
  STRATA_CUDA_TRY(cudaHostUnregister(pageable));
  std::free(raw);
}

TEST_CASE("device accessibility is queried once per allocation, not per block", "[gpu][checks]")
{
  test::pinned_storage pinned(std::size_t{8} << 20);
  test::device_storage dev(std::size_t{8} << 20);
  pinned_host_pool pool{models::llama31_8b.geometry(16, 2, 8), 8, {.chunk_bytes = std::int64_t{1} << 20}};
  detail::access_cache cache;
  for (std::size_t at = 0; at < pinned.size(); at += 4096) {
    cache.check(pinned.data() + at, "test", "pinned", 0, 0);
    cache.check(dev.data() + at, "test", "device", 0, 0);
  }
  INFO("the driver reports allocation ranges: a hot path does one lookup per block, not one query");
  CHECK(cache.queries() == 2);
  auto const layout = pool.layout();
  for (std::int64_t p = 0; p < pool.num_pages(); ++p) {
    cache.check(layout.page_data(p), "test", "pool", 0, 0);
  }
  CHECK(cache.queries() == 2 + pool.num_chunks());
  std::vector<std::byte> pageable(4096);
  STRATA_REQUIRE_THROWS(invalid_argument, "pageable host memory", cache.check(pageable.data(), "test", "vector", 0, 0));
}
