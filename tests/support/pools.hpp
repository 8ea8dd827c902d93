// SPDX-License-Identifier: Apache-2.0
// Host pools of every layout kind over owned memory, and a row-by-row reference copy, for tests.
#pragma once

#include <strata/strata.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace strata::test {

/// The layouts the Foundation issue names; `mla` is a one-plane, one-head `layer_first_table`.
enum class layout_kind { layer_first, layer_first_table, page_first, page_first_chunked, vllm, hf, mla };
inline constexpr layout_kind all_layout_kinds[] = {layout_kind::layer_first, layout_kind::layer_first_table,
                                                   layout_kind::page_first,  layout_kind::page_first_chunked,
                                                   layout_kind::vllm,        layout_kind::hf,
                                                   layout_kind::mla};

inline char const* to_string(layout_kind k)
{
  switch (k) {
    case layout_kind::layer_first:
      return "layer_first";
    case layout_kind::layer_first_table:
      return "layer_first_table";
    case layout_kind::page_first:
      return "page_first";
    case layout_kind::page_first_chunked:
      return "page_first_chunked";
    case layout_kind::vllm:
      return "vllm";
    case layout_kind::hf:
      return "hf";
    case layout_kind::mla:
      return "mla";
  }
  return "?";
}

/// Whether a layout kind can describe a geometry at all.
inline bool supports(layout_kind k, kv_geometry const& g)
{
  if (k == layout_kind::mla) { return g.planes == 1 && g.kv_heads == 1; }
  if (k == layout_kind::hf) { return g.head_bytes() % 16 == 0; }
  return true;
}

/// Owned memory plus a layout over it. `storage` holds every byte the layout can address (and gaps
/// between tensors, which must never be written). `Storage` is `std::vector<std::byte>` for host
/// tests, or a device / pinned buffer for GPU tests: anything built from a byte count with `data()`
/// and `size()`.
template <class Layout, class Storage = std::vector<std::byte>>
struct pool {
  Storage storage;
  Layout layout;
};

/// Offsets of `count` tensors of `bytes` each in one buffer, in a shuffled order with gaps between
/// them, so that tests see tables whose entries are neither sorted nor adjacent. Returns the buffer size.
inline std::int64_t carve(std::int64_t count, std::int64_t bytes, std::uint64_t seed,
                          std::vector<std::int64_t>& offsets)
{
  constexpr std::int64_t gap = 64;
  std::vector<std::int64_t> slot(static_cast<std::size_t>(count));
  std::iota(slot.begin(), slot.end(), 0);
  std::mt19937_64 rng{seed};
  std::shuffle(slot.begin(), slot.end(), rng);
  offsets.clear();
  for (auto s : slot) {
    offsets.push_back(s * (bytes + gap));
  }
  return count * (bytes + gap);
}

/// Pages per sequence of an `hf` pool built from `seed`.
inline std::int64_t hf_pages_per_sequence(std::uint64_t seed) { return static_cast<std::int64_t>(seed % 4) + 1; }
/// Pages per chunk of a `page_first_chunked` pool built from `seed`.
inline std::int64_t pages_per_chunk(std::uint64_t seed) { return static_cast<std::int64_t>(seed / 4 % 3) + 1; }

