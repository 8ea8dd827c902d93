// SPDX-License-Identifier: Apache-2.0
// submit_thread: loads ahead of backups, owned page lists, the caller's stream priority, errors
// through the handle; split's per-layer completion through submit and wait_layer.
#include "gpu_support.cuh"

#include <strata/transfer/gpu_assisted.cuh>
#include <strata/transfer/split.cuh>
#include <strata/transfer/submit_thread.cuh>

#include <future>
#include <string>

using namespace strata;
using test::layout_kind;

namespace strata::test {  // named: nvcc flags unreferenced static members in an anonymous namespace

/// A backend that moves nothing: it records its events, logs each call ("<tag>:<first layer>") with
/// the priority of the stream it was given, and can block in one call until released.
struct recording_backend {
  static constexpr char const* name = "recording";
  std::string tag;
  std::mutex* m;
  std::vector<std::string>* log;
  std::vector<int>* priorities;
  std::int64_t block_at_layer = -1;  ///< the call covering this layer blocks until `release` is set
  std::promise<void> entered;
  std::shared_future<void> release;

  recording_backend(std::string t, std::mutex* mutex, std::vector<std::string>* calls, std::vector<int>* prios,
                    std::int64_t block_at = -1, std::shared_future<void> go = {})
      : tag{std::move(t)}, m{mutex}, log{calls}, priorities{prios}, block_at_layer{block_at}, release{std::move(go)}
  {
  }

  template <kv_layout Src, kv_layout Dst>
  void enqueue(copy_plan<Src, Dst> const& plan, cuda::stream_ref on, std::span<cudaEvent_t const> layer_events)
  {
    cudaStream_t const stream = on.get();
    int priority = 0;
    STRATA_CUDA_TRY(cudaStreamGetPriority(stream, &priority));
    {
      std::lock_guard lock{*m};
      log->push_back(tag + ":" + std::to_string(plan.layers.begin));
      priorities->push_back(priority);
    }
    if (plan.layers.begin <= block_at_layer && block_at_layer < plan.layers.end) {
      entered.set_value();
      release.wait();
    }
    for (auto e : layer_events) {
      STRATA_CUDA_TRY(cudaEventRecord(e, stream));
    }
  }
};
static_assert(transfer_backend<recording_backend>);

/// Wraps `gpu_assisted`; the call covering layer `fail_at` throws instead of enqueueing.
struct failing_backend {
  static constexpr char const* name = "failing";
  gpu_assisted inner;
  std::int64_t fail_at;

  template <kv_layout Src, kv_layout Dst>
  void enqueue(copy_plan<Src, Dst> const& plan, cuda::stream_ref stream, std::span<cudaEvent_t const> layer_events)
  {
    if (plan.layers.begin <= fail_at && fail_at < plan.layers.end) {
      throw cuda_error(detail::concat("strata: test: enqueue fails at layer ", fail_at));
    }
    inner.enqueue(plan, stream, layer_events);
  }
};
static_assert(transfer_backend<failing_backend>);

}  // namespace strata::test

namespace {
using test::failing_backend;
using test::recording_backend;

struct small_pools {
  kv_geometry g = models::llama31_8b.geometry(16, 2, 8);
  std::int64_t pages = 8;
  test::pinned_storage host{static_cast<std::size_t>(pages * g.page_bytes())};
  test::device_storage dev{static_cast<std::size_t>(pages * g.page_bytes())};
  page_first src{host.data(), g, pages};
  layer_first dst{dev.data(), g, pages};
  std::vector<std::byte> records, poison;

  explicit small_pools(std::uint64_t seed)
  {
    std::mt19937_64 rng{seed};
    records.resize(host.size());
    test::fill_random(records, rng);
    test::upload(host, records);
    poison.resize(dev.size());
    test::fill_poison(poison);
    test::upload(dev, poison);
  }
};

}  // namespace

TEST_CASE("a failed transfer is not done: done() rethrows, failed() says so", "[gpu][submit_thread]")
{
  small_pools p{1};
  std::vector<page_pair> const map{{0, 3}, {1, 2}, {2, 1}};
  failing_backend b{gpu_assisted{}, 5};
  submit_thread thread;
  cuda_stream stream;
  transfer_handle const h =
      thread.submit(b, copy_plan{p.src, p.dst, std::span<page_pair const>{map}, layer_range::all(p.g)}, stream.get());
  thread.drain();
  STRATA_CUDA_TRY(cudaDeviceSynchronize());  // the layers before 5 have landed; 5 and later never will
  CHECK(h.failed());
  STRATA_REQUIRE_THROWS(cuda_error, "enqueue fails at layer 5", (void)h.done());
  STRATA_REQUIRE_THROWS(cuda_error, "enqueue fails at layer 5", h.synchronize());
  STRATA_REQUIRE_THROWS(cuda_error, "enqueue fails at layer 5", h.wait_layer(7, stream.get()));

  // A transfer that succeeds is neither failed nor throwing.
  b.fail_at = -1;
  transfer_handle const ok =
      thread.submit(b, copy_plan{p.src, p.dst, std::span<page_pair const>{map}, layer_range::all(p.g)}, stream.get());
  ok.synchronize();
  CHECK_FALSE(ok.failed());
  CHECK(ok.done());
  CHECK_FALSE(transfer_handle{}.failed());
}

