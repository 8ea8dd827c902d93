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
enum class layout_kind { layer_first, layer_first_table, page_first, vllm, hf, mla };
inline constexpr layout_kind all_layout_kinds[] = {layout_kind::layer_first, layout_kind::layer_first_table,
                                                   layout_kind::page_first,  layout_kind::vllm,
                                                   layout_kind::hf,          layout_kind::mla};

inline char const* to_string(layout_kind k)
{
  switch (k) {
    case layout_kind::layer_first:
      return "layer_first";
    case layout_kind::layer_first_table:
      return "layer_first_table";
    case layout_kind::page_first:
      return "page_first";
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
/// between tensors, which must never be written).
template <class Layout>
struct pool {
  std::vector<std::byte> storage;
  Layout layout;
};

/// Carves `count` tensors of `bytes` each out of one buffer, in a shuffled order with gaps between
/// them, so that tests see tables whose entries are neither sorted nor adjacent.
inline std::vector<std::byte*> carve(std::vector<std::byte>& storage, std::int64_t count, std::int64_t bytes,
                                     std::mt19937_64& rng)
{
  constexpr std::int64_t gap = 64;
  storage.assign(static_cast<std::size_t>(count * (bytes + gap)), std::byte{0});
  std::vector<std::int64_t> slot(static_cast<std::size_t>(count));
  std::iota(slot.begin(), slot.end(), 0);
  std::shuffle(slot.begin(), slot.end(), rng);
  std::vector<std::byte*> out;
  for (auto s : slot) {
    out.push_back(storage.data() + s * (bytes + gap));
  }
  return out;
}

/// Calls `f(pool<L>&)` with a pool of kind `k` holding at least `pages` pages.
template <class F>
void with_pool(layout_kind k, kv_geometry const& g, std::int64_t pages, std::mt19937_64& rng, F&& f)
{
  switch (k) {
    case layout_kind::layer_first: {
      std::vector<std::byte> s(static_cast<std::size_t>(pages * g.page_bytes()));
      layer_first const layout{s.data(), g, pages};
      pool<layer_first> p{std::move(s), layout};  // moving a vector keeps its buffer
      f(p);
      return;
    }
    case layout_kind::page_first: {
      std::vector<std::byte> s(static_cast<std::size_t>(pages * g.page_bytes()));
      page_first const layout{s.data(), g, pages};
      pool<page_first> p{std::move(s), layout};
      f(p);
      return;
    }
    case layout_kind::layer_first_table:
    case layout_kind::mla: {
      std::vector<std::byte> s;
      auto const t = carve(s, g.layers * g.planes, pages * g.block_bytes(), rng);
      auto layout = k == layout_kind::mla ? mla_layout(t, g, pages) : layer_first_table{t, g, pages};
      pool<layer_first_table> p{std::move(s), layout};
      f(p);
      return;
    }
    case layout_kind::vllm: {
      std::vector<std::byte> s;
      auto const t = carve(s, g.layers, g.planes * pages * g.block_bytes(), rng);
      pool<vllm_layout> p{std::move(s), vllm_layout{t, g, pages}};
      f(p);
      return;
    }
    case layout_kind::hf: {
      std::int64_t const per_seq = std::uniform_int_distribution<std::int64_t>{1, 4}(rng);
      std::int64_t const batch = (pages + per_seq - 1) / per_seq;
      std::int64_t const capacity = per_seq * g.page_tokens;
      std::vector<std::byte> s;
      auto const t = carve(s, g.layers * g.planes, batch * g.kv_heads * capacity * g.head_bytes(), rng);
      std::vector<std::byte*> keys, values;
      for (std::int64_t l = 0; l < g.layers; ++l) {
        keys.push_back(t[static_cast<std::size_t>(l * g.planes)]);
        if (g.planes == 2) { values.push_back(t[static_cast<std::size_t>(l * g.planes + 1)]); }
      }
      pool<hf_layout> p{std::move(s), hf_layout{keys, values, g, batch, capacity}};
      f(p);
      return;
    }
  }
}

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
