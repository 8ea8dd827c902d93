// SPDX-License-Identifier: Apache-2.0
// The KV content the controller tests check every page against: a page's bytes depend on every token
// of its prefix, as a model's would, and on nothing the code under test computes.
#pragma once

#include <strata/config.hpp>

#include <cstddef>
#include <cstdint>
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

}  // namespace strata::test