TEST_CASE("a submit thread serves a load before a backup queued earlier", "[gpu][submit_thread]")
{
  small_pools p{2};
  std::mutex m;
  std::vector<std::string> log;
  std::vector<int> priorities;
  std::promise<void> go;
  std::shared_future<void> const released = go.get_future().share();
  recording_backend gate{"gate", &m, &log, &priorities, 0, released};
  recording_backend backups{"backup", &m, &log, &priorities};
  recording_backend loads{"load", &m, &log, &priorities};
  std::vector<page_pair> const map{{0, 0}, {1, 1}};
  copy_plan const plan{p.src, p.dst, std::span<page_pair const>{map}, layer_range{0, 3}};
  cuda_stream stream;
  submit_thread thread;

  // The thread is busy with the gate's first layer while a 3-layer backup, then a load, arrive.
  auto entered = gate.entered.get_future();
  auto const g = thread.submit(gate, plan, stream.get(), completion::whole);
  entered.wait();
  auto const b = thread.submit(backups, plan, stream.get(), completion::per_layer, transfer_kind::backup);
  auto const l = thread.submit(loads, plan, stream.get(), completion::per_layer, transfer_kind::load);
  go.set_value();
  thread.drain();
  std::vector<std::string> const expected{"gate:0", "load:0", "load:1", "load:2", "backup:0", "backup:1", "backup:2"};
  CHECK(log == expected);
  l.synchronize();
  b.synchronize();
  g.synchronize();
}

TEST_CASE("a per-layer backup yields to a load between its layers", "[gpu][submit_thread]")
{
  small_pools p{3};
  std::mutex m;
  std::vector<std::string> log;
  std::vector<int> priorities;
  std::promise<void> go;
  recording_backend backups{"backup", &m, &log, &priorities, 1, go.get_future().share()};
  recording_backend loads{"load", &m, &log, &priorities};
  std::vector<page_pair> const map{{0, 0}};
  copy_plan const plan{p.src, p.dst, std::span<page_pair const>{map}, layer_range{0, 4}};
  cuda_stream stream;
  submit_thread thread;
  auto entered = backups.entered.get_future();
  auto const b = thread.submit(backups, plan, stream.get(), completion::per_layer, transfer_kind::backup);
  entered.wait();  // the backup is inside its layer 1
  auto const l = thread.submit(loads, plan, stream.get(), completion::whole, transfer_kind::load);
  go.set_value();
  thread.drain();
  std::vector<std::string> const expected{"backup:0", "backup:1", "load:0", "backup:2", "backup:3"};
  CHECK(log == expected);
  b.synchronize();
  l.synchronize();
}

TEST_CASE("a submit thread issues the copy at the caller's stream priority", "[gpu][submit_thread]")
{
  small_pools p{4};
  int low = 0, high = 0;
  STRATA_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&low, &high));
  std::mutex m;
  std::vector<std::string> log;
  std::vector<int> priorities;
  recording_backend b{"b", &m, &log, &priorities};
  std::vector<page_pair> const map{{0, 0}};
  copy_plan const plan{p.src, p.dst, std::span<page_pair const>{map}, layer_range{0, 2}};
  cuda_stream urgent{high}, normal{low};
  submit_thread thread;
  thread.submit(b, plan, urgent.get()).synchronize();
  thread.submit(b, plan, normal.get(), completion::whole).synchronize();
  thread.submit(b, plan, urgent.get(), completion::whole).synchronize();
  CHECK(priorities == std::vector<int>{high, high, low, high});
}

TEST_CASE("a submit thread lives on the device it is given; one that does not exist is refused", "[gpu][submit_thread]")
{
  int count = 0, current = 0;
  STRATA_CUDA_TRY(cudaGetDeviceCount(&count));
  STRATA_CUDA_TRY(cudaGetDevice(&current));
  CHECK(submit_thread{}.device() == current);
  CHECK(submit_thread{count - 1}.device() == count - 1);
  STRATA_REQUIRE_THROWS(invalid_argument, "does not exist", submit_thread{count});
}

