// SPDX-License-Identifier: Apache-2.0
// An engine's loop around strata::cache_controller on the GPU: the CPU example (engine_loop.cpp)
// with the KV pool in device memory, pages moved by gpu_executor, and the "model" as kernels.
//
// The model writes deterministic KV: every word of page p of a prompt is a function of the tokens
// up to the page's end, its layer, plane and position. Documents get several questions each; the
// device pool holds about two documents, so prefixes are evicted to the pinned host tier and loaded
// back layer by layer. Before each layer the compute stream waits for that layer's loads
// (`strata::wait_layer`), then a kernel checks every cached page of the batch for that layer on the
// device, right where attention would read it: a missing wait reads pages that have not landed.
//
//   engine_loop_gpu          (exits 77 without a CUDA device)
#include <strata/cache/gpu_policies.cuh>
#include <strata/cuda.cuh>
#include <strata/layout/layer_first.hpp>

#include <cstdio>
#include <map>
#include <random>
#include <vector>

namespace {

using namespace strata;
using tokens_t = std::vector<std::int32_t>;
using controller = cache_controller<gpu_policies<layer_first>>;

/// 8 layers, 16-token pages, 2 KV heads of 64 bf16 elements, K and V: 4 KiB blocks, 64 KiB pages.
constexpr kv_geometry geo{8, 16, 2, 64, 2, 2};

__host__ __device__ std::uint64_t mix(std::uint64_t x)
{
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
/// What page `p` of `tokens` holds depends on every token up to the page's end.
std::uint64_t page_key(tokens_t const& tokens, std::int64_t p)
{
  std::uint64_t h = 0x9e3779b97f4a7c15ull;
  for (std::int64_t i = 0; i < (p + 1) * geo.page_tokens; ++i) {
    h = mix(h ^ std::uint64_t(std::uint32_t(tokens[std::size_t(i)])));
  }
  return h;
}
__host__ __device__ std::uint64_t word(std::uint64_t key, std::int64_t layer, std::int64_t plane, std::int64_t w)
{ return mix(key + std::uint64_t(((layer * 2 + plane) << 20) + w) * 0x9e3779b97f4a7c15ull); }

/// A page of the pool and the content key it must hold.
struct keyed_page {
  std::int64_t page;
  std::uint64_t key;
};

/// The "model": one layer of the batch's computed pages.
__global__ void compute_layer(layer_first pool, keyed_page const* pages, int n, int layer)
{
  std::int64_t const words = geo.block_bytes() / 8;
  for (int i = blockIdx.x; i < n; i += gridDim.x) {
    for (int plane = 0; plane < geo.planes; ++plane) {
      auto* b = reinterpret_cast<std::uint64_t*>(pool.block(pages[i].page, layer, plane).data);
      for (std::int64_t w = threadIdx.x; w < words; w += blockDim.x) {
        b[w] = word(pages[i].key, layer, plane, w);
      }
    }
  }
}
/// Where attention would read: one layer of the batch's cached pages, counted when wrong.
__global__ void check_layer(layer_first pool, keyed_page const* pages, int n, int layer, unsigned long long* bad)
{
  std::int64_t const words = geo.block_bytes() / 8;
  for (int i = blockIdx.x; i < n; i += gridDim.x) {
    for (int plane = 0; plane < geo.planes; ++plane) {
      auto const* b = reinterpret_cast<std::uint64_t const*>(pool.block(pages[i].page, layer, plane).data);
      for (std::int64_t w = threadIdx.x; w < words; w += blockDim.x) {
        if (b[w] != word(pages[i].key, layer, plane, w)) { atomicAdd(bad, 1ull); }
      }
    }
  }
}

/// Pages with their keys, uploaded for the kernels of one batch.
struct keyed_pages {
  std::vector<keyed_page> host;
  device_buffer device{1};
  void upload(cudaStream_t s)
  {
    if (host.empty()) { return; }
    if (device.size() < host.size() * sizeof(keyed_page)) { device = device_buffer{host.size() * sizeof(keyed_page)}; }
    STRATA_CUDA_TRY(
        cudaMemcpyAsync(device.data(), host.data(), host.size() * sizeof(keyed_page), cudaMemcpyHostToDevice, s));
  }
  [[nodiscard]] keyed_page const* data() const { return reinterpret_cast<keyed_page const*>(device.data()); }
  [[nodiscard]] int size() const { return int(host.size()); }
};

}  // namespace

int main()
{
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("engine_loop_gpu: no CUDA device (skipped)\n");
    return 77;
  }
  int const documents = 3, questions = 3;
  std::int64_t const doc_tokens = 2048;
  std::int64_t const device_pages = 2 * doc_tokens / geo.page_tokens + 64;  // about two documents
  std::int64_t const host_pages = 8 * doc_tokens / geo.page_tokens;

