#include "gpu_support.cuh"

#include <strata/tier/pinned_host_pool.cuh>
#include <strata/transfer/gpu_assisted.cuh>
#include <strata/transfer/sm_partition.cuh>

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

}  // namespace

TEST_CASE("sm_partition rejects bad sizes before creating anything", "[gpu][sm_partition]")
{
  STRATA_REQUIRE_THROWS(invalid_argument, "copy_sms must be positive, got 0", sm_partition{0});
  STRATA_REQUIRE_THROWS(invalid_argument, "copy_sms must be positive, got -2", sm_partition{-2});
  if (!sm_partition::supported()) {
    STRATA_REQUIRE_THROWS(cuda_error, "no green contexts", sm_partition{2});
    return;
  }
  STRATA_REQUIRE_THROWS(invalid_argument, "must leave SMs to compute", sm_partition{detail::sm_count()});
}

TEST_CASE("sm_partition confines each stream's kernels to its own SMs", "[gpu][sm_partition]")
{
  if (!sm_partition::supported()) {
    WARN("the driver has no green contexts: nothing to test");
    return;
  }
  int const sms = detail::sm_count();
  // Without a partition, the probe kernel spreads over (nearly) the whole device: it can see a
  // partition that does not hold.
  detail::cuda_stream plain;
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
  for (std::int64_t i = 0; i < n; ++i) { pages.push_back({slots[i], i}); }

  gpu_assisted loads{default_load_config};
  transfer_handle const h =
    submit(loads, copy_plan{host.layout(), device, std::span<page_pair const>{pages}, layer_range::all(g)},
           p.copy_stream());
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
  auto const expected = test::expected_after(plan, std::vector<std::byte>(host.layout().page_data(0),
                                                                           host.layout().page_data(0) + host.bytes()),
                                             host.layout().page_data(0), poison, dev.data());
  CHECK(test::first_difference(test::download(snapshot), expected) == -1);
  host.slots().release(slots);
}