/// Calls `f(pool<L, Storage>&)` with a pool of kind `k` holding at least `pages` pages. The same
/// (kind, geometry, pages, seed) always gives the same offsets, whatever the storage, so a device
/// pool and a host mirror built alike address corresponding bytes.
template <class Storage = std::vector<std::byte>, class F>
void with_pool(layout_kind k, kv_geometry const& g, std::int64_t pages, std::uint64_t seed, F&& f)
{
  std::vector<std::int64_t> off;
  auto pointers = [&](Storage& s) {
    std::vector<std::byte*> out;
    for (auto o : off) {
      out.push_back(s.data() + o);
    }
    return out;
  };
  switch (k) {
    case layout_kind::layer_first: {
      Storage s(static_cast<std::size_t>(pages * g.page_bytes()));
      layer_first const layout{s.data(), g, pages};
      pool<layer_first, Storage> p{std::move(s), layout};  // moving keeps the buffer
      f(p);
      return;
    }
    case layout_kind::page_first: {
      Storage s(static_cast<std::size_t>(pages * g.page_bytes()));
      page_first const layout{s.data(), g, pages};
      pool<page_first, Storage> p{std::move(s), layout};
      f(p);
      return;
    }
    case layout_kind::page_first_chunked: {
      std::int64_t const per = pages_per_chunk(seed);
      std::int64_t const chunks = (pages + per - 1) / per;
      Storage s(static_cast<std::size_t>(carve(chunks, per * g.page_bytes(), seed, off)));
      page_first_chunked const layout{pointers(s), g, per, pages};
      pool<page_first_chunked, Storage> p{std::move(s), layout};
      f(p);
      return;
    }
    case layout_kind::layer_first_table:
    case layout_kind::mla: {
      Storage s(static_cast<std::size_t>(carve(g.layers * g.planes, pages * g.block_bytes(), seed, off)));
      auto const t = pointers(s);
      auto layout = k == layout_kind::mla ? mla_layout(t, g, pages) : layer_first_table{t, g, pages};
      pool<layer_first_table, Storage> p{std::move(s), layout};
      f(p);
      return;
    }
    case layout_kind::vllm: {
      Storage s(static_cast<std::size_t>(carve(g.layers, g.planes * pages * g.block_bytes(), seed, off)));
      vllm_layout const layout{pointers(s), g, pages};
      pool<vllm_layout, Storage> p{std::move(s), layout};
      f(p);
      return;
    }
    case layout_kind::hf: {
      std::int64_t const per_seq = hf_pages_per_sequence(seed);
      std::int64_t const batch = (pages + per_seq - 1) / per_seq;
      std::int64_t const capacity = per_seq * g.page_tokens;
      Storage s(static_cast<std::size_t>(
          carve(g.layers * g.planes, batch * g.kv_heads * capacity * g.head_bytes(), seed, off)));
      auto const t = pointers(s);
      std::vector<std::byte*> keys, values;
      for (std::int64_t l = 0; l < g.layers; ++l) {
        keys.push_back(t[static_cast<std::size_t>(l * g.planes)]);
        if (g.planes == 2) { values.push_back(t[static_cast<std::size_t>(l * g.planes + 1)]); }
      }
      hf_layout const layout{keys, values, g, batch, capacity};
      pool<hf_layout, Storage> p{std::move(s), layout};
      f(p);
      return;
    }
  }
}

/// `with_pool` with a seed drawn from `rng`.
template <class Storage = std::vector<std::byte>, class F>
void with_pool(layout_kind k, kv_geometry const& g, std::int64_t pages, std::mt19937_64& rng, F&& f)
{ with_pool<Storage>(k, g, pages, static_cast<std::uint64_t>(rng()), std::forward<F>(f)); }

/// Fills bytes with random data.
inline void fill_random(std::vector<std::byte>& bytes, std::mt19937_64& rng)
{
  std::size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    auto const v = rng();
    std::memcpy(bytes.data() + i, &v, 8);
  }
  for (; i < bytes.size(); ++i) {
    bytes[i] = static_cast<std::byte>(rng());
  }
}

/// The poison pattern destinations start with: never produced by a correct copy of random data in
/// a way that would hide a missed write, since every check compares whole buffers.
inline constexpr std::byte poison{0xA5};
inline void fill_poison(std::vector<std::byte>& bytes) { std::fill(bytes.begin(), bytes.end(), poison); }

/// Calls `f(src_row, dst_row)` for every head row a plan moves, by plain addressing (no merging).
template <class S, class D, class F>
void for_each_row(copy_plan<S, D> const& plan, F&& f)
{
  kv_geometry const g = plan.src.geometry();
  for (page_pair const p : plan.pages) {
    for (std::int64_t l = plan.layers.begin; l < plan.layers.end; ++l) {
      for (std::int64_t k = 0; k < g.planes; ++k) {
        block_ref const s = plan.src.block(p.src, l, k);
        block_ref const d = plan.dst.block(p.dst, l, k);
        for (std::int64_t t = 0; t < g.page_tokens; ++t) {
          for (std::int64_t h = 0; h < g.kv_heads; ++h) {
            f(s.data + t * s.token_stride + h * s.head_stride, d.data + t * d.token_stride + h * d.head_stride);
          }
        }
      }
    }
  }
}

