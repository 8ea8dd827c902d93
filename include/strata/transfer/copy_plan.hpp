// SPDX-License-Identifier: Apache-2.0
/**
 * @file transfer/copy_plan.hpp
 * @brief What to move: (source page, destination page) pairs over a layer range between two layouts,
 *        its validation, and its decomposition into maximal contiguous byte runs.
 */
#pragma once

#include <strata/layout/layout.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

namespace strata {

/// @brief One page to move: `src` in the source layout to `dst` in the destination layout.
struct page_pair {
  std::int64_t src{};  ///< page id in the source layout
  std::int64_t dst{};  ///< page id in the destination layout

  /// @brief Field-wise equality.
  friend constexpr bool operator==(page_pair const&, page_pair const&) = default;
};

/// @brief The half-open range of layers `[begin, end)` a plan moves.
struct layer_range {
  std::int64_t begin{};  ///< first layer
  std::int64_t end{};    ///< one past the last layer

  /// @brief Layers in the range.
  [[nodiscard]] STRATA_HOST_DEVICE constexpr std::int64_t size() const noexcept { return end - begin; }
  /// @brief All layers of a geometry.
  [[nodiscard]] static constexpr layer_range all(kv_geometry const& g) noexcept { return {0, g.layers}; }
  /// @brief The single layer `layer`.
  [[nodiscard]] static constexpr layer_range one(std::int64_t layer) noexcept { return {layer, layer + 1}; }
};

/**
 * @brief A copy of `pages` over `layers` from `src` to `dst`.
 *
 * Non-owning: `pages` must outlive every use of the plan (for asynchronous backends, until the copy
 * completes). Sources may repeat; destinations may not.
 *
 * @tparam Src source layout
 * @tparam Dst destination layout
 */
template <kv_layout Src, kv_layout Dst>
struct copy_plan {
  using src_layout_type = Src;  ///< source layout type
  using dst_layout_type = Dst;  ///< destination layout type

  Src src;                           ///< where the pages are
  Dst dst;                           ///< where they go
  std::span<page_pair const> pages;  ///< which pages
  layer_range layers;                ///< which layers

