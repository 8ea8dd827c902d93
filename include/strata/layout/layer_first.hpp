// SPDX-License-Identifier: Apache-2.0
/**
 * @file layout/layer_first.hpp
 * @brief Compute-friendly layer-first layouts: one contiguous pool, or one tensor per (layer, plane).
 */
#pragma once

#include <strata/layout/layout.hpp>

namespace strata {

/**
 * @brief One contiguous pool ordered `[layer][plane][page][page_tokens][kv_heads][head_dim]`.
 *
 * What attention kernels want: all pages of a layer's K (or V) sit together, so a layer can be
 * computed as soon as it arrives. Pool size: `num_pages * page_bytes()`.
 */
class layer_first : public detail::contiguous_pool {
 public:
  static constexpr layout_order order = layout_order::layer_major;  ///< memory order
  static constexpr char const* name = "layer_first";                ///< for reports

  /**
   * @param base first byte of the pool (host or device memory; never dereferenced here)
   * @param geometry shape of the cache
   * @param num_pages pages the pool holds
   * @throw strata::invalid_argument for a null base, an invalid geometry, a non-positive page count,
   *        or a pool size that overflows 64 bits
   */
  layer_first(std::byte* base, kv_geometry const& geometry, std::int64_t num_pages)
      : contiguous_pool{base, geometry, num_pages, name}
  {
  }

  /// @brief The block of (page, layer, plane); unchecked.
  [[nodiscard]] STRATA_HOST_DEVICE block_ref block(std::int64_t page, std::int64_t layer,
                                                   std::int64_t plane) const noexcept
  {
    auto const& g = geometry_;
    return {base_ + ((layer * g.planes + plane) * num_pages_ + page) * g.block_bytes(), g.row_bytes(), g.head_bytes()};
  }
};
static_assert(kv_layout<layer_first>);

/**
 * @brief One tensor per (layer, plane), each `[num_pages * page_tokens][kv_heads][head_dim]`,
 *        found through a table of base pointers.
 *
 * This is SGLang's pool (`k_buffer[layer]`, `v_buffer[layer]`, token-indexed: page p is tokens
 * `[p * page_tokens, (p + 1) * page_tokens)`) and, with one plane, its MLA pool
 * (`kv_buffer[layer]` of `[tokens, 1, kv_lora_rank + rope_dim]`). Use `sglang_layout` and
 * `mla_layout` to build one from per-layer pointers.
 */
class layer_first_table {
 public:
  static constexpr layout_order order = layout_order::layer_major;  ///< memory order
  static constexpr char const* name = "layer_first_table";          ///< for reports

  /**
   * @param table `layers * planes` base pointers, entry `layer * planes + plane`
   * @param geometry shape of the cache
   * @param num_pages pages each tensor holds
   * @throw strata::invalid_argument for a table of the wrong length or with a null entry, an
   *        invalid geometry, a non-positive page count, or a tensor size that overflows 64 bits
   */
  layer_first_table(std::span<std::byte* const> table, kv_geometry const& geometry, std::int64_t num_pages)
      : geometry_{geometry}, num_pages_{num_pages}
  {
    geometry.validate();
    STRATA_EXPECTS(static_cast<std::int64_t>(table.size()) == geometry.layers * geometry.planes, name, ": table has ",
                   table.size(), " entries, expected layers * planes = ", geometry.layers * geometry.planes);
    table_ = detail::pointer_table::from(table, name);
    STRATA_EXPECTS(num_pages > 0, name, ": num_pages must be positive, got ", num_pages);
    (void)detail::checked_extent(num_pages, geometry.block_bytes(), name);
  }

  /// @brief Shape of the cache.
  [[nodiscard]] STRATA_HOST_DEVICE kv_geometry const& geometry() const noexcept { return geometry_; }
  /// @brief Pages in each tensor.
  [[nodiscard]] STRATA_HOST_DEVICE std::int64_t num_pages() const noexcept { return num_pages_; }
  /// @brief Bytes each (layer, plane) tensor spans.
  [[nodiscard]] std::int64_t tensor_bytes() const noexcept { return num_pages_ * geometry_.block_bytes(); }

  /// @brief The block of (page, layer, plane); unchecked.
  [[nodiscard]] STRATA_HOST_DEVICE block_ref block(std::int64_t page, std::int64_t layer,
                                                   std::int64_t plane) const noexcept
  {
    auto const& g = geometry_;
    return {table_.ptr[layer * g.planes + plane] + page * g.block_bytes(), g.row_bytes(), g.head_bytes()};
  }

 private:
  detail::pointer_table table_;
  kv_geometry geometry_;
  std::int64_t num_pages_;
};
static_assert(kv_layout<layer_first_table>);

}  // namespace strata
