// SPDX-License-Identifier: Apache-2.0
// Shared by the [gpu] tests: device/pinned pools of every layout kind, a reference computed from
// addresses alone, and round trips device -> host -> device through any backend.
#pragma once

#include "../support/catch.hpp"
#include "../support/pools.hpp"

#include <strata/cuda.cuh>
#include <strata/transfer/backend.cuh>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace strata::test {

namespace {
/// Spins (one thread) until `*flag` is non-zero or `timeout_ns` of GPU time have passed.
__global__ void wait_for_flag(int const volatile* flag, unsigned long long timeout_ns)
{
  unsigned long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (;;) {
    if (*flag != 0) { return; }
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start > timeout_ns) { return; }
    __nanosleep(1000);
  }
}
}  // namespace

/**
 * Holds a stream: `hold(s)` launches a kernel that spins until `release()` sets a flag in mapped
 * pinned memory, so that work enqueued on `s` afterwards does not run yet. A watchdog thread
 * releases it after `watchdog` anyway: correct code may block the host on that very work (a ring
 * waiting for an old region), and must then go on rather than deadlock. The kernel also gives up
 * after 30 s of GPU time.
 */
class stream_gate {
 public:
  explicit stream_gate(std::chrono::milliseconds watchdog = std::chrono::milliseconds{3000}) : watchdog_{watchdog}
  {
    STRATA_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&flag_), sizeof(int), cudaHostAllocMapped));
    *flag_ = 0;
  }
  stream_gate(stream_gate const&) = delete;
  stream_gate& operator=(stream_gate const&) = delete;
  ~stream_gate()
  {
    release();
    if (thread_.joinable()) { thread_.join(); }
    (void)cudaDeviceSynchronize();
    (void)cudaFreeHost(flag_);
  }

  void hold(cudaStream_t s)
  {
    int* device = nullptr;
    STRATA_CUDA_TRY(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device), flag_, 0));
    wait_for_flag<<<1, 1, 0, s>>>(device, 30'000'000'000ull);
    STRATA_CUDA_TRY(cudaGetLastError());
    if (!thread_.joinable()) {
      thread_ = std::thread{[this] {
        std::unique_lock lock{m_};
        if (!cv_.wait_for(lock, watchdog_, [this] { return released_; })) { fired_ = true; }
        store();
      }};
    }
  }
  void release()
  {
    {
      std::lock_guard lock{m_};
      released_ = true;
    }
    cv_.notify_all();
    store();
  }
  /// Whether the watchdog had to release the stream (the host blocked while it was held).
  [[nodiscard]] bool watchdog_fired()
  {
    std::lock_guard lock{m_};
    return fired_;
  }

 private:
  void store() { __atomic_store_n(flag_, 1, __ATOMIC_SEQ_CST); }

  std::chrono::milliseconds watchdog_;
  int* flag_{};
  std::mutex m_;
  std::condition_variable cv_;
  bool released_{false};
  bool fired_{false};
  std::thread thread_;
};

using device_storage = device_buffer;
using pinned_storage = pinned_buffer;

template <class Storage>
std::vector<std::byte> download(Storage const& s)
{
  std::vector<std::byte> out(s.size());
  STRATA_CUDA_TRY(cudaMemcpy(out.data(), s.data(), s.size(), cudaMemcpyDefault));
  return out;
}

/// Copies `bytes` into `s` and waits until they have landed: a cudaMemcpy from pageable memory may
/// return before its DMA finishes, and the tests' non-blocking streams do not wait for it.
template <class Storage>
void upload(Storage& s, std::vector<std::byte> const& bytes)
{
  STRATA_CUDA_TRY(cudaMemcpy(s.data(), bytes.data(), bytes.size(), cudaMemcpyDefault));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
}

/// What the destination storage must hold after `plan`, from snapshots of both storages taken
/// before it: computed from the layouts' addresses alone (nothing is dereferenced).
template <class S, class D>
std::vector<std::byte> expected_after(copy_plan<S, D> const& plan, std::vector<std::byte> const& src_bytes,
                                      std::byte const* src_base, std::vector<std::byte> dst_bytes,
                                      std::byte const* dst_base)
{
  auto const n = plan.src.geometry().head_bytes();
  for_each_row(plan, [&](std::byte const* s, std::byte* d) {
    std::copy_n(src_bytes.begin() + (s - src_base), n, dst_bytes.begin() + (d - dst_base));
  });
  return dst_bytes;
}

/// Geometries of the GPU tests: Llama-3.1-8B, its TP8 shard, DeepSeek MLA, at 16/32/64-token pages
/// (only TP8 at 16 tokens when STRATA_GPU_TEST_QUICK is set, e.g. under compute-sanitizer).
inline std::vector<kv_geometry> gpu_test_geometries()
{
  if (std::getenv("STRATA_GPU_TEST_QUICK") != nullptr) { return {models::llama31_8b.geometry(16, 2, 8)}; }
  std::vector<kv_geometry> out;
  for (std::int64_t p : {16, 32, 64}) {
    out.push_back(models::llama31_8b.geometry(p));
    out.push_back(models::llama31_8b.geometry(p, 2, 8));
    out.push_back(models::deepseek_v3.geometry(p));
  }
  return out;
}

/// Layout kinds a host-side pool takes for a backend that needs records (`staged`) or not.
inline std::vector<layout_kind> host_kinds(bool records_only)
{
  if (records_only) { return {layout_kind::page_first, layout_kind::page_first_chunked}; }
  return {std::begin(all_layout_kinds), std::end(all_layout_kinds)};
}

