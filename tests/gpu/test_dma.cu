// SPDX-License-Identifier: Apache-2.0
#include "gpu_support.cuh"

#include <strata/transfer/dma_batch.cuh>
#include <strata/transfer/dma_copy.cuh>
#include <strata/transfer/gpu_assisted.cuh>
#include <strata/transfer/submit_thread.cuh>

using namespace strata;
using test::layout_kind;

TEST_CASE("dma_copy round trips every layout pair bit-exactly", "[gpu][dma]")
{
  cuda_stream stream;
  dma_copy b;
  test::for_each_case(false, [&](layout_kind dk, layout_kind hk, kv_geometry const& g, std::uint64_t seed) {
    test::round_trip(dk, hk, g, seed, [&](auto const& plan) { return submit(b, plan, stream.get()); });
  });
}

TEST_CASE("dma_batch round trips every layout pair bit-exactly", "[gpu][dma]")
{
  INFO("driver batch API available: " << dma_batch::batch_api_available());
  CHECK(dma_batch::batch_api_available());  // CUDA 12.8+ drivers have it; the H200 runs 13.0
  cuda_stream stream;
  dma_batch batched;
  dma_batch chunked{{.descriptors_per_call = 7}};
  dma_batch fallback{{.use_batch_api = false}};
  test::for_each_case(false, [&](layout_kind dk, layout_kind hk, kv_geometry const& g, std::uint64_t seed) {
    test::round_trip(dk, hk, g, seed, [&](auto const& plan) { return submit(batched, plan, stream.get()); });
    test::round_trip(dk, hk, g, seed + 1,
                     [&](auto const& plan) { return submit(chunked, plan, stream.get(), completion::whole); });
    test::round_trip(dk, hk, g, seed + 2, [&](auto const& plan) { return submit(fallback, plan, stream.get()); });
  });
}

TEST_CASE("dma_batch moves stretches of consecutive pages as strided copies, exactly", "[gpu][dma]")
{
  cuda_stream stream;
  dma_batch strided;
  dma_batch plain{{.strided_runs = false}};
  std::int64_t const pages = 24;
  int strided_backups = 0;
  test::for_each_case(false, [&](layout_kind dk, layout_kind hk, kv_geometry const& g, std::uint64_t seed) {
    if (g.page_tokens != 16) { return; }
    std::mt19937_64 rng{seed};
    test::with_pool<test::device_storage>(dk, g, pages, seed, [&](auto& dev) {
      test::with_pool<test::pinned_storage>(hk, g, pages, seed + 1, [&](auto& host) {
        INFO("device " << to_string(dk) << ", host " << to_string(hk) << ", geometry " << g);
        // Stretches of consecutive pairs at random offsets (a loaded prefix on pages allocated in order).
        std::vector<page_pair> map;
        // Sources are distinct too: the map is reversed below (a backup), destinations never repeat.
        std::vector<bool> used(pages), read(pages);
        for (int tries = 0; tries < 64 && map.size() < 16; ++tries) {
          std::int64_t const len = 1 + std::int64_t(rng() % 8), s0 = std::int64_t(rng() % pages),
                             d0 = std::int64_t(rng() % pages);
          for (std::int64_t i = 0; i < len && s0 + i < pages && d0 + i < pages; ++i) {
            if (used[std::size_t(d0 + i)] || read[std::size_t(s0 + i)]) { break; }
            used[std::size_t(d0 + i)] = true;
            read[std::size_t(s0 + i)] = true;
            map.push_back({s0 + i, d0 + i});
          }
        }
        for (dma_batch* b : {&strided, &plain}) {
          std::vector<std::byte> d_bytes(dev.storage.size()), h_bytes(host.storage.size());
          test::fill_random(h_bytes, rng);
          test::fill_poison(d_bytes);
          test::upload(host.storage, h_bytes);
          test::upload(dev.storage, d_bytes);
          copy_plan const load{host.layout, dev.layout, std::span<page_pair const>{map}, layer_range::all(g)};
          submit(*b, load, stream.get()).synchronize();
          CHECK(test::first_difference(
                    test::download(dev.storage),
                    test::expected_after(load, h_bytes, host.storage.data(), d_bytes, dev.storage.data())) == -1);
          // And back (a backup): its runs visited layer by layer, as the device holds them.
          std::vector<page_pair> back(map.size());
          std::transform(map.begin(), map.end(), back.begin(), [](page_pair p) { return page_pair{p.dst, p.src}; });
          test::fill_random(d_bytes, rng);
          test::fill_poison(h_bytes);
          test::upload(dev.storage, d_bytes);
          test::upload(host.storage, h_bytes);
          std::int64_t const before = b->strided_copies();
          copy_plan const backup{dev.layout, host.layout, std::span<page_pair const>{back}, layer_range::all(g)};
          submit(*b, backup, stream.get()).synchronize();
          CHECK(test::first_difference(
                    test::download(host.storage),
                    test::expected_after(backup, d_bytes, dev.storage.data(), h_bytes, host.storage.data())) == -1);
          std::size_t stretches = 1;
          for (std::size_t i = 1; i < back.size(); ++i) {
            stretches += back[i].src == back[i - 1].src + 1 && back[i].dst == back[i - 1].dst + 1 ? 0 : 1;
          }
          if (b == &strided && dk == layout_kind::layer_first && hk == layout_kind::page_first &&
              2 * stretches <= back.size()) {
            CHECK(b->strided_copies() > before);  // the device's blocks of a stretch, one copy per (layer, plane)
            ++strided_backups;
          }
        }
      });
    });
  });
  CHECK(plain.strided_copies() == 0);
  // Page-first records into layer-first tensors (the engine's load): every stretch is strided.
  CHECK(strided.strided_copies() > 0);
  CHECK(strided_backups > 0);
}

