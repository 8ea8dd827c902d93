// SPDX-License-Identifier: Apache-2.0
// Pages of keyed stores under test: documents whose page bytes come from a generator keyed by a
// hash of the prefix's tokens (tests/support/kv_content.hpp), sharing nothing with the stores'
// content keys, and poisoned landing buffers.
#pragma once

#include "catch.hpp"
#include "kv_content.hpp"

#include <strata/tier/keyed_store.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <vector>

namespace strata::test {

using strata::content_key;
using strata::keyed_page;

/// A document of `n` pages: its tokens, the store's keys, the reference bytes of each page.
struct document {
  strata::kv_geometry g;
  std::vector<std::int32_t> tokens;
  std::vector<content_key> keys;
  std::vector<std::vector<std::byte>> bytes;  // reference, from tests/support/kv_content.hpp

  document(strata::kv_geometry geometry, std::int64_t pages, std::uint32_t seed) : g(geometry)
  {
    std::mt19937 rng(seed);
    tokens.resize(std::size_t(pages * g.page_tokens));
    for (auto& t : tokens) {
      t = std::int32_t(rng() % 128000);
    }
    keys = strata::chain_content_keys(tokens, g.page_tokens);
    for (std::int64_t p = 0; p < pages; ++p) {
      std::uint64_t const k = strata::test::page_key(tokens, g.page_tokens, p);
      std::vector<std::byte> b(std::size_t(g.page_bytes()));
      std::int64_t const words = g.block_bytes() / 8;
      for (std::int64_t l = 0; l < g.layers; ++l) {
        for (std::int64_t pl = 0; pl < g.planes; ++pl) {
          for (std::int64_t w = 0; w < words; ++w) {
            std::uint64_t const v = strata::test::kv_word(k, l, pl, w);
            std::memcpy(b.data() + ((l * g.planes + pl) * words + w) * 8, &v, 8);
          }
        }
      }
      bytes.push_back(std::move(b));
    }
  }
  [[nodiscard]] std::size_t size() const { return keys.size(); }
  [[nodiscard]] std::span<std::int32_t const> ids(std::size_t p) const
  { return std::span(tokens).subspan(p * std::size_t(g.page_tokens), std::size_t(g.page_tokens)); }
  [[nodiscard]] std::vector<keyed_page> pages(std::size_t first = 0, std::size_t count = SIZE_MAX) const
  {
    std::vector<keyed_page> v;
    for (std::size_t p = first; p < size() && p - first < count; ++p) {
      v.push_back({keys[p], ids(p)});
    }
    return v;
  }
  [[nodiscard]] std::vector<std::byte const*> sources(std::size_t first = 0, std::size_t count = SIZE_MAX) const
  {
    std::vector<std::byte const*> v;
    for (std::size_t p = first; p < size() && p - first < count; ++p) {
      v.push_back(bytes[p].data());
    }
    return v;
  }
};

/// Destination buffers for `n` pages, poisoned.
struct landing {
  std::vector<std::vector<std::byte>> bufs;
  std::vector<std::byte*> ptrs;
  std::unique_ptr<bool[]> flags;
  std::size_t n;
  landing(std::size_t count, std::int64_t page_bytes) : bufs(count), flags(new bool[count]()), n(count)
  {
    for (auto& b : bufs) {
      b.assign(std::size_t(page_bytes), std::byte{0xA5});
      ptrs.push_back(b.data());
    }
  }
  std::span<bool> intact() { return {flags.get(), n}; }
};

/// Reads pages [first, first + count) of `d` from a keyed store: every page reported intact holds
/// the reference bytes (checked here); returns how many were.
template <class Store>
std::int64_t get_checked(Store& s, document const& d, std::size_t first = 0, std::size_t count = SIZE_MAX)
{
  auto pages = d.pages(first, count);
  landing l(pages.size(), d.g.page_bytes());
  std::int64_t const got = s.get(pages, l.ptrs, l.intact());
  std::int64_t n = 0;
  for (std::size_t i = 0; i < pages.size(); ++i) {
    if (l.flags[i]) {
      ++n;
      if (l.bufs[i] != d.bytes[first + i]) { FAIL("page " << first + i << " reported intact with wrong bytes"); }
    }
  }
  CHECK(n == got);
  return got;
}

}  // namespace strata::test
