// SPDX-License-Identifier: Apache-2.0
/**
 * @file detail/radix_sort.hpp
 * @brief A stable least-significant-digit radix sort by 64-bit keys, and the map from a double to a
 *        key that orders like it: what a scheduler ranking thousands of requests every round sorts
 *        with (a comparison sort of 10,000 costs it most of a millisecond).
 */
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace strata::detail {

/// @brief A key that orders as `x` does (`-0.0` as `0.0`; not for NaN).
[[nodiscard]] inline std::uint64_t ordered_key(double x) noexcept
{
  auto const u = std::bit_cast<std::uint64_t>(x + 0.0);  // -0.0 + 0.0 is +0.0
  return (u >> 63) != 0 ? ~u : u | (std::uint64_t{1} << 63);
}

/**
 * @brief Sorts `items` by `key(item)` (a `std::uint64_t` below `2^(8 * Bytes)`), keeping the order
 *        of items with equal keys: a counting pass per byte, skipping the bytes all keys share.
 * @param scratch reused between calls (resized to `items.size()`)
 */
template <std::size_t Bytes = 8, class T, class Key>
void stable_radix_sort(std::vector<T>& items, std::vector<T>& scratch, Key&& key)
{
  static_assert(Bytes >= 1 && Bytes <= 8);
  std::size_t const n = items.size();
  if (n < 2) { return; }
  std::array<std::array<std::uint32_t, 256>, Bytes> counts{};
  for (auto const& x : items) {
    std::uint64_t const k = key(x);
    for (std::size_t d = 0; d < Bytes; ++d) {
      ++counts[d][(k >> (8 * d)) & 0xff];
    }
  }
  scratch.resize(n);
  for (std::size_t d = 0; d < Bytes; ++d) {
    auto& c = counts[d];
    if (c[(key(items[0]) >> (8 * d)) & 0xff] == n) { continue; }  // every key has this byte
    std::uint32_t at = 0;
    for (auto& slot : c) {
      at += std::exchange(slot, at);
    }
    for (auto& x : items) {
      scratch[c[(key(x) >> (8 * d)) & 0xff]++] = std::move(x);
    }
    items.swap(scratch);
  }
}

}  // namespace strata::detail