TEST_CASE("dma_batch's strided copies stay inside each tensor of a table of allocations", "[gpu][dma]")
{
  // An engine's table: every (layer, plane) its own cudaMalloc. Scattered pages make runs of one
  // block each, and two of them pair up as "a stride" whenever both sides ascend (across two
  // tensors too, were the (layer, plane) blocks not kept apart: test_host_copy checks that).
  cuda_stream stream;
  dma_batch b;
  kv_geometry const g{8, 16, 1, 128, 2, 2};
  std::int64_t const pages = 64;
  std::vector<test::device_storage> tensors;
  std::vector<std::byte*> table;
  for (std::int64_t t = 0; t < g.layers * g.planes; ++t) {
    tensors.emplace_back(std::size_t(pages * g.block_bytes()));
    table.push_back(static_cast<std::byte*>(tensors.back().data()));
  }
  test::pinned_storage host_mem(std::size_t(pages * g.page_bytes()));
  layer_first_table const dev{table, g, pages};
  page_first const host{static_cast<std::byte*>(host_mem.data()), g, pages};
  std::mt19937_64 rng{29};
  for (int trial = 0; trial < 8; ++trial) {
    // Every other trial ascending on both sides: a block's runs pair up, half the copies (strided).
    auto const load_map = test::scattered_pairs(pages, 24, rng, trial % 2 == 0);
    std::vector<page_pair> backup_map;
    for (auto const p : load_map) {
      backup_map.push_back({p.dst, p.src});
    }
    std::vector<std::vector<std::byte>> dev_bytes(tensors.size());
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      dev_bytes[t].resize(tensors[t].size());
      test::fill_poison(dev_bytes[t]);
      test::upload(tensors[t], dev_bytes[t]);
    }
    std::vector<std::byte> host_bytes(host_mem.size());
    test::fill_random(host_bytes, rng);
    test::upload(host_mem, host_bytes);
    copy_plan const load{host, dev, std::span<page_pair const>{load_map}, layer_range::all(g)};
    submit(b, load, stream.get()).synchronize();
    // Block (l, k) of a page in the images: the record's bytes on the host, the tensor's on the device.
    auto const host_at = [&](std::int64_t page, std::int64_t l, std::int64_t k) {
      return host_bytes.begin() + (host.block(page, l, k).data - static_cast<std::byte const*>(host_mem.data()));
    };
    auto const dev_at = [&](std::int64_t page, std::int64_t l, std::int64_t k) {
      std::size_t const t = std::size_t(l * g.planes + k);
      return dev_bytes[t].begin() + (dev.block(page, l, k).data - static_cast<std::byte const*>(tensors[t].data()));
    };
    auto const each_block = [&](auto&& f) {
      for (auto const p : load_map) {
        for (std::int64_t l = 0; l < g.layers; ++l) {
          for (std::int64_t k = 0; k < g.planes; ++k) {
            f(p, l, k);
          }
        }
      }
    };
    each_block([&](page_pair p, std::int64_t l, std::int64_t k) {
      std::copy_n(host_at(p.src, l, k), g.block_bytes(), dev_at(p.dst, l, k));
    });
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      INFO("trial " << trial << ", load, tensor " << t);
      CHECK(test::first_difference(test::download(tensors[t]), dev_bytes[t]) == -1);
    }
    // And back into poisoned records.
    test::fill_poison(host_bytes);
    test::upload(host_mem, host_bytes);
    copy_plan const backup{dev, host, std::span<page_pair const>{backup_map}, layer_range::all(g)};
    submit(b, backup, stream.get()).synchronize();
    each_block([&](page_pair p, std::int64_t l, std::int64_t k) {  // the load's pairs, reversed
      std::copy_n(dev_at(p.dst, l, k), g.block_bytes(), host_at(p.src, l, k));
    });
    INFO("trial " << trial << ", backup");
    CHECK(test::first_difference(test::download(host_mem), host_bytes) == -1);
  }
  CHECK(b.strided_copies() > 0);
  CHECK(dma_batch::strided_api_available());  // the driver refused none of them
}

