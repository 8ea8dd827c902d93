// SPDX-License-Identifier: Apache-2.0
/**
 * @file tier/detail/redis/key_slot.hpp
 * @brief Redis Cluster's key → slot map: CRC16 (XMODEM: polynomial 0x1021, initial value 0) of the
 *        key, or of its hash tag (the bytes between the first `{` and the next `}`, when not
 *        empty), modulo 16384. Redis' cluster specification defines it; the tests check it against
 *        the server's `CLUSTER KEYSLOT`.
 */
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace strata::detail::redis {

inline constexpr int cluster_slots = 16384;

inline constexpr std::array<std::uint16_t, 256> crc16_table = [] {
  std::array<std::uint16_t, 256> t{};
  for (unsigned i = 0; i < 256; ++i) {
    std::uint16_t c = static_cast<std::uint16_t>(i << 8);
    for (int k = 0; k < 8; ++k) {
      c = static_cast<std::uint16_t>((c & 0x8000U) ? (c << 1) ^ 0x1021U : c << 1);
    }
    t[i] = c;
  }
  return t;
}();

[[nodiscard]] constexpr std::uint16_t crc16(std::string_view bytes) noexcept
{
  std::uint16_t c = 0;
  for (char ch : bytes) {
    c = static_cast<std::uint16_t>((c << 8) ^ crc16_table[((c >> 8) ^ static_cast<unsigned char>(ch)) & 0xFFU]);
  }
  return c;
}
static_assert(crc16("123456789") == 0x31C3, "the XMODEM check value");

/// @brief The cluster slot of `key`.
[[nodiscard]] constexpr int key_slot(std::string_view key) noexcept
{
  if (auto const open = key.find('{'); open != std::string_view::npos) {
    if (auto const close = key.find('}', open + 1); close != std::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return crc16(key) & (cluster_slots - 1);
}

}  // namespace strata::detail::redis