  /// @brief Bytes the plan moves.
  [[nodiscard]] std::int64_t bytes() const noexcept
  {
    auto const& g = src.geometry();
    return static_cast<std::int64_t>(pages.size()) * layers.size() * g.planes * g.block_bytes();
  }
};

/// @brief Deduces the layouts: `copy_plan{src, dst, pages, layers}`.
template <kv_layout Src, kv_layout Dst>
copy_plan(Src, Dst, std::span<page_pair const>, layer_range) -> copy_plan<Src, Dst>;

/**
 * @brief Rejects a plan that cannot be executed exactly, before any byte moves.
 *
 * @throw strata::invalid_argument when the geometries differ, the layer range is empty or outside
 *        the geometry, the page list is empty, null, or longer than the destination pool, a page id
 *        is out of range on either side, or two pairs share a destination page.
 */
template <kv_layout Src, kv_layout Dst>
void validate(copy_plan<Src, Dst> const& plan)
{
  kv_geometry const gs = plan.src.geometry();
  kv_geometry const gd = plan.dst.geometry();
  STRATA_EXPECTS(gs == gd, "copy_plan: source geometry ", gs, " differs from destination geometry ", gd, " (",
                 Src::name, " -> ", Dst::name, ")");
  STRATA_EXPECTS(plan.layers.begin >= 0 && plan.layers.begin < plan.layers.end && plan.layers.end <= gs.layers,
                 "copy_plan: layer range [", plan.layers.begin, ", ", plan.layers.end, ") is empty or outside [0, ",
                 gs.layers, ")");
  STRATA_EXPECTS(!plan.pages.empty(), "copy_plan: no pages to copy");
  STRATA_EXPECTS(plan.pages.data() != nullptr, "copy_plan: page list is a null pointer");
  std::int64_t const n = static_cast<std::int64_t>(plan.pages.size());
  std::int64_t const src_pages = plan.src.num_pages();
  std::int64_t const dst_pages = plan.dst.num_pages();
  STRATA_EXPECTS(n <= dst_pages, "copy_plan: ", n, " pairs exceed the ", dst_pages, " pages of the destination");
  for (std::int64_t i = 0; i < n; ++i) {
    auto const [s, d] = plan.pages[i];
    STRATA_EXPECTS(s >= 0 && s < src_pages, "copy_plan: pair ", i, ": source page ", s, " out of range [0, ", src_pages,
                   ")");
    STRATA_EXPECTS(d >= 0 && d < dst_pages, "copy_plan: pair ", i, ": destination page ", d, " out of range [0, ",
                   dst_pages, ")");
  }
  // Duplicate destinations: a bitmap when the pool is not much larger than the plan, else a sort.
  if (dst_pages <= 64 * n + 4096) {
    std::vector<bool> seen(static_cast<std::size_t>(dst_pages));
    for (std::int64_t i = 0; i < n; ++i) {
      auto const d = static_cast<std::size_t>(plan.pages[i].dst);
      STRATA_EXPECTS(!seen[d], "copy_plan: destination page ", d, " appears more than once (pair ", i, ")");
      seen[d] = true;
    }
  } else {
    std::vector<std::int64_t> dsts(static_cast<std::size_t>(n));
    std::transform(plan.pages.begin(), plan.pages.end(), dsts.begin(), [](page_pair p) { return p.dst; });
    std::sort(dsts.begin(), dsts.end());
    auto const dup = std::adjacent_find(dsts.begin(), dsts.end());
    STRATA_EXPECTS(dup == dsts.end(), "copy_plan: destination page ", dup == dsts.end() ? 0 : *dup,
                   " appears more than once");
  }
}

/// @brief A contiguous run of bytes to copy.
struct copy_run {
  std::byte const* src{};  ///< first source byte
  std::byte* dst{};        ///< first destination byte
  std::int64_t bytes{};    ///< length
};

namespace detail {

/// @brief Accumulates runs, extending the pending one while both sides stay adjacent.
template <class F>
class run_merger {
 public:
  explicit run_merger(F& sink) : sink_{sink} {}
  void add(std::byte const* src, std::byte* dst, std::int64_t bytes)
  {
    if (pending_.bytes > 0 && pending_.src + pending_.bytes == src && pending_.dst + pending_.bytes == dst) {
      pending_.bytes += bytes;
      return;
    }
    flush();
    pending_ = {src, dst, bytes};
  }
  void flush()
  {
    if (pending_.bytes > 0) { sink_(pending_); }
    pending_ = {};
  }

