// SPDX-License-Identifier: Apache-2.0
/**
 * @file transfer/detail/kernel_checks.cuh
 * @brief What every backend that launches the copy kernel checks before any byte moves: 16-byte
 *        alignment, segments of whole 16-byte vectors with the same shape on every layer and plane,
 *        and memory the device can dereference.
 */
#pragma once

#include <strata/transfer/copy_plan.hpp>
#include <strata/transfer/detail/copy_kernel.cuh>

#include <strata/cuda.cuh>

#include <cuda.h>  // types only: the driver entry point is resolved at run time, not linked
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace strata::detail {

/// @brief Bytes of one segment of `make_segment_shape(g, s, d)` (the kernel moves `bytes / 16` vectors).
inline std::int64_t segment_bytes(kv_geometry const& g, block_ref s, block_ref d)
{
  std::int64_t const hb = g.head_bytes();
  if (s.contiguous(g) && d.contiguous(g)) { return g.block_bytes(); }
  if (s.token_stride == hb && d.token_stride == hb) { return g.page_tokens * hb; }
  return hb;
}

/**
 * @brief Remembers address ranges already found device-accessible, so that the check costs one
 *        `cudaPointerGetAttributes` per allocation, not per launch. Device memory must be the
 *        current device's (where the kernel runs).
 *
 * A range stays trusted for the cache's lifetime: memory freed and mapped again as pageable at the
 * same address is not detected (the check is a guard against handing the wrong kind of memory,
 * not against use after free).
 */
class access_cache {
 public:
  /**
   * @brief Throws `strata::invalid_argument` unless a kernel may dereference `p`: device (or
   *        managed) memory, or pinned host memory mapped at the same device address.
   */
  void check(std::byte const* p, char const* backend, char const* layout, std::int64_t layer, std::int64_t plane)
  {
    auto const a = reinterpret_cast<std::uintptr_t>(p);
    auto it = std::upper_bound(
        ranges_.begin(), ranges_.end(), a,
        [](std::uintptr_t x, std::pair<std::uintptr_t, std::uintptr_t> const& r) { return x < r.first; });
    if (it != ranges_.begin() && a < std::prev(it)->second) { return; }
    ++queries_;
    cudaPointerAttributes attr{};
    cudaError_t const e = cudaPointerGetAttributes(&attr, p);
    if (e != cudaSuccess) { (void)cudaGetLastError(); }
    bool const device = e == cudaSuccess && (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged);
    bool const mapped = e == cudaSuccess && attr.type == cudaMemoryTypeHost && attr.devicePointer == p;
    if (e == cudaSuccess && attr.type == cudaMemoryTypeDevice) {
      int const current = current_device();
      STRATA_EXPECTS(attr.device == current, backend, ": layer ", layer, " plane ", plane, " of the ", layout,
                     " layout is in the memory of device ", attr.device, "; the copy runs on device ", current);
    }
    STRATA_EXPECTS(device || mapped, backend, ": layer ", layer, " plane ", plane, " of the ", layout, " layout is at ",
                   static_cast<void const*>(p),
                   e != cudaSuccess || attr.type == cudaMemoryTypeUnregistered
                       ? ", pageable host memory the device cannot read: allocate it with cudaHostAlloc or pin it "
                         "with cudaHostRegister(..., cudaHostRegisterMapped)"
                       : ", pinned host memory whose device address differs from its host address");
    remember(a);
  }

  /// @brief Driver queries made so far (for tests: one per allocation, not one per check).
  [[nodiscard]] std::int64_t queries() const noexcept { return queries_; }

 private:
  using range_fn = PFN_cuPointerGetAttribute_v4000;
  static range_fn range_query()
  {
    static range_fn const fn = reinterpret_cast<range_fn>(driver_entry_point("cuPointerGetAttribute", 4000));
    return fn;
  }
  // The allocation around `a` (just `a` where the driver does not say).
  void remember(std::uintptr_t a)
  {
    std::uintptr_t begin = a, end = a + 1;
    if (auto const fn = range_query(); fn != nullptr) {
      CUdeviceptr start{};
      std::size_t size{};
      if (fn(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, static_cast<CUdeviceptr>(a)) == CUDA_SUCCESS &&
          fn(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, static_cast<CUdeviceptr>(a)) == CUDA_SUCCESS &&
          static_cast<std::uintptr_t>(start) <= a && a < static_cast<std::uintptr_t>(start) + size) {
        begin = static_cast<std::uintptr_t>(start);
        end = begin + size;
      }
    }
    if (ranges_.size() >= max_ranges) { ranges_.clear(); }
    auto const at = std::lower_bound(ranges_.begin(), ranges_.end(), std::pair{begin, end});
    ranges_.insert(at, {begin, end});
  }

  static constexpr std::size_t max_ranges = 4096;
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges_;  // sorted, disjoint allocations
  std::int64_t queries_{};
};

/**
 * @brief Checks that the copy kernel can move `src` to `dst` for pages like `first` over `layers`,
 *        and returns the segment shape to launch with. Walks `block(first, layer, plane)` for every
 *        layer and plane (a layout's pointer tables hold one base per layer and plane; other pages
 *        are whole multiples of 16 bytes away).
 *
 * @param access where to remember device-accessible memory; null: accessibility is not checked
 * @throw strata::invalid_argument, before any byte moves, when a block is not 16-byte aligned, a
 *        segment (a block, a head's tokens, or a head row, whichever both layouts hold contiguously)
 *        is not a whole number of 16-byte vectors or its strides are not, the segment shape differs
 *        between layers or planes, or a block lies in memory the device cannot dereference
 */
template <kv_layout Src, kv_layout Dst>
segment_shape check_kernel_copy(Src const& src, Dst const& dst, page_pair first, layer_range layers,
                                char const* backend, access_cache* access)
{
  kv_geometry const g = src.geometry();
  segment_shape shape{};
  for (std::int64_t l = layers.begin; l < layers.end; ++l) {
    for (std::int64_t k = 0; k < g.planes; ++k) {
      block_ref const s = src.block(first.src, l, k);
      block_ref const d = dst.block(first.dst, l, k);
      auto const sa = reinterpret_cast<std::uintptr_t>(s.data);
      auto const da = reinterpret_cast<std::uintptr_t>(d.data);
      STRATA_EXPECTS(sa % 16 == 0 && da % 16 == 0, backend, ": layer ", l, " plane ", k,
                     " is not 16-byte aligned in the ", sa % 16 != 0 ? Src::name : Dst::name, " layout");
      segment_shape const here = make_segment_shape(g, s, d);
      if (l == layers.begin && k == 0) {
        std::int64_t const bytes = segment_bytes(g, s, d);
        bool const strides_ok = here.src_outer % 16 == 0 && here.src_inner % 16 == 0 && here.dst_outer % 16 == 0 &&
                                here.dst_inner % 16 == 0;
        STRATA_EXPECTS(bytes % 16 == 0 && strides_ok, backend, ": between the ", Src::name, " and ", Dst::name,
                       " layouts a block moves as segments of ", bytes, " bytes (head rows of ", g.head_bytes(),
                       " bytes, ", g.kv_heads, " heads, ", g.page_tokens,
                       " tokens per page) at strides that must all be multiples of 16 bytes: the copy kernel "
                       "moves 16-byte vectors (use a DMA backend)");
        shape = here;
      } else {
        bool const same = here.segments == shape.segments && here.inner == shape.inner &&
                          here.vectors == shape.vectors && here.src_outer == shape.src_outer &&
                          here.src_inner == shape.src_inner && here.dst_outer == shape.dst_outer &&
                          here.dst_inner == shape.dst_inner;
        STRATA_EXPECTS(same, backend, ": layer ", l, " plane ", k, " has other strides than layer ", layers.begin,
                       " plane 0 between the ", Src::name, " and ", Dst::name, " layouts");
      }
      if (access != nullptr) {
        access->check(s.data, backend, Src::name, l, k);
        access->check(d.data, backend, Dst::name, l, k);
      }
    }
  }
  return shape;
}

}  // namespace strata::detail
