// SPDX-License-Identifier: Apache-2.0
#include "gpu_support.cuh"

#include <strata/tier/pinned_host_pool.cuh>
#include <strata/transfer/gpu_assisted.cuh>
#include <strata/transfer/sm_partition.cuh>
#include <strata/transfer/staged.cuh>
#include <strata/transfer/submit_thread.cuh>

#include <algorithm>
#include <set>

using namespace strata;
using test::layout_kind;

namespace {

// Each block records the SM it ran on, after holding it ~20 µs so that blocks spread over every SM
// the stream may use.
__global__ void record_sm(unsigned* out)
{
  unsigned sm = 0;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  long long const start = clock64();
  while (clock64() - start < 40000) {}
  if (threadIdx.x == 0) { out[blockIdx.x] = sm; }
}

std::set<unsigned> sms_used(cudaStream_t stream, int blocks)
{
  test::device_storage out(std::size_t(blocks) * sizeof(unsigned));
  record_sm<<<blocks, 64, 0, stream>>>(reinterpret_cast<unsigned*>(out.data()));
  STRATA_CUDA_TRY(cudaGetLastError());
  STRATA_CUDA_TRY(cudaStreamSynchronize(stream));
  std::vector<unsigned> ids(static_cast<std::size_t>(blocks));
  STRATA_CUDA_TRY(cudaMemcpy(ids.data(), out.data(), out.size(), cudaMemcpyDeviceToHost));
  return {ids.begin(), ids.end()};
}

bool subset(std::set<unsigned> const& a, std::set<unsigned> const& b)
{ return std::includes(b.begin(), b.end(), a.begin(), a.end()); }

}  // namespace

namespace strata::test {  // named: nvcc flags unreferenced static members in an anonymous namespace

/// A backend that moves nothing: it runs the SM probe on the stream it is given and remembers
/// which SMs it ran on, then records its events.
struct sm_probe_backend {
  static constexpr char const* name = "sm_probe";
  int blocks;
  std::set<unsigned> seen;
  CUgreenCtx ctx{};

  template <kv_layout Src, kv_layout Dst>
  void enqueue(copy_plan<Src, Dst> const&, cuda::stream_ref on, std::span<cudaEvent_t const> layer_events)
  {
    cudaStream_t const stream = on.get();
    ctx = detail::green_context_of(stream);
    auto const used = sms_used(stream, blocks);
    seen.insert(used.begin(), used.end());
    for (auto e : layer_events) {
      STRATA_CUDA_TRY(cudaEventRecord(e, stream));
    }
  }
};
static_assert(transfer_backend<sm_probe_backend>);

}  // namespace strata::test

namespace {
using strata::test::sm_probe_backend;

}  // namespace

TEST_CASE("sm_partition rejects bad sizes before creating anything", "[gpu][sm_partition]")
{
  STRATA_REQUIRE_THROWS(invalid_argument, "copy_sms must be positive, got 0", sm_partition{0});
  STRATA_REQUIRE_THROWS(invalid_argument, "copy_sms must be positive, got -2", sm_partition{-2});
  if (!sm_partition::supported()) {
    STRATA_REQUIRE_THROWS(cuda_error, "no green contexts", sm_partition{2});
    return;
  }
  STRATA_REQUIRE_THROWS(invalid_argument, "must leave SMs to compute", sm_partition{sm_count()});
}

TEST_CASE("sm_partition confines each stream's kernels to its own SMs", "[gpu][sm_partition]")
{
  if (!sm_partition::supported()) {
    WARN("the driver has no green contexts: nothing to test");
    return;
  }
  int const sms = sm_count();
  // Without a partition, the probe kernel spreads over (nearly) the whole device: it can see a
  // partition that does not hold.
  cuda_stream plain;
  REQUIRE(sms_used(plain.get(), 4 * sms).size() > std::size_t(sms / 2));

  sm_partition const p{2};
  INFO("copy partition " << p.copy_sms() << " SMs, compute " << p.compute_sms() << " SMs of " << sms);
  CHECK(p.copy_sms() >= 2);
  CHECK(p.compute_sms() >= 1);
  CHECK(p.copy_sms() + p.compute_sms() <= sms);
  auto const copy = sms_used(p.copy_stream(), 4 * sms);
  auto const compute = sms_used(p.compute_stream(), 4 * sms);
  CHECK(copy.size() <= std::size_t(p.copy_sms()));
  CHECK(compute.size() <= std::size_t(p.compute_sms()));
  CHECK(compute.size() > std::size_t(p.copy_sms()));
  std::vector<unsigned> both;
  std::set_intersection(copy.begin(), copy.end(), compute.begin(), compute.end(), std::back_inserter(both));
  CHECK(both.empty());
}

