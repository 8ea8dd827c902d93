// SPDX-License-Identifier: Apache-2.0
/**
 * @file transfer/detail/copy_kernel.cuh
 * @brief The SM copy kernel behind `gpu_assisted` and `staged`: a warp per block, 16-byte vectors,
 *        several loads in flight per thread, streaming cache hints.
 */
#pragma once

#include <strata/transfer/copy_plan.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::detail {

/// @brief 16-byte loads each thread issues before their stores (8: 128 bytes in flight per thread).
inline constexpr int copy_unroll = 8;

/**
 * @brief How a block pair splits into segments both sides hold contiguously. Segment j is at
 *        `(j / inner) * outer_stride + (j % inner) * inner_stride` on each side; the same for every
 *        block of a layout pair, so it is computed once per launch on the host.
 */
struct segment_shape {
  std::int64_t segments{};   ///< segments per block
  std::int64_t inner{};      ///< segments per outer step
  std::int64_t vectors{};    ///< 16-byte vectors per segment
  std::int64_t src_outer{};  ///< source byte stride per outer step
  std::int64_t src_inner{};  ///< source byte stride per inner step
  std::int64_t dst_outer{};  ///< destination byte stride per outer step
  std::int64_t dst_inner{};  ///< destination byte stride per inner step
  int group{};               ///< lanes per segment: a power of two, at most 32
};

inline int lanes_for(std::int64_t vectors)
{
  int g = 1;
  while (g < 32 && 2 * g <= vectors) {
    g *= 2;
  }
  return g;
}

/// @brief The fewest segments a block pair allows: one run, one run per head, or head rows.
inline segment_shape make_segment_shape(kv_geometry const& g, block_ref s, block_ref d)
{
  std::int64_t const hb = g.head_bytes();
  if (s.contiguous(g) && d.contiguous(g)) { return {1, 1, g.block_bytes() / 16, 0, 0, 0, 0, 32}; }
  if (s.token_stride == hb && d.token_stride == hb) {  // both head-major: a run per head
    std::int64_t const v = g.page_tokens * hb / 16;
    return {g.kv_heads, 1, v, s.head_stride, 0, d.head_stride, 0, lanes_for(v)};
  }
  return {g.page_tokens * g.kv_heads, g.kv_heads, hb / 16, s.token_stride, s.head_stride, d.token_stride, d.head_stride,
          lanes_for(hb / 16)};
}

/// @brief Copies `n` vectors with `stride` cooperating lanes, `copy_unroll` loads in flight per lane.
__device__ __forceinline__ void copy_vectors(uint4 const* __restrict__ src, uint4* __restrict__ dst, std::int64_t n,
                                             int lane, int stride)
{
  std::int64_t i = lane;
  for (; i + (copy_unroll - 1) * stride < n; i += copy_unroll * stride) {
    uint4 v[copy_unroll];
#pragma unroll
    for (int k = 0; k < copy_unroll; ++k) {
      v[k] = __ldcs(src + i + k * stride);
    }
#pragma unroll
    for (int k = 0; k < copy_unroll; ++k) {
      __stcs(dst + i + k * stride, v[k]);
    }
  }
  for (; i < n; i += stride) {
    __stcs(dst + i, __ldcs(src + i));
  }
}

/**
 * @brief Copies `n_pairs` pages over layers `[layer0, layer0 + n_layers)` and every plane.
 *
 * Units (pair, layer, plane) go to warps round-robin, pairs fastest, so that one layer's blocks
 * are in flight together. Addresses are computed once per unit and once per segment, never per
 * vector.
 */
template <class Src, class Dst>
__global__ void __launch_bounds__(1024)
    copy_blocks_kernel(Src src, Dst dst, page_pair const* __restrict__ pairs, std::int64_t n_pairs, std::int64_t layer0,
                       std::int64_t n_layers, segment_shape shape)
{
  int const lane = static_cast<int>(threadIdx.x & 31u);
  std::int64_t const warp = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  std::int64_t const warps = (static_cast<std::int64_t>(gridDim.x) * blockDim.x) >> 5;
  std::int64_t const planes = src.geometry().planes;
  std::int64_t const units = n_pairs * n_layers * planes;
  int const groups = 32 / shape.group;
  int const group = lane / shape.group;
  int const group_lane = lane % shape.group;
  for (std::int64_t u = warp; u < units; u += warps) {
    std::int64_t const i = u % n_pairs;
    std::int64_t const rest = u / n_pairs;
    std::int64_t const plane = rest % planes;
    std::int64_t const layer = layer0 + rest / planes;
    page_pair const p = pairs[i];
    block_ref const s = src.block(p.src, layer, plane);
    block_ref const d = dst.block(p.dst, layer, plane);
    for (std::int64_t seg = group; seg < shape.segments; seg += groups) {
      std::int64_t const o = seg / shape.inner;
      std::int64_t const in = seg - o * shape.inner;
      auto const* sv = reinterpret_cast<uint4 const*>(s.data + o * shape.src_outer + in * shape.src_inner);
      auto* dv = reinterpret_cast<uint4*>(d.data + o * shape.dst_outer + in * shape.dst_inner);
      copy_vectors(sv, dv, shape.vectors, group_lane, shape.group);
    }
  }
}

}  // namespace strata::detail