  // The engine's KV pool in device memory, the controller over it and a pinned host tier.
  device_buffer memory{std::size_t(device_pages * geo.page_bytes())};
  layer_first const pool{memory.data(), geo, device_pages};
  controller cache{pool, host_pages};
  cuda_stream stream;  // the engine's compute stream
  device_buffer bad{sizeof(unsigned long long)};
  STRATA_CUDA_TRY(cudaMemsetAsync(bad.data(), 0, bad.size(), stream.get()));

  std::mt19937_64 rng{42};
  std::vector<tokens_t> docs(documents, tokens_t(std::size_t(doc_tokens)));
  for (auto& d : docs) {
    for (auto& t : d) {
      t = std::int32_t(rng() % 30000);
    }
  }
  std::map<std::uint64_t, tokens_t> prompts;  // live requests
  std::uint64_t next_id = 1;
  std::int64_t served = 0, checked = 0;
  for (int q = 0; q < questions; ++q) {
    for (int d = 0; d < documents; ++d) {  // a question on every document
      tokens_t prompt = docs[std::size_t(d)];
      for (int i = 0; i < 40 + int(rng() % 60); ++i) {
        prompt.push_back(std::int32_t(30000 + rng() % 1000));
      }
      std::uint64_t const id = next_id++;
      cache.submit({request_id{id}, prompt, 0, 16}, stream.get());
      prompts.emplace(id, std::move(prompt));
    }
    while (!prompts.empty()) {
      // One batch: the plan, its loads, then layer by layer the check of what was cached and the model.
      batch_plan const plan = cache.schedule({4096});
      auto loads = cache.begin_loads(plan, stream.get());
      keyed_pages cached, computed;
      for (auto const& s : loads.started) {
        auto const& prompt = prompts.at(s.id.value);
        auto const table = cache.page_table(s.id);
        std::int64_t n = 0;
        for (auto c : s.cached_pages) {
          n += c;
        }
        for (std::int64_t p = 0; p < n; ++p) {
          cached.host.push_back({table[std::size_t(p)], page_key(prompt, p)});
        }
      }
      for (auto const& it : loads.ran) {
        auto const& prompt = prompts.at(it.id.value);
        auto const table = cache.page_table(it.id);
        for (std::int64_t p = it.context_tokens / geo.page_tokens;
             p < (it.context_tokens + it.chunk_tokens) / geo.page_tokens; ++p) {
          computed.host.push_back({table[std::size_t(p)], page_key(prompt, p)});
        }
      }
      cached.upload(stream.get());
      computed.upload(stream.get());
      for (std::int64_t layer = 0; layer < geo.layers; ++layer) {
        if (!wait_layer(loads, layer, stream.get())) { break; }  // a failed load: complete() sends them back
        if (cached.size() > 0) {
          check_layer<<<64, 256, 0, stream.get()>>>(pool, cached.data(), cached.size(), int(layer),
                                                    reinterpret_cast<unsigned long long*>(bad.data()));
        }
        if (computed.size() > 0) {
          compute_layer<<<64, 256, 0, stream.get()>>>(pool, computed.data(), computed.size(), int(layer));
        }
      }
      STRATA_CUDA_TRY(cudaStreamSynchronize(stream.get()));  // the batch's uploads are reused next round
      (void)cache.complete(loads);
      checked += cached.size();
      for (auto const& it : loads.ran) {
        if (!it.last_chunk || !cache.prefilled(it.id)) { continue; }  // false: a failed load sent it back
        // Backups start after the compute on `stream`; decode reads the table only once the loads
        // still filling pages it shares with another batch landed (false: they failed, the pages
        // hold garbage: release the request and submit it again).
        bool const ok = wait_after(cache.finish_prefill(it.id, stream.get()), stream.get());
        cache.release(it.id, {}, stream.get());  // (decode would run here)
        if (!ok) {
          cache.submit({it.id, prompts.at(it.id.value), 0, 16}, stream.get());
          continue;
        }
        prompts.erase(it.id.value);
        ++served;
      }
      (void)cache.poll(stream.get());
    }
  }
  STRATA_CUDA_TRY(cudaStreamSynchronize(stream.get()));
  unsigned long long wrong = 0;
  STRATA_CUDA_TRY(cudaMemcpy(&wrong, bad.data(), sizeof wrong, cudaMemcpyDeviceToHost));
  cache_stats const s = cache.stats();
  std::printf("hit tokens: device %lld, host %lld; computed %lld; evicted pages: device %lld\n",
              (long long)s.hit_tokens[0], (long long)s.hit_tokens[1], (long long)s.computed_tokens,
              (long long)s.evicted_pages[0]);
  cache.check_invariants();
  if (wrong != 0 || s.hit_tokens[1] == 0 || served != documents * questions) {
    std::printf("engine_loop_gpu: FAILED (%lld of %d served, %llu wrong KV words, %lld host hit tokens)\n",
                (long long)served, documents * questions, wrong, (long long)s.hit_tokens[1]);
    return 1;
  }
  std::printf(
      "engine_loop_gpu: all %lld requests served, %lld cached pages checked on the device, every KV byte right\n",
      (long long)served, (long long)checked);
  return 0;
}
