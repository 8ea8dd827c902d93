// SPDX-License-Identifier: Apache-2.0
/**
 * @file detail/checked.hpp
 * @brief 64-bit arithmetic that reports overflow instead of wrapping.
 */
#pragma once

#include <cstdint>
#include <optional>

namespace strata::detail {

/// @brief `a * b`, or nothing when the product does not fit in `std::int64_t`.
[[nodiscard]] constexpr std::optional<std::int64_t> checked_mul(std::int64_t a, std::int64_t b) noexcept
{
  std::int64_t r{};
  if (__builtin_mul_overflow(a, b, &r)) { return std::nullopt; }
  return r;
}

/// @brief `a + b`, or nothing when the sum does not fit in `std::int64_t`.
[[nodiscard]] constexpr std::optional<std::int64_t> checked_add(std::int64_t a, std::int64_t b) noexcept
{
  std::int64_t r{};
  if (__builtin_add_overflow(a, b, &r)) { return std::nullopt; }
  return r;
}

}  // namespace strata::detail