TEST_CASE("a submit thread owns the page list: it may be freed right after submit", "[gpu][submit_thread]")
{
  small_pools p{5};
  std::vector<page_pair> const original{{0, 7}, {3, 1}, {5, 4}, {6, 0}};
  gpu_assisted k;
  std::mutex m;
  std::vector<std::string> log;
  std::vector<int> priorities;
  std::promise<void> go;
  recording_backend gate{"gate", &m, &log, &priorities, 0, go.get_future().share()};
  cuda_stream stream;
  submit_thread thread;
  auto entered = gate.entered.get_future();
  std::vector<page_pair> const one{{0, 0}};
  auto const g = thread.submit(gate, copy_plan{p.src, p.dst, std::span<page_pair const>{one}, layer_range{0, 1}},
                               stream.get(), completion::whole);
  entered.wait();  // the thread cannot start the next job yet
  transfer_handle h;
  {
    auto pages = std::make_unique<std::vector<page_pair>>(original);
    h = thread.submit(k, copy_plan{p.src, p.dst, std::span<page_pair const>{*pages}, layer_range::all(p.g)},
                      stream.get());
    std::fill(pages->begin(), pages->end(), page_pair{2, 2});  // what a reused buffer would hold
  }
  go.set_value();
  h.synchronize();
  g.synchronize();
  copy_plan const expected_plan{p.src, p.dst, std::span<page_pair const>{original}, layer_range::all(p.g)};
  CHECK(test::first_difference(test::download(p.dev), test::expected_after(expected_plan, p.records, p.host.data(),
                                                                           p.poison, p.dev.data())) == -1);
}

TEST_CASE("split round trips every layout pair bit-exactly", "[gpu][split]")
{
  cuda_stream stream;
  split half;
  split mostly_dma{{.dma_fraction = 0.8, .kernel = {1, 256}}};
  test::for_each_case(false, [&](layout_kind dk, layout_kind hk, kv_geometry const& g, std::uint64_t seed) {
    if (g.page_tokens != 32 && std::getenv("STRATA_GPU_TEST_QUICK") == nullptr) { return; }
    test::round_trip(dk, hk, g, seed, [&](auto const& plan) { return submit(half, plan, stream.get()); });
    test::round_trip(dk, hk, g, seed + 1,
                     [&](auto const& plan) { return submit(mostly_dma, plan, stream.get(), completion::whole); });
  });
}

TEST_CASE("split completes per layer: another stream waits for each layer of both shares", "[gpu][split]")
{
  kv_geometry const g = models::llama31_8b.geometry(32);  // 4 MiB pages
  std::int64_t const pages = 24;
  test::pinned_storage host(static_cast<std::size_t>(pages * g.page_bytes()));
  test::device_storage dev(static_cast<std::size_t>(pages * g.page_bytes()));
  test::device_storage snapshot(dev.size());
  std::vector<std::byte> records(host.size()), poison(dev.size());
  std::mt19937_64 rng{21};
  test::fill_random(records, rng);
  test::upload(host, records);
  test::fill_poison(poison);
  page_first const src{host.data(), g, pages};
  layer_first const dst{dev.data(), g, pages};
  std::vector<page_pair> map;
  for (auto i : test::random_map(pages, pages, pages, rng)) {
    map.push_back(i);
  }
  copy_plan const plan{src, dst, std::span<page_pair const>{map}, layer_range::all(g)};
  auto const expected = test::expected_after(plan, records, host.data(), poison, dev.data());
  auto const layer_bytes = static_cast<std::size_t>(pages * g.page_bytes() / g.layers);

  split b{{.dma_fraction = 0.5, .kernel = {1, 128}}};  // a slow kernel share: later layers still in flight
  submit_thread thread;
  cuda_stream copy_stream, compute_stream;
  for (int via_thread = 0; via_thread < 2; ++via_thread) {
    INFO("through a submit thread: " << via_thread);
    test::upload(dev, poison);
    transfer_handle const h =
        via_thread != 0 ? thread.submit(b, plan, copy_stream.get()) : submit(b, plan, copy_stream.get());
    REQUIRE(h.per_layer());
    // The compute stream copies each layer (both planes: contiguous in layer_first) as soon as its
    // event says it landed, in order: an event recorded before both shares of its layer landed
    // lets the copy read poison while later layers are still in flight.
    for (std::int64_t l = 0; l < g.layers; ++l) {
      wait_layer(h, l, compute_stream.get());
      STRATA_CUDA_TRY(cudaMemcpyAsync(snapshot.data() + l * layer_bytes, dev.data() + l * layer_bytes, layer_bytes,
                                      cudaMemcpyDeviceToDevice, compute_stream.get()));
    }
    STRATA_CUDA_TRY(cudaStreamSynchronize(compute_stream.get()));
    CHECK(test::first_difference(test::download(snapshot), expected) == -1);
    h.synchronize();
    CHECK(h.done());
  }
}
