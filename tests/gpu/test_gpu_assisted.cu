// SPDX-License-Identifier: Apache-2.0
#include "gpu_support.cuh"

#include <strata/transfer/gpu_assisted.cuh>

using namespace strata;
using test::layout_kind;

TEST_CASE("gpu_assisted round trips every layout pair bit-exactly", "[gpu][gpu_assisted]")
{
  cuda_stream stream;
  gpu_assisted loads{default_load_config};
  gpu_assisted narrow{{1, 128}};
  test::for_each_case(false, [&](layout_kind dk, layout_kind hk, kv_geometry const& g, std::uint64_t seed) {
    test::round_trip(dk, hk, g, seed, [&](auto const& plan) { return submit(loads, plan, stream.get()); });
    test::round_trip(dk, hk, g, seed + 3,
                     [&](auto const& plan) { return submit(narrow, plan, stream.get(), completion::whole); });
  });
}

TEST_CASE("gpu_assisted handles adversarial page maps", "[gpu][gpu_assisted]")
{
  cuda_stream stream;
  gpu_assisted b;
  test::for_each_case(false, [&](layout_kind dk, layout_kind hk, kv_geometry const& g, std::uint64_t seed) {
    if (g.page_tokens != 32) { return; }
    test::adversarial_maps(dk, hk, g, seed, [&](auto const& plan) { return submit(b, plan, stream.get()); });
  });
}

TEST_CASE("gpu_assisted rejects bad plans and misaligned pools before launching", "[gpu][gpu_assisted]")
{
  cuda_stream stream;
  gpu_assisted b;
  kv_geometry const g = models::llama31_8b.geometry(16, 2, 8);
  test::device_storage dev(4 * g.page_bytes() + 64);
  test::pinned_storage host(4 * g.page_bytes() + 64);
  std::vector<std::byte> poison(dev.size());
  test::fill_poison(poison);
  test::upload(dev, poison);

  page_first const src{host.data(), g, 4};
  layer_first const dst{dev.data(), g, 4};
  std::vector<page_pair> const dup{{0, 1}, {1, 1}};
  STRATA_REQUIRE_THROWS(
      invalid_argument, "destination page 1 appears more than once",
      (void)submit(b, copy_plan{src, dst, std::span<page_pair const>{dup}, layer_range::all(g)}, stream.get()));
  std::vector<page_pair> const out_of_range{{0, 4}};
  STRATA_REQUIRE_THROWS(
      invalid_argument, "destination page 4 out of range",
      copy(b, copy_plan{src, dst, std::span<page_pair const>{out_of_range}, layer_range::all(g)}, stream.get()));

  layer_first const misaligned{dev.data() + 8, g, 4};
  std::vector<page_pair> const ok{{0, 1}};
  STRATA_REQUIRE_THROWS(
      invalid_argument, "not 16-byte aligned in the layer_first layout",
      (void)submit(b, copy_plan{src, misaligned, std::span<page_pair const>{ok}, layer_range::all(g)}, stream.get()));
  STRATA_CUDA_TRY(cudaStreamSynchronize(stream.get()));
  CHECK(test::first_difference(test::download(dev), poison) == -1);

  STRATA_REQUIRE_THROWS(invalid_argument, "ctas must be positive", gpu_assisted({0, 1024}));
  STRATA_REQUIRE_THROWS(invalid_argument, "threads must be 128, 256, 512 or 1024", gpu_assisted({2, 100}));
}

TEST_CASE("per-layer completion lets a compute stream start on a layer that has landed", "[gpu][gpu_assisted]")
{
  cuda_stream copy_stream, compute_stream;
  gpu_assisted b{{1, 128}};  // slow on purpose: later layers are still in flight
  kv_geometry const g = models::llama31_8b.geometry(32);
  std::int64_t const pages = 24;  // 96 MiB
  test::pinned_storage host(pages * g.page_bytes());
  test::device_storage dev(pages * g.page_bytes());
  std::vector<std::byte> bytes(host.size());
  std::mt19937_64 rng{17};
  test::fill_random(bytes, rng);
  test::upload(host, bytes);
  page_first const src{host.data(), g, pages};
  layer_first const dst{dev.data(), g, pages};
  std::vector<page_pair> map;
  for (std::int64_t i = 0; i < pages; ++i) {
    map.push_back({i, pages - 1 - i});
  }

  transfer_handle const h =
      submit(b, copy_plan{src, dst, std::span<page_pair const>{map}, layer_range::all(g)}, copy_stream.get());
  CHECK(h.per_layer());
  CHECK(h.events().size() == static_cast<std::size_t>(g.layers));
  // Compute reads layer 3 (both planes: contiguous in layer_first) as soon as layer 3 has landed.
  std::int64_t const layer = 3;
  std::vector<std::byte> snapshot(static_cast<std::size_t>(g.planes * pages * g.block_bytes()));
  test::pinned_storage staging(snapshot.size());
  wait_layer(h, layer, compute_stream.get());
  STRATA_CUDA_TRY(cudaMemcpyAsync(staging.data(), dst.block(0, layer, 0).data, staging.size(), cudaMemcpyDefault,
                                  compute_stream.get()));
  STRATA_CUDA_TRY(cudaStreamSynchronize(compute_stream.get()));
  std::copy_n(staging.data(), staging.size(), snapshot.begin());
  h.synchronize();
  CHECK(h.done());
  std::vector<std::byte> expected(snapshot.size());
  for (auto const p : map) {
    for (std::int64_t k = 0; k < g.planes; ++k) {
      auto const from = src.block(p.src, layer, k).data - host.data();
      auto const to = dst.block(p.dst, layer, k).data - dst.block(0, layer, 0).data;
      std::copy_n(bytes.begin() + from, g.block_bytes(), expected.begin() + to);
    }
  }
  CHECK(test::first_difference(snapshot, expected) == -1);
  STRATA_REQUIRE_THROWS(invalid_argument, "layer 32 is not in the transfer's range [0, 32)",
                        wait_layer(h, 32, compute_stream.get()));
}

namespace {
__global__ void engine_kernel() {}
}  // namespace

TEST_CASE("a copy leaves an error the engine's own work left pending to the engine", "[gpu][gpu_assisted]")
{
  cuda_stream stream;
  gpu_assisted b{default_load_config};
  kv_geometry const g = models::llama31_8b.geometry(16, 2, 8);
  test::device_storage a(static_cast<std::size_t>(2 * g.page_bytes())), d(a.size());
  std::vector<page_pair> const map{{0, 1}, {1, 0}};
  copy_plan const plan{page_first{a.data(), g, 2}, layer_first{d.data(), g, 2}, std::span<page_pair const>{map},
                       layer_range::all(g)};
  (void)cudaGetLastError();
  engine_kernel<<<1, 4096, 0, stream.get()>>>();  // the engine's launch fails: too many threads
  cudaError_t const engines = cudaPeekAtLastError();
  REQUIRE(engines != cudaSuccess);
  // strata's own launches succeed and report nothing of it; the engine still finds its error.
  CHECK_NOTHROW(submit(b, plan, stream.get()).synchronize());
  CHECK(cudaGetLastError() == engines);
  CHECK(cudaGetLastError() == cudaSuccess);
}
