// SPDX-License-Identifier: Apache-2.0
/**
 * @file detail/hash.hpp
 * @brief The bit mixer every content key is built from (page keys of the index, content keys of
 *        keyed stores).
 */
#pragma once

#include <cstdint>

namespace strata::detail {
/// @brief The 64-bit finalizer of MurmurHash3: every input bit reaches every output bit.
constexpr std::uint64_t mix64(std::uint64_t h) noexcept
{
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}
}  // namespace strata::detail
