// SPDX-License-Identifier: Apache-2.0
/**
 * @file tier/device_pool.hpp
 * @brief The device tier: pages of a KV pool the engine owns, described by the engine's layout.
 */
#pragma once

#include <strata/layout/layer_first.hpp>
#include <strata/tier/concepts.hpp>

#include <utility>

namespace strata {

/**
 * @brief The device tier over `layout.num_pages()` pages of a pool the engine owns (strata never
 *        allocates or frees the memory; it hands out the page ids).
 *
 * @tparam Layout the engine's `kv_layout` (`sglang_layout`, `vllm_layout`, `layer_first`, ...)
 */
template <kv_layout Layout>
class device_pool {
 public:
  static constexpr tier kind = tier::device;  ///< the tier it serves
  using layout_type = Layout;                 ///< the engine's layout

  /**
   * @param layout where the engine's pages are; every page id `[0, layout.num_pages())` is the
   *        controller's to hand out (give strata a pool, or a range of one, that nothing else uses)
   * @throw strata::invalid_argument for a layout without pages
   */
  explicit device_pool(Layout layout) : layout_{std::move(layout)}, slots_{layout_.num_pages()} {}

  /// @brief The engine's layout.
  [[nodiscard]] Layout const& layout() const noexcept { return layout_; }
  /// @brief Shape of the cache.
  [[nodiscard]] kv_geometry geometry() const noexcept { return layout_.geometry(); }
  /// @brief Pages in the pool.
  [[nodiscard]] std::int64_t capacity() const noexcept { return slots_.capacity(); }
  /// @brief Page ids: the controller allocates request pages from here.
  [[nodiscard]] slot_allocator& slots() noexcept { return slots_; }
  /// @brief Page ids.
  [[nodiscard]] slot_allocator const& slots() const noexcept { return slots_; }

 private:
  Layout layout_;
  slot_allocator slots_;
};

static_assert(addressable_store<device_pool<layer_first>>);

}  // namespace strata