TEST_CASE("gpu_assisted moves pages on the copy partition bit-exactly", "[gpu][sm_partition]")
{
  if (!sm_partition::supported()) {
    WARN("the driver has no green contexts: nothing to test");
    return;
  }
  sm_partition const p{2};
  gpu_assisted loads{default_load_config};
  for (auto const& g : {models::llama31_8b.geometry(16, 2, 8), models::deepseek_v3.geometry(32)}) {
    for (auto dk : {layout_kind::layer_first, layout_kind::layer_first_table}) {
      test::round_trip(dk, layout_kind::page_first, g, 7,
                       [&](auto const& plan) { return submit(loads, plan, p.copy_stream()); });
    }
  }
}

TEST_CASE("the compute partition waits for each layer loaded on the copy partition", "[gpu][sm_partition]")
{
  if (!sm_partition::supported()) {
    WARN("the driver has no green contexts: nothing to test");
    return;
  }
  sm_partition const p{2};
  kv_geometry const g = models::llama31_8b.geometry(32);  // 4 MiB pages: a load of ~4 ms
  std::int64_t const n = 64;
  pinned_host_pool host{g, n};
  auto const slots = host.slots().allocate(n);
  std::mt19937_64 rng{11};
  std::vector<std::byte> records(static_cast<std::size_t>(n * g.page_bytes()));
  test::fill_random(records, rng);
  for (std::int64_t i = 0; i < n; ++i) {
    std::copy_n(records.begin() + i * g.page_bytes(), g.page_bytes(), host.layout().page_data(slots[i]));
  }
  test::device_storage dev(n * g.page_bytes()), snapshot(n * g.page_bytes());
  std::vector<std::byte> poison(dev.size());
  test::fill_poison(poison);
  test::upload(dev, poison);
  layer_first const device{dev.data(), g, n};
  std::vector<page_pair> pages;
  for (std::int64_t i = 0; i < n; ++i) {
    pages.push_back({slots[i], i});
  }

  gpu_assisted loads{default_load_config};
  transfer_handle const h = submit(
      loads, copy_plan{host.layout(), device, std::span<page_pair const>{pages}, layer_range::all(g)}, p.copy_stream());
  REQUIRE(h.per_layer());
  // The compute stream copies each layer out as soon as it has landed, and never earlier.
  auto const layer_bytes = std::size_t(n * g.page_bytes() / g.layers);
  for (std::int64_t l = 0; l < g.layers; ++l) {
    wait_layer(h, l, p.compute_stream());
    STRATA_CUDA_TRY(cudaMemcpyAsync(snapshot.data() + l * layer_bytes, dev.data() + l * layer_bytes, layer_bytes,
                                    cudaMemcpyDeviceToDevice, p.compute_stream()));
  }
  STRATA_CUDA_TRY(cudaStreamSynchronize(p.compute_stream()));
  copy_plan const plan{host.layout(), device, std::span<page_pair const>{pages}, layer_range::all(g)};
  std::vector<std::byte> host_bytes(records.size());
  // Expected: the records, transposed into layer-first, computed from addresses alone.
  auto const expected = test::expected_after(
      plan, std::vector<std::byte>(host.layout().page_data(0), host.layout().page_data(0) + host.bytes()),
      host.layout().page_data(0), poison, dev.data());
  CHECK(test::first_difference(test::download(snapshot), expected) == -1);
  host.slots().release(slots);
}

