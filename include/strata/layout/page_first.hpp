/**
 * @file layout/page_first.hpp
 * @brief Transfer-friendly page-first layout: a page is one contiguous record.
 */
#pragma once

#include <strata/layout/layout.hpp>

namespace strata {

/**
 * @brief One pool ordered `[page][layer][plane][page_tokens][kv_heads][head_dim]`.
 *
 * strata's host, file and remote layout: all layers of a page form one record of `page_bytes()`, so
 * that storing or fetching a page is one large transfer, however many layers the model has.
 */
class page_first : public detail::contiguous_pool {
 public:
  static constexpr layout_order order = layout_order::page_major;  ///< memory order
  static constexpr char const* name = "page_first";                ///< for reports

  /**
   * @param base first byte of the pool
   * @param geometry shape of the cache
   * @param num_pages pages the pool holds
   * @throw strata::invalid_argument for a null base, an invalid geometry, a non-positive page count,
   *        or a pool size that overflows 64 bits
   */
  page_first(std::byte* base, kv_geometry const& geometry, std::int64_t num_pages)
    : contiguous_pool{base, geometry, num_pages, name}
  {
  }

  /// @brief First byte of page `page`'s record; unchecked.
  [[nodiscard]] STRATA_HOST_DEVICE std::byte* page_data(std::int64_t page) const noexcept
  {
    return base_ + page * geometry_.page_bytes();
  }

  /// @brief The block of (page, layer, plane); unchecked.
  [[nodiscard]] STRATA_HOST_DEVICE block_ref block(std::int64_t page, std::int64_t layer,
                                                   std::int64_t plane) const noexcept
  {
    auto const& g = geometry_;
    return {page_data(page) + (layer * g.planes + plane) * g.block_bytes(), g.row_bytes(), g.head_bytes()};
  }
};
static_assert(kv_layout<page_first>);

}  // namespace strata
