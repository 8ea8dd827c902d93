// SPDX-License-Identifier: Apache-2.0
#include "gpu_support.cuh"

#include <strata/transfer/staged.cuh>

using namespace strata;
using test::layout_kind;

namespace {
/// `submit` for staged: the pools' layouts are chosen at run time, so plans between two non-record
/// layouts are instantiated too; `for_each_case(true, ...)` never runs them.
auto staged_submitter(staged& b, cudaStream_t stream, completion c = completion::per_layer)
{
  return [&b, stream, c](auto const& plan) -> transfer_handle {
    using plan_type = std::decay_t<decltype(plan)>;
    if constexpr (record_layout<typename plan_type::src_layout_type> ||
                  record_layout<typename plan_type::dst_layout_type>) {
      return submit(b, plan, stream, c);
    } else {
      FAIL("staged needs page-first records on one side");
      return {};
    }
  };
}
}  // namespace

TEST_CASE("staged round trips records and every device layout bit-exactly", "[gpu][staged]")
{
  cuda_stream stream;
  staged roomy;
  staged tight{{.chunk_bytes = 1}};  // grown to two records: one record per chunk, many chunks
  test::for_each_case(true, [&](layout_kind dk, layout_kind hk, kv_geometry const& g, std::uint64_t seed) {
    test::round_trip(dk, hk, g, seed, staged_submitter(roomy, stream.get()));
    test::round_trip(dk, hk, g, seed + 1, staged_submitter(tight, stream.get(), completion::whole));
  });
}

TEST_CASE("staged handles adversarial page maps", "[gpu][staged]")
{
  cuda_stream stream;
  staged b{{.chunk_bytes = 1}};
  test::for_each_case(true, [&](layout_kind dk, layout_kind hk, kv_geometry const& g, std::uint64_t seed) {
    if (g.page_tokens != 64) { return; }
    test::adversarial_maps(dk, hk, g, seed, staged_submitter(b, stream.get()));
  });
}

namespace {
/// Page-first records whose page `bad` cannot be read: enqueueing its copy throws (as a failed
/// `cudaMemcpyAsync` would, without harming the context).
struct records_with_a_hole : page_first {
  std::int64_t bad = -1;
  [[nodiscard]] std::byte* page_data(std::int64_t p) const
  {
    if (p == bad) { throw std::runtime_error("test: this record cannot be read"); }
    return page_first::page_data(p);
  }
};
static_assert(record_layout<records_with_a_hole>);
}  // namespace

TEST_CASE("a staged load that fails midway lets its stream complete only after the relays it queued", "[gpu][staged]")
{
  // 8 MiB steps relayed by one small CTA (slow on purpose): when step 3's copy fails, the relays of
  // steps 1 and 2 are still queued. The caller frees the destination once its stream has completed,
  // so the stream must wait for them.
  cuda_stream stream;
  staged b{{.chunk_bytes = std::int64_t{8} << 20, .relay = {1, 128}}};
  kv_geometry const g = models::llama31_8b.geometry(16);  // 2 MiB pages
  std::int64_t const pages = 32;
  test::pinned_storage host(pages * g.page_bytes());
  test::device_storage dev(pages * g.page_bytes());
  records_with_a_hole src{page_first{host.data(), g, pages}};
  src.bad = 13;  // in step 3 (4 pages a step)
  layer_first const dst{dev.data(), g, pages};
  std::vector<page_pair> map;
  for (std::int64_t i = 0; i < pages; ++i) {
    map.push_back({i, i});
  }
  copy_plan const plan{src, dst, std::span<page_pair const>{map}, layer_range::all(g)};
  for (int attempt = 0; attempt < 3; ++attempt) {
    CHECK_THROWS_AS(b.enqueue(plan, stream.get(), {}), std::runtime_error);
    REQUIRE(cudaStreamSynchronize(stream.get()) == cudaSuccess);
    CHECK(cudaStreamQuery(b.relay_stream()) == cudaSuccess);  // nothing writes the destination any more
  }
  // The backend is still usable: a whole load lands.
  src.bad = -1;
  auto const h = submit(b, copy_plan{src, dst, std::span<page_pair const>{map}, layer_range::all(g)}, stream.get());
  h.synchronize();
  CHECK(h.done());
}

TEST_CASE("staged serialises transfers submitted on different streams", "[gpu][staged]")
{
  int low = 0, high = 0;
  STRATA_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&low, &high));
  cuda_stream s1, s2{high};  // the second also moves the relay to the higher priority
  staged b{{.chunk_bytes = 1}};
  kv_geometry const g = models::llama31_8b.geometry(16, 2, 8);
  std::int64_t const pages = 16;
  test::pinned_storage host(pages * g.page_bytes());
  test::device_storage d1(pages * g.page_bytes()), d2(pages * g.page_bytes());
  std::vector<std::byte> bytes(host.size());
  std::mt19937_64 rng{5};
  test::fill_random(bytes, rng);
  test::upload(host, bytes);
  page_first const src{host.data(), g, pages};
  layer_first const a{d1.data(), g, pages}, c{d2.data(), g, pages};
  std::vector<page_pair> fwd, rev;
  for (std::int64_t i = 0; i < pages; ++i) {
    fwd.push_back({i, i});
    rev.push_back({i, pages - 1 - i});
  }
  auto const h1 = submit(b, copy_plan{src, a, std::span<page_pair const>{fwd}, layer_range::all(g)}, s1.get());
  auto const h2 = submit(b, copy_plan{src, c, std::span<page_pair const>{rev}, layer_range::all(g)}, s2.get());
  h1.synchronize();
  h2.synchronize();
  // Every byte of both pools is covered, so the expectation does not depend on what was there.
  CHECK(test::first_difference(
            test::download(d1),
            test::expected_after(copy_plan{src, a, std::span<page_pair const>{fwd}, layer_range::all(g)}, bytes,
                                 host.data(), test::download(d1), d1.data())) == -1);
  CHECK(test::first_difference(
            test::download(d2),
            test::expected_after(copy_plan{src, c, std::span<page_pair const>{rev}, layer_range::all(g)}, bytes,
                                 host.data(), test::download(d2), d2.data())) == -1);
}