TEST_CASE("staged relays run on the copy partition and land bit-exactly", "[gpu][sm_partition][staged]")
{
  if (!sm_partition::supported()) {
    WARN("the driver has no green contexts: nothing to test");
    return;
  }
  sm_partition const p{2};
  int const sms = sm_count();
  auto const copy_sms = sms_used(p.copy_stream(), 4 * sms);
  staged st{{.chunk_bytes = 1 << 20}};
  for (auto const& g : {models::llama31_8b.geometry(16, 2, 8), models::deepseek_v3.geometry(32)}) {
    for (auto dk : {layout_kind::layer_first, layout_kind::layer_first_table}) {
      test::round_trip(dk, layout_kind::page_first, g, 9, [&](auto const& plan) -> transfer_handle {
        using plan_type = std::decay_t<decltype(plan)>;
        if constexpr (record_layout<typename plan_type::src_layout_type> ||
                      record_layout<typename plan_type::dst_layout_type>) {
          return submit(st, plan, p.copy_stream());
        } else {
          FAIL("staged needs records on one side");
          return {};
        }
      });
    }
  }
  // The relay stream belongs to the copy partition's green context: its kernels use only its SMs.
  REQUIRE(st.relay_stream() != nullptr);
  CHECK(detail::green_context_of(st.relay_stream()) == detail::green_context_of(p.copy_stream()));
  CHECK(detail::green_context_of(st.relay_stream()) != nullptr);
  auto const relay_sms = sms_used(st.relay_stream(), 4 * sms);
  INFO("copy partition SMs: " << copy_sms.size() << ", relay stream SMs: " << relay_sms.size());
  CHECK(subset(relay_sms, copy_sms));
  CHECK(relay_sms.size() <= std::size_t(p.copy_sms()));
  // Back on a plain stream, the relay leaves the partition.
  cuda_stream plain;
  test::round_trip(layout_kind::layer_first, layout_kind::page_first, models::llama31_8b.geometry(16, 2, 8), 10,
                   [&](auto const& plan) -> transfer_handle {
                     using plan_type = std::decay_t<decltype(plan)>;
                     if constexpr (record_layout<typename plan_type::src_layout_type> ||
                                   record_layout<typename plan_type::dst_layout_type>) {
                       return submit(st, plan, plain.get());
                     } else {
                       FAIL("staged needs records on one side");
                       return {};
                     }
                   });
  CHECK(detail::green_context_of(st.relay_stream()) == nullptr);
}

TEST_CASE("a submit thread issues a green-context caller's copies on that partition",
          "[gpu][sm_partition][submit_thread]")
{
  if (!sm_partition::supported()) {
    WARN("the driver has no green contexts: nothing to test");
    return;
  }
  sm_partition const p{2};
  int const sms = sm_count();
  auto const copy_sms = sms_used(p.copy_stream(), 4 * sms);
  kv_geometry const g = models::llama31_8b.geometry(16, 2, 8);
  test::device_storage a(static_cast<std::size_t>(2 * g.page_bytes())), b(a.size());
  std::vector<page_pair> const map{{0, 1}};
  copy_plan const plan{page_first{a.data(), g, 2}, layer_first{b.data(), g, 2}, std::span<page_pair const>{map},
                       layer_range{0, 2}};
  sm_probe_backend probe{4 * sms, {}, {}};
  {
    submit_thread thread;
    thread.submit(probe, plan, p.copy_stream(), completion::whole).synchronize();
    CHECK(probe.ctx == detail::green_context_of(p.copy_stream()));
    CHECK(subset(probe.seen, copy_sms));
    // Real copies through the thread on the partition land exactly.
    gpu_assisted loads{default_load_config};
    test::round_trip(layout_kind::layer_first, layout_kind::page_first, g, 12,
                     [&](auto const& pl) { return thread.submit(loads, pl, p.copy_stream()); });
  }
}

TEST_CASE("a submit thread keeps a green-context caller's copies in order: a later handle covers earlier ones",
          "[gpu][sm_partition][submit_thread]")
{
  if (!sm_partition::supported()) {
    WARN("the driver has no green contexts: nothing to test");
    return;
  }
  // A large copy by one small CTA, then a one-page copy, both from the copy partition's stream:
  // once the second has landed the first has too (an executor's synchronize() and shutdown wait
  // for the last handle of each kind only).
  sm_partition const p{2};
  kv_geometry const g = models::llama31_8b.geometry(16);  // 2 MiB pages
  std::int64_t const pages = 128;
  test::device_storage a(static_cast<std::size_t>(pages * g.page_bytes())), b(a.size());
  std::vector<page_pair> map;
  for (std::int64_t i = 0; i < pages; ++i) {
    map.push_back({i, pages - 1 - i});
  }
  gpu_assisted slow{{1, 128}}, quick{default_load_config};
  submit_thread thread;
  for (int round = 0; round < 3; ++round) {
    auto const big = thread.submit(slow,
                                   copy_plan{page_first{a.data(), g, pages}, layer_first{b.data(), g, pages},
                                             std::span<page_pair const>{map}, layer_range::all(g)},
                                   p.copy_stream(), completion::whole);
    auto const small = thread.submit(quick,
                                     copy_plan{page_first{a.data(), g, pages}, layer_first{b.data(), g, pages},
                                               std::span<page_pair const>{map}.first(1), layer_range::all(g)},
                                     p.copy_stream(), completion::whole);
    small.synchronize();
    CHECK(big.done());
    big.synchronize();
  }
}
