// SPDX-License-Identifier: Apache-2.0
// Layer-wise overlap: load a cached prefix from the pinned host pool into an SGLang-style device
// pool with GPU-assisted I/O, and start each layer's attention as soon as that layer has landed.
//
// The compute stream waits per layer (strata::wait_layer); the copy kernels hold 2 SMs, so the
// engine sizes its GEMMs to the SMs left (strata::sms_left_for_compute -> cublasSetSmCountTarget).
// Then the same with green contexts (strata::sm_partition): copies and compute on disjoint SMs.
#include <strata/layout/engine.hpp>
#include <strata/tier/pinned_host_pool.cuh>
#include <strata/transfer/gpu_assisted.cuh>
#include <strata/transfer/sm_partition.cuh>

#include <cstdio>
#include <vector>

namespace {
// Stands in for the engine's attention over one layer: reads the layer's K and V of the loaded pages.
__global__ void attention_stand_in(strata::layer_first_table pool, strata::page_pair const* pages, int n, int layer,
                                   unsigned long long* checksum)
{
  auto const g = pool.geometry();
  unsigned long long sum = 0;
  for (int i = blockIdx.x; i < n; i += gridDim.x) {
    for (int plane = 0; plane < g.planes; ++plane) {
      auto const* w = reinterpret_cast<unsigned long long const*>(pool.block(pages[i].dst, layer, plane).data);
      for (long long j = threadIdx.x; j < g.block_bytes() / 8; j += blockDim.x) {
        sum += w[j];
      }
    }
  }
  atomicAdd(checksum, sum);
}
}  // namespace

int main()
{
  using namespace strata;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: nothing to show\n");
    return 0;
  }
  kv_geometry const g = models::llama31_8b.geometry(32);
  std::int64_t const prefix_pages = 128;  // a 4K-token cached prefix, 512 MiB

  // Host tier: a pinned pool holding the prefix's records (filled here by the CPU).
  pinned_host_pool host{g, 256};
  auto const slots = host.slots().allocate(prefix_pages);
  for (auto s : slots) {
    std::fill_n(host.layout().page_data(s), g.page_bytes(), std::byte{1});
  }

  // Engine: SGLang-style per-layer K and V tensors of 512 pages each.
  std::int64_t const device_pages = 512;
  std::vector<device_buffer> k, v;
  std::vector<std::byte*> k_ptr, v_ptr;
  for (std::int64_t l = 0; l < g.layers; ++l) {
    k.emplace_back(std::size_t(device_pages * g.block_bytes()));
    v.emplace_back(std::size_t(device_pages * g.block_bytes()));
    k_ptr.push_back(k.back().data());
    v_ptr.push_back(v.back().data());
  }
  layer_first_table const engine = sglang_layout(k_ptr, v_ptr, g, device_pages);

  std::vector<page_pair> pages;
  for (std::int64_t i = 0; i < prefix_pages; ++i) {
    pages.push_back({slots[std::size_t(i)], 3 * i + 1});
  }
  device_buffer device_pages_list(pages.size() * sizeof(page_pair));
  STRATA_CUDA_TRY(cudaMemcpy(device_pages_list.data(), pages.data(), device_pages_list.size(), cudaMemcpyHostToDevice));
  device_buffer checksum(sizeof(unsigned long long));

  gpu_assisted loader{default_load_config};
  unsigned long long const expected = 0x0101010101010101ull * (std::uint64_t(prefix_pages) * g.page_bytes() / 8);
  // Loads on `copy`, attention on `compute`, each layer's attention waiting for that layer only.
  auto load_and_attend = [&](cudaStream_t copy, cudaStream_t compute, char const* how) -> bool {
    STRATA_CUDA_TRY(cudaMemsetAsync(checksum.data(), 0, checksum.size(), compute));
    cuda_event start{true}, end{true};
    start.record(copy);
    transfer_handle const h =
        submit(loader, copy_plan{host.layout(), engine, std::span<page_pair const>{pages}, layer_range::all(g)}, copy);
    for (std::int64_t l = 0; l < g.layers; ++l) {
      wait_layer(h, l, compute);  // only this layer, not the whole load
      attention_stand_in<<<132, 256, 0, compute>>>(engine, reinterpret_cast<page_pair const*>(device_pages_list.data()),
                                                   int(prefix_pages), int(l),
                                                   reinterpret_cast<unsigned long long*>(checksum.data()));
    }
    end.record(compute);
    STRATA_CUDA_TRY(cudaEventSynchronize(end.get()));
    float ms = 0;
    STRATA_CUDA_TRY(cudaEventElapsedTime(&ms, start.get(), end.get()));
    unsigned long long sum = 0;
    STRATA_CUDA_TRY(cudaMemcpy(&sum, checksum.data(), sizeof sum, cudaMemcpyDeviceToHost));
    if (how == nullptr) { return sum == expected; }  // warm-up: kernels loaded, pages touched
    std::printf(
        "%s: loaded %lld pages (%lld MiB) and ran %lld layers of attention in %.2f ms (%.1f GB/s): checksum %s\n", how,
        (long long)prefix_pages, (long long)(prefix_pages * g.page_bytes()) >> 20, (long long)g.layers, ms,
        double(prefix_pages * g.page_bytes()) / (ms * 1e-3) / 1e9, sum == expected ? "ok" : "WRONG");
    return sum == expected;
  };

  // 1. Plain streams: the copy kernels hold 2 SMs; the engine sizes its GEMMs to the rest.
  std::printf("copy kernels hold %d SMs; size GEMMs with cublasSetSmCountTarget(handle, %d)\n", loader.config().ctas,
              sms_left_for_compute(loader.config()));
  cuda_stream copy_stream, compute_stream;
  bool ok = load_and_attend(copy_stream.get(), compute_stream.get(), nullptr);
  ok = load_and_attend(copy_stream.get(), compute_stream.get(), "streams") && ok;

  // 2. Green contexts: the copies confined to their own partition, every engine kernel to the rest.
  if (sm_partition::supported()) {
    sm_partition const partition{loader.config().ctas};
    std::printf(
        "green contexts: copy partition %d SMs, compute partition %d SMs (cublasSetSmCountTarget(handle, %d))\n",
        partition.copy_sms(), partition.compute_sms(), partition.compute_sms());
    ok = load_and_attend(partition.copy_stream(), partition.compute_stream(), "partition") && ok;
  } else {
    std::printf("green contexts: not offered by this driver\n");
  }
  return ok ? 0 : 1;
}
