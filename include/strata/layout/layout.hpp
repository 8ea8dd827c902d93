// SPDX-License-Identifier: Apache-2.0
/**
 * @file layout/layout.hpp
 * @brief The `kv_layout` concept: where the bytes of each (page, layer, plane) block live.
 *
 * A layout is a trivially copyable value — base pointers plus strides, or a per-layer pointer table —
 * usable unchanged on the host and in device code. It never owns memory. Every block is described by
 * a `block_ref`: the address of its first head row and two strides, so that token-major layouts
 * (one contiguous run per block) and head-major layouts (one run per head) share one description and
 * a copy between any two layouts is a transpose of head rows.
 */
#pragma once

#include <strata/config.hpp>
#include <strata/error.hpp>
#include <strata/geometry.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

namespace strata {

/**
 * @brief Which index varies slowest in a layout's memory, so that a copy can visit blocks in memory
 *        order and merge adjacent runs.
 */
enum class layout_order {
  page_major,   ///< a page is one contiguous record: `[page][layer][plane]...`
  layer_major,  ///< a layer's blocks are together: `[layer][plane][page]...` or per-layer tensors
};

/**
 * @brief Where one (page, layer, plane) block lives: head row (t, h) starts at
 *        `data + t * token_stride + h * head_stride` and is `head_bytes()` long.
 */
struct block_ref {
  std::byte* data{};            ///< head row (token 0, head 0)
  std::int64_t token_stride{};  ///< bytes from token t to token t + 1 (same head)
  std::int64_t head_stride{};   ///< bytes from head h to head h + 1 (same token)

  /// @brief True when the whole block is one contiguous run of `g.block_bytes()` bytes.
  [[nodiscard]] STRATA_HOST_DEVICE constexpr bool contiguous(kv_geometry const& g) const noexcept
  { return token_stride == g.row_bytes() && (g.kv_heads == 1 || head_stride == g.head_bytes()); }
};

/**
 * @brief A value that maps (page, layer, plane) to a `block_ref`.
 *
 * Requirements:
 * - trivially copyable (it is passed to kernels by value);
 * - `geometry()` and `num_pages()`: the shape and the number of addressable pages;
 * - `block(page, layer, plane)`: unchecked, for `0 <= page < num_pages()`, `0 <= layer < layers`,
 *   `0 <= plane < planes` (copy plans are validated before any block is addressed);
 * - `L::order`: the `layout_order` of its memory, and `L::name` for reports.
 */
template <class L>
concept kv_layout =
    std::is_trivially_copyable_v<L> && requires(L const& l, std::int64_t page, std::int64_t layer, std::int64_t plane) {
      { l.geometry() } -> std::convertible_to<kv_geometry>;
      { l.num_pages() } -> std::same_as<std::int64_t>;
      { l.block(page, layer, plane) } -> std::same_as<block_ref>;
      { L::order } -> std::convertible_to<layout_order>;
      { L::name } -> std::convertible_to<char const*>;
    };

/// @brief Most (layer, plane) base pointers a pointer-table layout holds: 256 layers of K and V.
inline constexpr std::int64_t max_layer_tables = 512;

namespace detail {

/// @brief `bytes` as a checked product, for pool sizes; throws naming `what` on overflow.
inline std::int64_t checked_extent(std::int64_t a, std::int64_t b, char const* what)
{
  auto const r = checked_mul(a, b);
  STRATA_EXPECTS(r.has_value(), what, ": size overflows 64 bits (", a, " * ", b, ")");
  return *r;
}

/**
 * @brief A fixed-capacity table of base pointers, stored inline so that a layout that holds one
 *        stays a self-contained value a kernel can take by value.
 */
struct pointer_table {
  std::byte* ptr[max_layer_tables]{};  // a C array: std::array's operator[] is host-only under nvcc

  /// @brief Copies `entries`, rejecting an empty or too-long list and null pointers.
  static pointer_table from(std::span<std::byte* const> entries, char const* what)
  {
    STRATA_EXPECTS(!entries.empty(), what, ": pointer table is empty");
    STRATA_EXPECTS(static_cast<std::int64_t>(entries.size()) <= max_layer_tables, what, ": ", entries.size(),
                   " table entries exceed the capacity of ", max_layer_tables);
    pointer_table t;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      STRATA_EXPECTS(entries[i] != nullptr, what, ": table entry ", i, " is a null pointer");
      t.ptr[i] = entries[i];
    }
    return t;
  }
};

/**
 * @brief What the single-allocation layouts (`layer_first`, `page_first`) share: one base pointer,
 *        the geometry and the page count, validated once.
 */
class contiguous_pool {
 public:
  /// @brief Shape of the cache.
  [[nodiscard]] STRATA_HOST_DEVICE kv_geometry const& geometry() const noexcept { return geometry_; }
  /// @brief Pages in the pool.
  [[nodiscard]] STRATA_HOST_DEVICE std::int64_t num_pages() const noexcept { return num_pages_; }
  /// @brief Bytes the pool spans: `num_pages() * geometry().page_bytes()`.
  [[nodiscard]] std::int64_t pool_bytes() const noexcept { return num_pages_ * geometry_.page_bytes(); }
  /// @brief First byte of the pool.
  [[nodiscard]] STRATA_HOST_DEVICE std::byte* data() const noexcept { return base_; }

 protected:
  contiguous_pool(std::byte* base, kv_geometry const& geometry, std::int64_t num_pages, char const* name)
      : base_{base}, geometry_{geometry}, num_pages_{num_pages}
  {
    geometry.validate();
    STRATA_EXPECTS(base != nullptr, name, ": base pointer is null");
    STRATA_EXPECTS(num_pages > 0, name, ": num_pages must be positive, got ", num_pages);
    (void)checked_extent(num_pages, geometry.page_bytes(), name);
  }

  std::byte* base_;
  kv_geometry geometry_;
  std::int64_t num_pages_;
};

}  // namespace detail
}  // namespace strata
