// SPDX-License-Identifier: Apache-2.0
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

// Host code compiled by nvcc too (its host pass defines `__CUDACC__`, not `__CUDA_ARCH__`): a `.cu`
// file that reads the file tier checks records at the instruction's speed, not the tables' (~9x
// slower), and every translation unit of a program gets the same definition.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__)
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

/**
 * @brief Tables that advance a raw CRC-32C state over `len` zero bytes (`len` a power of two), one
 *        table per byte of the state: what combines CRCs of consecutive blocks computed in parallel
 *        (M. Adler's method: the zeros operator is a 32x32 matrix over GF(2), squared log2(8 len) times).
 */
struct crc32c_zeros {
  std::array<std::array<std::uint32_t, 256>, 4> t{};

  static constexpr std::uint32_t times(std::uint32_t const* mat, std::uint32_t vec) noexcept
  {
    std::uint32_t sum = 0;
    for (; vec != 0; vec >>= 1, ++mat) {
      if (vec & 1U) { sum ^= *mat; }
    }
    return sum;
  }
  static constexpr void square(std::uint32_t* out, std::uint32_t const* mat) noexcept
  {
    for (int n = 0; n < 32; ++n) {
      out[n] = times(mat, mat[n]);
    }
  }
  explicit constexpr crc32c_zeros(std::size_t len) noexcept
  {
    std::uint32_t odd[32]{}, even[32]{};
    odd[0] = 0x82F63B78U;  // one zero bit
    for (int n = 1; n < 32; ++n) {
      odd[n] = 1U << (n - 1);
    }
    square(even, odd);  // two zero bits
    square(odd, even);  // four zero bits
    std::uint32_t const* op = nullptr;
    for (;;) {
      square(even, odd);  // 8, 32, ... zero bits
      len >>= 1;
      if (len == 0) {
        op = even;
        break;
      }
      square(odd, even);  // 16, 64, ... zero bits
      len >>= 1;
      if (len == 0) {
        op = odd;
        break;
      }
    }
    for (std::uint32_t n = 0; n < 256; ++n) {
      t[0][n] = times(op, n);
      t[1][n] = times(op, n << 8);
      t[2][n] = times(op, n << 16);
      t[3][n] = times(op, n << 24);
    }
  }
  [[nodiscard]] std::uint32_t shift(std::uint32_t crc) const noexcept
  { return t[0][crc & 0xFFU] ^ t[1][(crc >> 8) & 0xFFU] ^ t[2][(crc >> 16) & 0xFFU] ^ t[3][crc >> 24]; }
};

#ifdef STRATA_CRC32C_X86
/// @brief Hardware CRC-32C update; call only when the CPU has SSE4.2. Large inputs run three
///        independent `crc32` chains (the instruction's latency is 3 cycles, its throughput 1).
__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_update_hw(std::uint32_t crc, unsigned char const* p,
                                                                        std::size_t n) noexcept
{
  constexpr std::size_t lane = 8192;
  static crc32c_zeros const zeros{lane};
  std::uint64_t c = crc;
  while (n >= 3 * lane) {
    std::uint64_t c1 = 0, c2 = 0;
    for (std::size_t i = 0; i < lane; i += 8) {
      std::uint64_t v0, v1, v2;
      std::memcpy(&v0, p + i, 8);
      std::memcpy(&v1, p + lane + i, 8);
      std::memcpy(&v2, p + 2 * lane + i, 8);
      c = _mm_crc32_u64(c, v0);
      c1 = _mm_crc32_u64(c1, v1);
      c2 = _mm_crc32_u64(c2, v2);
    }
    c = zeros.shift(static_cast<std::uint32_t>(c)) ^ static_cast<std::uint32_t>(c1);
    c = zeros.shift(static_cast<std::uint32_t>(c)) ^ static_cast<std::uint32_t>(c2);
    p += 3 * lane;
    n -= 3 * lane;
  }
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
