/**
 * @file tier/detail/crc32c.hpp
 * @brief CRC-32C (Castagnoli), header-only: the SSE4.2 `crc32` instruction when the CPU has it
 *        (checked at run time), slice-by-8 tables otherwise. Both give the same values.
 *
 * Why CRC-32C rather than a 64-bit hash: it detects every error of up to 3 flipped bits and every
 * burst of up to 32 bits in records far larger than a KV page (Koopman), runs at several GB/s per
 * core in hardware, and needs no library.
 */
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#include <nmmintrin.h>
#define STRATA_CRC32C_X86 1
#endif

namespace strata::detail {

/// @brief Slice-by-8 tables of the reflected CRC-32C polynomial 0x82F63B78.
inline constexpr std::array<std::array<std::uint32_t, 256>, 8> crc32c_tables = [] {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) {
      c = (c & 1U) ? (c >> 1) ^ 0x82F63B78U : c >> 1;
    }
    t[0][i] = c;
  }
  for (std::size_t s = 1; s < 8; ++s) {
    for (std::size_t i = 0; i < 256; ++i) {
      t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFFU];
    }
  }
  return t;
}();

/// @brief Software CRC-32C update of the raw (pre-inverted) state `crc`.
[[nodiscard]] inline std::uint32_t crc32c_update_sw(std::uint32_t crc, unsigned char const* p, std::size_t n) noexcept
{
  auto const& t = crc32c_tables;
  while (n >= 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    v ^= crc;
    crc = t[7][v & 0xFF] ^ t[6][(v >> 8) & 0xFF] ^ t[5][(v >> 16) & 0xFF] ^ t[4][(v >> 24) & 0xFF] ^
          t[3][(v >> 32) & 0xFF] ^ t[2][(v >> 40) & 0xFF] ^ t[1][(v >> 48) & 0xFF] ^ t[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) {
    crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFFU];
  }
  return crc;
}

#ifdef STRATA_CRC32C_X86
/// @brief Hardware CRC-32C update; call only when the CPU has SSE4.2.
__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_update_hw(std::uint32_t crc, unsigned char const* p,
                                                                        std::size_t n) noexcept
{
  std::uint64_t c = crc;
  while (n >= 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  auto c32 = static_cast<std::uint32_t>(c);
  while (n-- > 0) {
    c32 = _mm_crc32_u8(c32, *p++);
  }
  return c32;
}
#endif

/// @brief Whether the hardware path is used.
[[nodiscard]] inline bool crc32c_hardware() noexcept
{
#ifdef STRATA_CRC32C_X86
  static bool const has = __builtin_cpu_supports("sse4.2");
  return has;
#else
  return false;
#endif
}

/**
 * @brief Extends CRC-32C value `crc` (0 for an empty message) over `n` bytes at `data`:
 *        `crc32c(crc32c(0, a), b) == crc32c(0, a + b)`.
 */
[[nodiscard]] inline std::uint32_t crc32c(std::uint32_t crc, void const* data, std::size_t n) noexcept
{
  auto const* p = static_cast<unsigned char const*>(data);
  std::uint32_t state = ~crc;
#ifdef STRATA_CRC32C_X86
  if (crc32c_hardware()) { return ~crc32c_update_hw(state, p, n); }
#endif
  return ~crc32c_update_sw(state, p, n);
}

}  // namespace strata::detail
