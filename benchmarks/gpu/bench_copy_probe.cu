// SPDX-License-Identifier: Apache-2.0
// Probe: which load instruction lets an SM copy kernel read pinned host memory fastest?
//
// The library's kernel is a warp per block with 8 16-byte loads in flight per thread. This program
// runs the same loop with different load flavours and launch shapes on raw block lists (no layout
// arithmetic), host -> device, 1 GiB in 64 KiB blocks: contiguous, and scattered to random device
// blocks. Each figure is a median of 5, with the ratio to one contiguous cudaMemcpyAsync measured
// in the same run. It decides the flavour `copy_blocks_kernel` uses; see docs/benchmarks.md.
#include "gpu_bench.cuh"

#include <cstring>
#include <numeric>
#include <random>

using namespace strata;

namespace {

template <int V>
__device__ __forceinline__ uint4 load(uint4 const* p)
{
  uint4 r;
  if constexpr (V == 0) {
    r = __ldcs(p);
  } else if constexpr (V == 1) {
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
  } else if constexpr (V == 2) {
    asm("ld.global.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  } else if constexpr (V == 3) {
    asm("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
  } else if constexpr (V == 4) {
    r = *p;
  } else {
    r = __ldg(p);
  }
  return r;
}

char const* const names[] = {"__ldcs (evict-first)",
                             "ld.nc.L1::no_allocate.L2::256B",
                             "ld.L2::256B",
                             "ld.nc.L1::no_allocate.L2::128B",
                             "plain ld",
                             "__ldg"};

template <int V, int Unroll>
__global__ void __launch_bounds__(1024) probe(std::byte* const* src, std::byte* const* dst, int blocks, int vectors)
{
  int const lane = threadIdx.x & 31;
  int const warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  int const warps = (gridDim.x * blockDim.x) >> 5;
  for (int b = warp; b < blocks; b += warps) {
    auto const* s = reinterpret_cast<uint4 const*>(src[b]);
    auto* d = reinterpret_cast<uint4*>(dst[b]);
    for (int i = lane; i < vectors; i += Unroll * 32) {
      uint4 v[Unroll];
#pragma unroll
      for (int k = 0; k < Unroll; ++k) {
        if (i + k * 32 < vectors) { v[k] = load<V>(s + i + k * 32); }
      }
#pragma unroll
      for (int k = 0; k < Unroll; ++k) {
        if (i + k * 32 < vectors) { __stcs(d + i + k * 32, v[k]); }
      }
    }
  }
}

template <int V, int Unroll>
double run(int ctas, int threads, std::byte* const* src, std::byte* const* dst, int blocks, int vectors,
           std::size_t bytes, cudaStream_t s)
{
  cuda_event a{true}, b{true};
  std::vector<double> v;
  for (int r = -1; r < 5; ++r) {
    a.record(s);
    probe<V, Unroll><<<ctas, threads, 0, s>>>(src, dst, blocks, vectors);
    STRATA_CUDA_TRY(cudaGetLastError());
    b.record(s);
    STRATA_CUDA_TRY(cudaEventSynchronize(b.get()));
    if (r >= 0) { v.push_back(double(bytes) / (bench::elapsed_ms(a.get(), b.get()) * 1e-3) / 1e9); }
  }
  return bench::median(v);
}

}  // namespace

int main()
{
  std::size_t const block = 64 << 10, bytes = std::size_t{1} << 30;
  int const blocks = int(bytes / block);
  pinned_buffer host(bytes);
  device_buffer dev(2 * bytes);
  std::memset(host.data(), 7, bytes);
  cuda_stream stream;
  cuda_event a{true}, b{true};
  std::vector<double> ref;
  for (int r = -1; r < 5; ++r) {
    a.record(stream.get());
    STRATA_CUDA_TRY(cudaMemcpyAsync(dev.data(), host.data(), bytes, cudaMemcpyHostToDevice, stream.get()));
    b.record(stream.get());
    STRATA_CUDA_TRY(cudaEventSynchronize(b.get()));
    if (r >= 0) { ref.push_back(double(bytes) / (bench::elapsed_ms(a.get(), b.get()) * 1e-3) / 1e9); }
  }
  double const contiguous = bench::median(ref);
  std::printf("# copy probe: 1 GiB in 64 KiB blocks, host -> device; contiguous cudaMemcpyAsync %.1f GB/s\n",
              contiguous);
  std::printf("| load | CTAs x threads | unroll | contiguous blocks GB/s | ratio | scattered blocks GB/s | ratio |\n");
  std::printf("|---|---|---|---|---|---|---|\n");

  auto const nb = static_cast<std::size_t>(blocks);
  std::vector<std::byte*> src(nb), straight(nb), scattered(nb);
  std::vector<int> perm(2 * nb);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937{1});
  for (int i = 0; i < blocks; ++i) {
    src[std::size_t(i)] = host.data() + std::size_t(i) * block;
    straight[std::size_t(i)] = dev.data() + std::size_t(i) * block;
    scattered[std::size_t(i)] = dev.data() + std::size_t(perm[std::size_t(i)]) * block;
  }
  device_buffer lists(3 * std::size_t(blocks) * sizeof(std::byte*));
  auto* d_src = reinterpret_cast<std::byte**>(lists.data());
  auto* d_straight = d_src + blocks;
  auto* d_scattered = d_straight + blocks;
  cudaMemcpy(d_src, src.data(), src.size() * sizeof(std::byte*), cudaMemcpyHostToDevice);
  cudaMemcpy(d_straight, straight.data(), src.size() * sizeof(std::byte*), cudaMemcpyHostToDevice);
  cudaMemcpy(d_scattered, scattered.data(), src.size() * sizeof(std::byte*), cudaMemcpyHostToDevice);
  int const vectors = int(block / 16);

  auto line = [&](auto variant, auto unroll, int ctas, int threads) {
    constexpr int V = decltype(variant)::value, U = decltype(unroll)::value;
    double const c = run<V, U>(ctas, threads, d_src, d_straight, blocks, vectors, bytes, stream.get());
    double const s = run<V, U>(ctas, threads, d_src, d_scattered, blocks, vectors, bytes, stream.get());
    std::printf("| %s | %d x %d | %d | %.1f | %.3f | %.1f | %.3f |\n", names[V], ctas, threads, U, c, c / contiguous, s,
                s / contiguous);
  };
  using i0 = std::integral_constant<int, 0>;
  using i1 = std::integral_constant<int, 1>;
  using i2 = std::integral_constant<int, 2>;
  using i3 = std::integral_constant<int, 3>;
  using i4 = std::integral_constant<int, 4>;
  using i5 = std::integral_constant<int, 5>;
  using u4 = std::integral_constant<int, 4>;
  using u8 = std::integral_constant<int, 8>;
  using u16 = std::integral_constant<int, 16>;
  line(i0{}, u8{}, 2, 1024);
  line(i1{}, u8{}, 2, 1024);
  line(i2{}, u8{}, 2, 1024);
  line(i3{}, u8{}, 2, 1024);
  line(i4{}, u8{}, 2, 1024);
  line(i5{}, u8{}, 2, 1024);
  line(i0{}, u16{}, 2, 1024);
  line(i1{}, u16{}, 2, 1024);
  line(i0{}, u4{}, 2, 1024);
  line(i0{}, u8{}, 2, 512);
  line(i0{}, u8{}, 3, 1024);
  line(i1{}, u8{}, 3, 1024);
  line(i0{}, u8{}, 8, 256);
  line(i1{}, u8{}, 1, 1024);
  line(i0{}, u8{}, 1, 1024);
  return 0;
}
