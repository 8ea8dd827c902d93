// SPDX-License-Identifier: Apache-2.0
// A GPU controller bound to its pool's device whichever device the calling thread has current:
// loads land on the pool's device through every backend, the caller's device stays current after
// each call, a stream of another device is refused with nothing changed, and a default stream is
// the pool's device's (PyTorch's default stream of every device is 0). The cases with two devices
// skip, with a warning, on one GPU.
#include "../support/costs.hpp"
#include "gpu_support.cuh"
#include "kv_pages.cuh"

#include <strata/cache/gpu_policies.cuh>

#include <numeric>
#include <optional>

using namespace strata;

namespace {

using tokens_t = std::vector<std::int32_t>;
using controller = cache_controller<gpu_policies<layer_first>>;

int devices()
{
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

kv_geometry const geo{4, 16, 2, 64, 2, 2};

int switch_to(int device)
{
  STRATA_CUDA_TRY(cudaSetDevice(device));
  return device;
}
std::int64_t const device_pages = 32, doc_pages = 8;

/// A pool, a compute stream and a controller made on `pool_device`; every controller call below is
/// made with `caller_device` current (the engine's thread switched device meanwhile).
struct bound_engine {
  int pool_device, caller_device;
  test::device_storage memory, bad_count;
  layer_first pool;
  cuda_stream compute;
  controller cache;
  tokens_t doc;

  bound_engine(int pool_dev, int caller_dev, gpu_executor_config c)
      : pool_device{switch_to(pool_dev)},
        caller_device{caller_dev},
        memory(std::size_t(device_pages * geo.page_bytes())),
        bad_count(sizeof(unsigned long long)),
        pool{memory.data(), geo, device_pages},
        cache{controller::tiers_type{device_pool<layer_first>{pool}, pinned_host_pool{geo, 64}}, options(),
              strata_scheduler{}, gpu_executor{std::move(c)}},
        doc(std::size_t(doc_pages * geo.page_tokens))
  {
    std::iota(doc.begin(), doc.end(), 100);
    STRATA_CUDA_TRY(cudaMemset(memory.data(), 0xA5, memory.size()));
    STRATA_CUDA_TRY(cudaMemset(bad_count.data(), 0, sizeof(unsigned long long)));
    STRATA_CUDA_TRY(cudaDeviceSynchronize());
    STRATA_CUDA_TRY(cudaSetDevice(caller_device));
  }
  static controller_options options()
  {
    controller_options o;
    o.costs = test::reading_pays(geo);
    return o;
  }
  tokens_t q(std::int32_t x) const
  {
    tokens_t t = doc;
    t.push_back(x);
    return t;
  }
  test::page_jobs jobs_of(std::uint64_t id, tokens_t const& t) const
  {
    auto const table = cache.page_table(request_id{id});
    test::page_jobs j;
    for (std::int64_t p = 0; p < doc_pages; ++p) {
      j.page[j.n] = table[std::size_t(p)];
      j.key[j.n++] = test::page_key(t, geo.page_tokens, p);
    }
    return j;
  }
  void still_callers() const { REQUIRE(current_device() == caller_device); }
  void settle()
  {
    for (int i = 0; i < 64 && cache.pending_submissions() > 0; ++i) {
      cache.executor().synchronize();
      (void)cache.poll(compute.get());
    }
    still_callers();
  }
  /// The document computed by the "model" (on the pool's device), backed up, dropped from the device.
  void compute_and_drop()
  {
    cache.submit({request_id{1}, q(1), 0, 1, 0.0});
    auto h = cache.begin_loads(cache.schedule({1 << 20, 0, 0, 0}), compute.get());
    REQUIRE(h.ran.size() == 1);
    still_callers();
    {
      device_scope const model{pool_device};
      test::write_pages<<<doc_pages, 256, 0, compute.get()>>>(pool, jobs_of(1, q(1)));
      STRATA_CUDA_TRY(cudaGetLastError());
    }
    (void)cache.finish_prefill(request_id{1}, compute.get());
    cache.release(request_id{1});
    settle();
    drop();
  }
  /// The document dropped from the device (kept on the host), the pool poisoned.
  void drop()
  {
    REQUIRE(cache.evict(tier::device, device_pages, compute.get()) >= doc_pages);
    settle();
    device_scope const model{pool_device};
    STRATA_CUDA_TRY(cudaMemset(memory.data(), 0xA5, memory.size()));  // poison
    STRATA_CUDA_TRY(cudaDeviceSynchronize());
  }
  /// Loads the document back for request `id`; each layer checked on the compute stream (or `on`,
  /// e.g. a default stream: the pool's device's) after its wait. Returns the words found wrong.
  unsigned long long load_and_check(std::uint64_t id, std::optional<cudaStream_t> on = std::nullopt)
  {
    cudaStream_t const stream = on ? *on : compute.get();
    cache.submit({request_id{id}, q(std::int32_t(id)), 0, 1, 0.0});
    auto const batch = cache.begin_loads(cache.schedule({1 << 20, 0, 0, 0}), stream);
    still_callers();
    REQUIRE(batch.started.size() == 1);
    REQUIRE(batch.started[0].cached_pages[1] == doc_pages);
    auto* bad = reinterpret_cast<unsigned long long*>(bad_count.data());
    test::page_jobs const jobs = jobs_of(id, q(std::int32_t(id)));
    for (std::int64_t l = 0; l < geo.layers; ++l) {
      REQUIRE(wait_layer(batch, l, stream));
      still_callers();
      device_scope const model{pool_device};
      test::check_layer<<<doc_pages, 128, 0, stream>>>(pool, jobs, l, bad);
      STRATA_CUDA_TRY(cudaGetLastError());
    }
    {
      device_scope const model{pool_device};
      STRATA_CUDA_TRY(cudaStreamSynchronize(stream));
    }
    (void)cache.finish_prefill(request_id{id}, stream);
    cache.release(request_id{id});
    settle();
    unsigned long long wrong = 0;
    STRATA_CUDA_TRY(cudaMemcpy(&wrong, bad, sizeof wrong, cudaMemcpyDeviceToHost));
    cache.check_invariants();
    return wrong;
  }
};

gpu_executor_config forced(int way)
{
  gpu_executor_config c;
  c.force = way == 0 ? gpu_backend::gpu_assisted : gpu_backend::dma_batch;
  c.dma_submit_thread = way != 2;
  return c;
}

}  // namespace

TEST_CASE("gpu executor: a device that does not exist is refused at construction", "[gpu][devices]")
{
  gpu_executor_config c;
  c.device = devices();
  CHECK_THROWS_AS(gpu_executor{c}, invalid_argument);
  c.device = -1;
  CHECK_THROWS_AS(gpu_executor{c}, invalid_argument);
  c.device = 0;
  CHECK(gpu_executor{c}.device() == 0);
  CHECK(gpu_executor{}.device() == current_device());
}

TEST_CASE("gpu controller: loads land on the pool's device (one device)", "[gpu][devices]")
{
  for (int way = 0; way < 3; ++way) {
    INFO("way " << way);
    bound_engine e{0, 0, forced(way)};
    e.compute_and_drop();
    CHECK(e.load_and_check(2) == 0);
    e.drop();
    CHECK(e.load_and_check(4, cudaStreamLegacy) == 0);  // on the default stream
  }
}

TEST_CASE("gpu controller: a pool on the second device with the first one current", "[gpu][devices]")
{
  if (devices() < 2) {
    WARN("skipped: needs two CUDA devices, " << devices() << " visible");
    return;
  }
  for (int way = 0; way < 3; ++way) {
    INFO("way " << way);
    bound_engine e{1, 0, forced(way)};
    CHECK(e.cache.executor().device() == 1);
    e.compute_and_drop();
    CHECK(e.load_and_check(2) == 0);

    // A stream of device 0: refused, nothing changed.
    cuda_stream other;  // made with device 0 current
    e.cache.submit({request_id{3}, e.q(3), 0, 1, 0.0});
    auto const plan = e.cache.schedule({1 << 20, 0, 0, 0});
    CHECK_THROWS_AS(e.cache.begin_loads(plan, other.get()), invalid_argument);
    e.cache.check_invariants();
    auto const b = e.cache.begin_loads(plan, e.compute.get());  // the same plan, with a stream of device 1
    e.still_callers();
    CHECK(b.started.size() == 1);
    STRATA_CUDA_TRY(cudaStreamSynchronize(e.compute.get()));
    (void)e.cache.finish_prefill(request_id{3}, e.compute.get());
    e.cache.release(request_id{3});
    e.settle();
    e.cache.check_invariants();

    // The default stream with device 0 current: device 1's (loads, waits and the check on it).
    e.drop();
    CHECK(e.load_and_check(5, cudaStreamLegacy) == 0);
    e.drop();
    CHECK(e.load_and_check(6, cudaStreamPerThread) == 0);
  }
  STRATA_CUDA_TRY(cudaSetDevice(0));
}

TEST_CASE("gpu executor: warm_up measures the link and scales the cost tables to it", "[gpu][devices]")
{
  bound_engine e{0, 0, gpu_executor_config{}};
  gpu_executor& x = e.cache.executor();
  gpu_executor_config const before = x.config();
  gpu_calibration const c = x.warm_up(e.cache.tiers());
  auto const idle = std::size_t(gpu_activity::idle), prefill = std::size_t(gpu_activity::prefill);
  for (auto b : {gpu_backend::gpu_assisted, gpu_backend::dma_batch, gpu_backend::staged}) {
    auto const i = std::size_t(b);
    INFO(to_string(b) << ": measured load " << c.load_gbps[i] << " GB/s, copy " << c.copy_gbps[i] << " GB/s");
    if (b != gpu_backend::staged) {
      CHECK((c.load_gbps[i] > 1 && c.load_gbps[i] < 1000 && c.copy_gbps[i] > 1 && c.copy_gbps[i] < 1000));
      CHECK(x.config().load_options[i].gbps[idle] == Approx(c.load_gbps[i]));
      CHECK(x.config().copy_options[i].gbps[idle] == Approx(c.copy_gbps[i]));
    }
    // The shape stays: each activity's rate keeps its ratio to the idle rate.
    CHECK(x.config().load_options[i].gbps[prefill] / x.config().load_options[i].gbps[idle] ==
          Approx(before.load_options[i].gbps[prefill] / before.load_options[i].gbps[idle]));
  }
  CHECK(c.dma_descriptor_us > 0);
  CHECK(x.config().dma_descriptor_us == c.dma_descriptor_us);
  e.still_callers();
  e.compute_and_drop();
  CHECK(e.load_and_check(2) == 0);  // and it serves, on the tables it measured
  // Again with transfers behind it and a scratch smaller than two pages (it takes two).
  e.drop();
  gpu_calibration const again = x.warm_up(e.cache.tiers(), 1);
  CHECK(again.load_gbps[std::size_t(gpu_backend::dma_batch)] > 0);
  CHECK(e.load_and_check(3) == 0);
}