 private:
  F& sink_;
  copy_run pending_{};
};

/// @brief Splits one block pair into the fewest runs its two strides allow.
template <class Merger>
void add_block(Merger& m, kv_geometry const& g, block_ref s, block_ref d)
{
  if (s.contiguous(g) && d.contiguous(g)) {
    m.add(s.data, d.data, g.block_bytes());
  } else if (s.token_stride == g.head_bytes() && d.token_stride == g.head_bytes()) {
    for (std::int64_t h = 0; h < g.kv_heads; ++h) {  // both head-major: one run per head
      m.add(s.data + h * s.head_stride, d.data + h * d.head_stride, g.page_tokens * g.head_bytes());
    }
  } else {
    for (std::int64_t t = 0; t < g.page_tokens; ++t) {  // a transpose: one run per head row
      for (std::int64_t h = 0; h < g.kv_heads; ++h) {
        m.add(s.data + t * s.token_stride + h * s.head_stride, d.data + t * d.token_stride + h * d.head_stride,
              g.head_bytes());
      }
    }
  }
}

/// @brief `count` runs of `bytes`, the i-th from `src + i * src_step` to `dst + i * dst_step`.
template <class Address>
struct strided_run {
  Address src{}, dst{};
  std::size_t bytes{}, src_step{}, dst_step{}, count{};
};

/**
 * @brief The runs (in order) as strided runs: a run joins the previous one's group while it has
 *        the same length and continues both sides' fixed strides (each at least the length, so
 *        rows never overlap). Every run is in exactly one group, in its order.
 * @param starts ascending indices of runs that begin a group whatever their addresses (the first
 *        run of each (layer, plane) block: a group's rows then lie in one tensor on each side, never
 *        across two allocations that merely happen to lie in order)
 */
template <class Address>
std::vector<strided_run<Address>> strided_runs(std::span<Address const> srcs, std::span<Address const> dsts,
                                               std::span<std::size_t const> sizes,
                                               std::span<std::size_t const> starts = {})
{
  std::vector<strided_run<Address>> out;
  auto next_start = starts.begin();
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    while (next_start != starts.end() && *next_start < i) {
      ++next_start;
    }
    if (!out.empty() && (next_start == starts.end() || *next_start != i)) {
      auto& g = out.back();
      if (g.bytes == sizes[i]) {
        if (g.count == 1 && srcs[i] >= g.src + g.bytes && dsts[i] >= g.dst + g.bytes) {
          g.src_step = srcs[i] - g.src;
          g.dst_step = dsts[i] - g.dst;
          g.count = 2;
          continue;
        }
        if (g.count > 1 && srcs[i] == g.src + g.count * g.src_step && dsts[i] == g.dst + g.count * g.dst_step) {
          ++g.count;
          continue;
        }
      }
    }
    out.push_back(strided_run<Address>{srcs[i], dsts[i], sizes[i], 0, 0, 1});
  }
  return out;
}

}  // namespace detail

namespace detail {

/// @brief What `for_each_run_in` calls at each block when the caller asks for nothing.
struct no_block_starts {
  void operator()() const noexcept {}
};

/// @brief `for_each_run` in a chosen order: page by page (`page_major`: each page's layers and
///        planes), or layer by layer (each (layer, plane) over the pages). Layer by layer, a given
///        `block_start` is called before each (layer, plane)'s first run, and no run spans two of them.
template <kv_layout Src, kv_layout Dst, class Sink, class BlockStart = no_block_starts>
void for_each_run_in(copy_plan<Src, Dst> const& plan, bool page_major, Sink&& sink, BlockStart&& block_start = {})
{
  kv_geometry const g = plan.src.geometry();
  run_merger merger{sink};
  if (page_major) {
    for (page_pair const p : plan.pages) {
      for (std::int64_t l = plan.layers.begin; l < plan.layers.end; ++l) {
        for (std::int64_t k = 0; k < g.planes; ++k) {
          add_block(merger, g, plan.src.block(p.src, l, k), plan.dst.block(p.dst, l, k));
        }
      }
    }
  } else {
    for (std::int64_t l = plan.layers.begin; l < plan.layers.end; ++l) {
      for (std::int64_t k = 0; k < g.planes; ++k) {
        if constexpr (!std::is_same_v<std::remove_cvref_t<BlockStart>, no_block_starts>) {
          merger.flush();
          block_start();
        }
        for (page_pair const p : plan.pages) {
          add_block(merger, g, plan.src.block(p.src, l, k), plan.dst.block(p.dst, l, k));
        }
      }
    }
  }
  merger.flush();
}

}  // namespace detail

/**
 * @brief Calls `sink(copy_run)` for each maximal contiguous run of a validated plan.
 *
 * Blocks are visited in the destination's memory order, and a run is
 * extended while both its source and destination continue, so adjacent pages of page-first records
 * or of one layer's tensor merge into one run. Together the runs write every destination byte of
 * the plan exactly once.
 *
 * @param plan a plan that `validate` accepted
 * @param sink called once per run, in order
 */
template <kv_layout Src, kv_layout Dst, class Sink>
void for_each_run(copy_plan<Src, Dst> const& plan, Sink&& sink)
{ detail::for_each_run_in(plan, Dst::order == layout_order::page_major, sink); }

}  // namespace strata