/**
 * Device pool (random) -> pinned host pool (poisoned) -> device pool (poisoned) through
 * `submit(plan) -> transfer_handle`, checking each leg against the address-level reference.
 */
template <class Submit>
void round_trip(layout_kind device_kind, layout_kind host_kind, kv_geometry const& g, std::uint64_t seed,
                Submit&& submit)
{
  std::mt19937_64 rng{seed};
  std::int64_t const device_pages = 3, host_pages = 4;
  with_pool<device_storage>(device_kind, g, device_pages, seed, [&](auto& dev) {
    with_pool<pinned_storage>(host_kind, g, host_pages, seed + 1, [&](auto& host) {
      INFO("device " << to_string(device_kind) << ", host " << to_string(host_kind) << ", geometry " << g << ", seed "
                     << seed);
      std::int64_t const n = std::min(dev.layout.num_pages(), host.layout.num_pages());
      auto const there = random_map(std::uniform_int_distribution<std::int64_t>{1, n}(rng), dev.layout.num_pages(),
                                    host.layout.num_pages(), rng);
      std::vector<page_pair> back;
      for (auto p : there) {
        back.push_back({p.dst, p.src});
      }
      std::int64_t const a = std::uniform_int_distribution<std::int64_t>{0, g.layers - 1}(rng);
      layer_range const layers{a, std::uniform_int_distribution<std::int64_t>{a + 1, g.layers}(rng)};

      std::vector<std::byte> original(dev.storage.size());
      fill_random(original, rng);
      upload(dev.storage, original);
      std::vector<std::byte> poisoned_host(host.storage.size());
      fill_poison(poisoned_host);
      upload(host.storage, poisoned_host);

      copy_plan const backup{dev.layout, host.layout, std::span<page_pair const>{there}, layers};
      submit(backup).synchronize();
      auto const host_after = download(host.storage);
      auto const host_expected =
          expected_after(backup, original, dev.storage.data(), poisoned_host, host.storage.data());
      CHECK(first_difference(host_after, host_expected) == -1);

      std::vector<std::byte> poisoned_dev(dev.storage.size());
      fill_poison(poisoned_dev);
      upload(dev.storage, poisoned_dev);
      copy_plan const load{host.layout, dev.layout, std::span<page_pair const>{back}, layers};
      submit(load).synchronize();
      auto const dev_expected = expected_after(load, host_after, host.storage.data(), poisoned_dev, dev.storage.data());
      CHECK(first_difference(download(dev.storage), dev_expected) == -1);
    });
  });
}

/// One-way copies with adversarial maps (reversed, one source copied everywhere, the last page),
/// host -> device and device -> host.
template <class Submit>
void adversarial_maps(layout_kind device_kind, layout_kind host_kind, kv_geometry const& g, std::uint64_t seed,
                      Submit&& submit)
{
  std::mt19937_64 rng{seed};
  with_pool<device_storage>(device_kind, g, 4, seed, [&](auto& dev) {
    with_pool<pinned_storage>(host_kind, g, 4, seed + 1, [&](auto& host) {
      INFO("device " << to_string(device_kind) << ", host " << to_string(host_kind) << ", geometry " << g);
      auto const nd = dev.layout.num_pages(), nh = host.layout.num_pages();
      auto const n = std::min(nd, nh);
      std::vector<std::vector<page_pair>> maps(3);
      for (std::int64_t i = 0; i < n; ++i) {
        maps[0].push_back({i, n - 1 - i});
      }
      for (std::int64_t i = 0; i < n; ++i) {
        maps[1].push_back({n - 1, i});
      }
      maps[2].push_back({n - 1, n - 1});
      for (auto const& map : maps) {
        std::vector<std::byte> d_bytes(dev.storage.size()), h_bytes(host.storage.size());
        fill_random(h_bytes, rng);
        fill_poison(d_bytes);
        upload(host.storage, h_bytes);
        upload(dev.storage, d_bytes);
        copy_plan const load{host.layout, dev.layout, std::span<page_pair const>{map}, layer_range::all(g)};
        submit(load).synchronize();
        CHECK(first_difference(download(dev.storage),
                               expected_after(load, h_bytes, host.storage.data(), d_bytes, dev.storage.data())) == -1);

        fill_random(d_bytes, rng);
        fill_poison(h_bytes);
        upload(host.storage, h_bytes);
        upload(dev.storage, d_bytes);
        copy_plan const backup{dev.layout, host.layout, std::span<page_pair const>{map}, layer_range::all(g)};
        submit(backup).synchronize();
        CHECK(first_difference(download(host.storage), expected_after(backup, d_bytes, dev.storage.data(), h_bytes,
                                                                      host.storage.data())) == -1);
      }
    });
  });
}

/// Runs `test(device_kind, host_kind, geometry, seed)` over the whole matrix.
template <class Test>
void for_each_case(bool records_only, Test&& test)
{
  std::uint64_t seed = 1;
  for (kv_geometry const& g : gpu_test_geometries()) {
    for (layout_kind const dk : all_layout_kinds) {
      for (layout_kind const hk : host_kinds(records_only)) {
        if (!supports(dk, g) || !supports(hk, g)) { continue; }
        test(dk, hk, g, seed);
        seed += 7;
      }
    }
  }
}

}  // namespace strata::test
