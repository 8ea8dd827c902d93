// SPDX-License-Identifier: Apache-2.0
// The KV content the controller tests check every page against: a page's bytes depend on every token
// of its prefix, as a model's would, and on nothing the code under test computes.
#pragma once

#include <strata/config.hpp>
#include <strata/geometry.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace strata::test {

/// @brief Key of page `p` of `tokens` (pages of `page_tokens` tokens): a hash of the whole prefix.
inline std::uint64_t page_key(std::vector<std::int32_t> const& tokens, std::int64_t page_tokens, std::int64_t p)
{
  std::uint64_t h = 0x9e3779b97f4a7c15ull;
  for (std::int64_t i = 0; i < (p + 1) * page_tokens; ++i) {
    h = (h ^ std::uint64_t(std::uint32_t(tokens[std::size_t(i)]))) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  return h;
}

/// @brief 8-byte word `w` of block (layer, plane) of the page whose key is `key`.
STRATA_HOST_DEVICE inline std::uint64_t kv_word(std::uint64_t key, std::int64_t layer, std::int64_t plane,
                                                std::int64_t w)
{
  std::uint64_t x = key + std::uint64_t(((layer * 2 + plane) << 20) + w) * 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// @brief Calls `f(word_index, address)` for every 8-byte word of block (layer, plane) of page
///        `dev` of any layout, in the canonical order (token, head, bytes of the head row).
template <class Layout, class F>
void for_each_kv_word(Layout const& l, kv_geometry const& g, std::int64_t dev, std::int64_t layer, std::int64_t plane,
                      F&& f)
{
  auto const b = l.block(dev, layer, plane);
  std::int64_t const per_head = g.head_bytes() / 8;
  for (std::int64_t t = 0; t < g.page_tokens; ++t) {
    for (std::int64_t h = 0; h < g.kv_heads; ++h) {
      for (std::int64_t j = 0; j < per_head; ++j) {
        f((t * g.kv_heads + h) * per_head + j, b.data + t * b.token_stride + h * b.head_stride + j * 8);
      }
    }
  }
}

/// @brief The engine "computes" page `p` of `tokens` into device page `dev` (any layout; head rows
///        of a multiple of 8 bytes).
template <class Layout>
void write_kv_page(Layout const& l, kv_geometry const& g, std::vector<std::int32_t> const& tokens, std::int64_t p,
                   std::int64_t dev)
{
  std::uint64_t const key = page_key(tokens, g.page_tokens, p);
  for (std::int64_t layer = 0; layer < g.layers; ++layer) {
    for (std::int64_t k = 0; k < g.planes; ++k) {
      for_each_kv_word(l, g, dev, layer, k, [&](std::int64_t w, std::byte* at) {
        std::uint64_t const v = kv_word(key, layer, k, w);
        std::memcpy(at, &v, 8);
      });
    }
  }
}

/// @brief Whether device page `dev` holds page `p` of `tokens` as `write_kv_page` computed it.
template <class Layout>
bool kv_page_ok(Layout const& l, kv_geometry const& g, std::vector<std::int32_t> const& tokens, std::int64_t p,
                std::int64_t dev)
{
  std::uint64_t const key = page_key(tokens, g.page_tokens, p);
  bool ok = true;
  for (std::int64_t layer = 0; layer < g.layers; ++layer) {
    for (std::int64_t k = 0; k < g.planes; ++k) {
      for_each_kv_word(l, g, dev, layer, k, [&](std::int64_t w, std::byte* at) {
        std::uint64_t v;
        std::memcpy(&v, at, 8);
        ok = ok && v == kv_word(key, layer, k, w);
      });
    }
  }
  return ok;
}

}  // namespace strata::test
