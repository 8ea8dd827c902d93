// SPDX-License-Identifier: Apache-2.0
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
  { return base_ + page * geometry_.page_bytes(); }

  /// @brief The block of (page, layer, plane); unchecked.
  [[nodiscard]] STRATA_HOST_DEVICE block_ref block(std::int64_t page, std::int64_t layer,
                                                   std::int64_t plane) const noexcept
  {
    auto const& g = geometry_;
    return {page_data(page) + (layer * g.planes + plane) * g.block_bytes(), g.row_bytes(), g.head_bytes()};
  }
};
static_assert(kv_layout<page_first>);

/**
 * @brief Page-first records spread over up to `max_layer_tables` separately allocated chunks of
 *        `pages_per_chunk` pages each: page p is record `p % pages_per_chunk` of chunk
 *        `p / pages_per_chunk`.
 *
 * The layout of a pinned host pool registered in chunks (large single registrations fail or
 * stall). A page never straddles two chunks, and chunks are never adjacent in memory, so no merged
 * copy run crosses a chunk (and its registration).
 */
class page_first_chunked {
 public:
  static constexpr layout_order order = layout_order::page_major;  ///< memory order
  static constexpr char const* name = "page_first_chunked";        ///< for reports

  /**
   * @param chunks base pointers of the chunks; chunk c holds pages `[c * pages_per_chunk, ...)`
   * @param geometry shape of the cache
   * @param pages_per_chunk records per chunk
   * @param num_pages pages in all; at most `chunks.size() * pages_per_chunk`, and more than
   *        `(chunks.size() - 1) * pages_per_chunk` (no chunk is unused)
   * @throw strata::invalid_argument for an empty or too long chunk list, a null chunk, a page count
   *        the chunks cannot hold or that leaves a chunk unused, or an overflowing size
   */
  page_first_chunked(std::span<std::byte* const> chunks, kv_geometry const& geometry, std::int64_t pages_per_chunk,
                     std::int64_t num_pages)
      : geometry_{geometry}, pages_per_chunk_{pages_per_chunk}, num_pages_{num_pages}
  {
    geometry.validate();
    chunks_ = detail::pointer_table::from(chunks, name);
    STRATA_EXPECTS(pages_per_chunk > 0, name, ": pages_per_chunk must be positive, got ", pages_per_chunk);
    (void)detail::checked_extent(pages_per_chunk, geometry.page_bytes(), name);
    auto const n = static_cast<std::int64_t>(chunks.size());
    STRATA_EXPECTS(num_pages > (n - 1) * pages_per_chunk && num_pages <= n * pages_per_chunk, name, ": ", num_pages,
                   " pages do not fill ", n, " chunks of ", pages_per_chunk, " pages");
  }

  /// @brief Shape of the cache.
  [[nodiscard]] STRATA_HOST_DEVICE kv_geometry const& geometry() const noexcept { return geometry_; }
  /// @brief Pages in the pool.
  [[nodiscard]] STRATA_HOST_DEVICE std::int64_t num_pages() const noexcept { return num_pages_; }
  /// @brief Records per chunk.
  [[nodiscard]] STRATA_HOST_DEVICE std::int64_t pages_per_chunk() const noexcept { return pages_per_chunk_; }

  /// @brief First byte of page `page`'s record; unchecked.
  [[nodiscard]] STRATA_HOST_DEVICE std::byte* page_data(std::int64_t page) const noexcept
  {
    std::int64_t const c = page / pages_per_chunk_;
    return chunks_.ptr[c] + (page - c * pages_per_chunk_) * geometry_.page_bytes();
  }

  /// @brief The block of (page, layer, plane); unchecked.
  [[nodiscard]] STRATA_HOST_DEVICE block_ref block(std::int64_t page, std::int64_t layer,
                                                   std::int64_t plane) const noexcept
  {
    auto const& g = geometry_;
    return {page_data(page) + (layer * g.planes + plane) * g.block_bytes(), g.row_bytes(), g.head_bytes()};
  }

 private:
  detail::pointer_table chunks_;
  kv_geometry geometry_;
  std::int64_t pages_per_chunk_;
  std::int64_t num_pages_;
};
static_assert(kv_layout<page_first_chunked>);

}  // namespace strata