/// Row-by-row reference of what any backend must produce.
template <class S, class D>
void reference_copy(copy_plan<S, D> const& plan)
{
  auto const n = static_cast<std::size_t>(plan.src.geometry().head_bytes());
  for_each_row(plan, [n](std::byte const* s, std::byte* d) { std::memcpy(d, s, n); });
}

/// A random page map of `n` pairs: distinct destinations; sources distinct unless `repeat_sources`.
inline std::vector<page_pair> random_map(std::int64_t n, std::int64_t src_pages, std::int64_t dst_pages,
                                         std::mt19937_64& rng, bool repeat_sources = false)
{
  std::vector<std::int64_t> src(static_cast<std::size_t>(src_pages));
  std::vector<std::int64_t> dst(static_cast<std::size_t>(dst_pages));
  std::iota(src.begin(), src.end(), 0);
  std::iota(dst.begin(), dst.end(), 0);
  std::shuffle(src.begin(), src.end(), rng);
  std::shuffle(dst.begin(), dst.end(), rng);
  std::vector<page_pair> out;
  for (std::int64_t i = 0; i < n; ++i) {
    auto const s = repeat_sources ? std::uniform_int_distribution<std::int64_t>{0, src_pages - 1}(rng)
                                  : src[static_cast<std::size_t>(i)];
    out.push_back({s, dst[static_cast<std::size_t>(i)]});
  }
  return out;
}

/// `count` page pairs at random places of two `pages`-page pools, no source and no destination twice;
/// `ascending`: both the sources and the destinations in ascending order (a stretch of runs whose
/// addresses rise on both sides, each pair its own "stride").
inline std::vector<page_pair> scattered_pairs(std::int64_t pages, std::size_t count, std::mt19937_64& rng,
                                              bool ascending = false)
{
  std::vector<std::int64_t> src(static_cast<std::size_t>(pages)), dst(static_cast<std::size_t>(pages));
  std::iota(src.begin(), src.end(), 0);
  std::iota(dst.begin(), dst.end(), 0);
  std::shuffle(src.begin(), src.end(), rng);
  std::shuffle(dst.begin(), dst.end(), rng);
  count = std::min(count, src.size());
  if (ascending) {
    std::sort(src.begin(), src.begin() + std::ptrdiff_t(count));
    std::sort(dst.begin(), dst.begin() + std::ptrdiff_t(count));
  }
  std::vector<page_pair> out;
  for (std::size_t i = 0; i < count; ++i) {
    out.push_back({src[i], dst[i]});
  }
  return out;
}

/// A random valid geometry small enough for exhaustive byte checks.
inline kv_geometry random_geometry(std::mt19937_64& rng)
{
  auto pick = [&](std::initializer_list<std::int64_t> v) {
    return *(v.begin() + std::uniform_int_distribution<std::size_t>{0, v.size() - 1}(rng));
  };
  for (;;) {
    kv_geometry g{pick({1, 2, 3, 5}),    pick({1, 2, 4, 8, 16}), pick({1, 2, 3, 4}),
                  pick({8, 16, 24, 64}), pick({1, 2, 4}),        pick({1, 2})};
    if (g.block_bytes() % 16 == 0) { return g; }
  }
}

}  // namespace strata::test

namespace strata::test {
/// Offset of the first byte where two images differ, or -1: a cheap value for CHECK to print
/// (Catch would otherwise print whole buffers when a comparison fails).
template <class A, class B>
std::int64_t first_difference(A const& a, B const& b)
{
  if (a.size() != b.size()) { return static_cast<std::int64_t>(std::min(a.size(), b.size())); }
  auto const m = std::mismatch(a.begin(), a.end(), b.begin());
  return m.first == a.end() ? -1 : static_cast<std::int64_t>(m.first - a.begin());
}
}  // namespace strata::test
