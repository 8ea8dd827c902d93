// SPDX-License-Identifier: Apache-2.0
/**
 * @file tier/host_pool.hpp
 * @brief Host tiers without CUDA: ordinary (pageable) memory in page-first records, for CPU-only
 *        engines and tests, and a page store with no memory at all, for the simulator.
 */
#pragma once

#include <strata/layout/page_first.hpp>
#include <strata/tier/concepts.hpp>

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>

namespace strata {

/**
 * @brief `num_pages` page-first records in ordinary host memory (64-byte aligned, zero-filled).
 *
 * The host tier of a CPU engine (`cpu_executor`). GPU engines use `pinned_host_pool`
 * (`tier/pinned_host_pool.cuh`), which GPU copy kernels can read.
 */
class host_pool {
 public:
  static constexpr tier kind = tier::host;  ///< the tier it serves

  /**
   * @throw strata::invalid_argument for an invalid geometry, a non-positive page count or a size
   *        that overflows 64 bits
   * @throw strata::out_of_memory when the memory cannot be allocated
   */
  host_pool(kv_geometry const& geometry, std::int64_t num_pages)
      : geometry_{(geometry.validate(), geometry)}, slots_{num_pages}
  {
    auto const bytes = static_cast<std::size_t>(detail::checked_extent(num_pages, geometry.page_bytes(), "host_pool"));
    memory_.reset(static_cast<std::byte*>(::operator new(bytes, std::align_val_t{64}, std::nothrow)));
    STRATA_EXPECTS_AS(out_of_memory, memory_ != nullptr, "host_pool: cannot allocate ", bytes, " bytes");
    std::memset(memory_.get(), 0, bytes);
  }

  /// @brief The records as a layout.
  [[nodiscard]] page_first layout() const { return page_first{memory_.get(), geometry_, capacity()}; }
  /// @brief Shape of the cache.
  [[nodiscard]] kv_geometry geometry() const noexcept { return geometry_; }
  /// @brief Records in the pool.
  [[nodiscard]] std::int64_t capacity() const noexcept { return slots_.capacity(); }
  /// @brief The record slots (allocated by the prefix index).
  [[nodiscard]] slot_allocator& slots() noexcept { return slots_; }
  /// @brief The record slots.
  [[nodiscard]] slot_allocator const& slots() const noexcept { return slots_; }

 private:
  struct aligned_delete {
    void operator()(std::byte* p) const noexcept { ::operator delete(p, std::align_val_t{64}); }
  };
  kv_geometry geometry_;
  slot_allocator slots_;
  std::unique_ptr<std::byte, aligned_delete> memory_;
};
static_assert(addressable_store<host_pool>);

/**
 * @brief A tier of `capacity` pages that holds no bytes: page ids only. The simulator's tiers
 *        (its executor moves no data) and a placeholder for a tier whose data another system keeps.
 *        A capacity of 0 makes the tier absent: a `tier_stack` lends the index no allocator for it.
 * @tparam Kind the tier it serves
 */
template <tier Kind>
class virtual_pool {
 public:
  static constexpr tier kind = Kind;  ///< the tier it serves

  /// @throw strata::invalid_argument for an invalid geometry or a negative capacity
  virtual_pool(kv_geometry const& geometry, std::int64_t capacity)
      : geometry_{(geometry.validate(), geometry)}, capacity_{capacity}, slots_{std::max<std::int64_t>(capacity, 1)}
  { STRATA_EXPECTS(capacity >= 0, "virtual_pool: capacity must not be negative, got ", capacity); }
  /// @brief Shape of the cache.
  [[nodiscard]] kv_geometry geometry() const noexcept { return geometry_; }
  /// @brief Pages (0: the tier is absent).
  [[nodiscard]] std::int64_t capacity() const noexcept { return capacity_; }
  /// @brief The page ids (meaningless while the capacity is 0).
  [[nodiscard]] slot_allocator& slots() noexcept { return slots_; }
  /// @brief The page ids.
  [[nodiscard]] slot_allocator const& slots() const noexcept { return slots_; }

 private:
  kv_geometry geometry_;
  std::int64_t capacity_;
  slot_allocator slots_;
};
static_assert(page_store<virtual_pool<tier::host>>);

}  // namespace strata