TEST_CASE("dma backends handle adversarial page maps", "[gpu][dma]")
{
  cuda_stream stream;
  dma_copy single;
  dma_batch batched;
  test::for_each_case(false, [&](layout_kind dk, layout_kind hk, kv_geometry const& g, std::uint64_t seed) {
    if (g.page_tokens != 16) { return; }
    test::adversarial_maps(dk, hk, g, seed, [&](auto const& plan) { return submit(single, plan, stream.get()); });
    test::adversarial_maps(dk, hk, g, seed, [&](auto const& plan) { return submit(batched, plan, stream.get()); });
  });
}

TEST_CASE("a submit thread enqueues dma_batch off the caller's thread", "[gpu][dma][submit_thread]")
{
  cuda_stream stream;
  dma_batch batched;
  submit_thread thread;
  test::for_each_case(false, [&](layout_kind dk, layout_kind hk, kv_geometry const& g, std::uint64_t seed) {
    if (g.page_tokens != 32) { return; }
    test::round_trip(dk, hk, g, seed, [&](auto const& plan) { return thread.submit(batched, plan, stream.get()); });
  });
}

namespace {
__global__ void fill_kernel(std::uint32_t* p, std::size_t n, std::uint32_t value)
{
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    p[i] = value;
  }
}
}  // namespace

TEST_CASE("a submit thread orders the copy after earlier work on the caller's stream", "[gpu][submit_thread]")
{
  cuda_stream stream;
  dma_batch batched;
  submit_thread thread;
  kv_geometry const g = models::llama31_8b.geometry(32);
  std::int64_t const pages = 8;
  test::device_storage dev(pages * g.page_bytes());
  test::pinned_storage host(pages * g.page_bytes());
  layer_first const src{dev.data(), g, pages};
  page_first const dst{host.data(), g, pages};
  std::vector<page_pair> map;
  for (std::int64_t i = 0; i < pages; ++i) {
    map.push_back({i, i});
  }
  for (std::uint32_t round = 1; round <= 3; ++round) {
    // A slow kernel writes the pages, then the backup is submitted right away.
    fill_kernel<<<1, 32, 0, stream.get()>>>(reinterpret_cast<std::uint32_t*>(dev.data()), dev.size() / 4, round);
    auto const h = thread.submit(batched, copy_plan{src, dst, std::span<page_pair const>{map}, layer_range::all(g)},
                                 stream.get(), completion::whole);
    h.synchronize();
    auto const words = reinterpret_cast<std::uint32_t const*>(host.data());
    CHECK(std::all_of(words, words + host.size() / 4, [&](std::uint32_t w) { return w == round; }));
  }
}

TEST_CASE("a submit thread reports the backend's error to whoever waits", "[gpu][submit_thread]")
{
  cuda_stream stream;
  gpu_assisted b;
  submit_thread thread;
  kv_geometry const g = models::llama31_8b.geometry(16, 2, 8);
  test::device_storage dev(2 * g.page_bytes() + 64);
  test::pinned_storage host(2 * g.page_bytes());
  page_first const src{host.data(), g, 2};
  layer_first const misaligned{dev.data() + 8, g, 2};
  std::vector<page_pair> const map{{0, 0}};
  auto const h =
      thread.submit(b, copy_plan{src, misaligned, std::span<page_pair const>{map}, layer_range::all(g)}, stream.get());
  STRATA_REQUIRE_THROWS(invalid_argument, "not 16-byte aligned", h.wait_layer(0, stream.get()));
  STRATA_REQUIRE_THROWS(invalid_argument, "not 16-byte aligned", h.synchronize());
  // Bad plans are still rejected on the caller's thread.
  std::vector<page_pair> const bad{{5, 0}};
  STRATA_REQUIRE_THROWS(
      invalid_argument, "source page 5 out of range",
      (void)thread.submit(b, copy_plan{src, misaligned, std::span<page_pair const>{bad}, layer_range::all(g)},
                          stream.get()));
}

TEST_CASE("dma_batch on the legacy default stream falls back to one copy per run", "[gpu][dma]")
{
  // Stream 0 is PyTorch's default stream; the batch API refuses it.
  dma_batch batched;
  test::for_each_case(false, [&](layout_kind dk, layout_kind hk, kv_geometry const& g, std::uint64_t seed) {
    if (g.page_tokens != 16) { return; }
    test::round_trip(dk, hk, g, seed, [&](auto const& plan) { return submit(batched, plan, cudaStream_t{}); });
    test::round_trip(dk, hk, g, seed + 1,
                     [&](auto const& plan) { return submit(batched, plan, cudaStreamLegacy, completion::whole); });
  });
}
