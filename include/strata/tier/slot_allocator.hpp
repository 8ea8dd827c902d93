// SPDX-License-Identifier: Apache-2.0
/**
 * @file tier/slot_allocator.hpp
 * @brief Page slots of a fixed-capacity store: allocate, release, with all-or-nothing validation.
 */
#pragma once

#include <strata/error.hpp>
#include <strata/types.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

namespace strata {

/**
 * @brief Hands out slot ids `[0, capacity)` of a page store.
 *
 * A fresh allocator hands out ascending ids, so that pages allocated together are adjacent and
 * their copies merge; each allocation comes back in ascending order. Thread-safe: one internal
 * lock, so a store may check its slots (`is_allocated`) on its own threads while the prefix index
 * allocates and releases others.
 */
class slot_allocator {
 public:
  /**
   * @param capacity slots in the store
   * @throw strata::invalid_argument when `capacity` is not positive
   */
  explicit slot_allocator(std::int64_t capacity) : allocated_(static_cast<std::size_t>(capacity > 0 ? capacity : 0))
  {
    STRATA_EXPECTS(capacity > 0, "slot_allocator: capacity must be positive, got ", capacity);
    free_.reserve(static_cast<std::size_t>(capacity));
    for (std::int64_t s = capacity - 1; s >= 0; --s) {
      free_.push_back(s);
    }
  }

  /// @brief Moves the slots' state (the lock is not moved: each allocator has its own).
  slot_allocator(slot_allocator&& other) noexcept
  {
    std::lock_guard lock{other.m_};
    allocated_ = std::move(other.allocated_);
    free_ = std::move(other.free_);
    claimed_ = other.claimed_;
  }
  /// @brief As the move constructor.
  slot_allocator& operator=(slot_allocator&& other) noexcept
  {
    if (this != &other) {
      std::scoped_lock lock{m_, other.m_};
      allocated_ = std::move(other.allocated_);
      free_ = std::move(other.free_);
      claimed_ = other.claimed_;
    }
    return *this;
  }
  slot_allocator(slot_allocator const&) = delete;
  slot_allocator& operator=(slot_allocator const&) = delete;
  ~slot_allocator() = default;

  /// @brief Slots in the store.
  [[nodiscard]] std::int64_t capacity() const noexcept
  {
    std::lock_guard lock{m_};
    return capacity_unlocked();
  }
  /// @brief Slots free now.
  [[nodiscard]] std::int64_t available() const noexcept
  {
    std::lock_guard lock{m_};
    return available_unlocked();
  }
  /// @brief Slots allocated now.
  [[nodiscard]] std::int64_t used() const noexcept
  {
    std::lock_guard lock{m_};
    return capacity_unlocked() - available_unlocked();
  }
  /// @brief Whether `slot` is in range and allocated.
  [[nodiscard]] bool is_allocated(std::int64_t slot) const noexcept
  {
    std::lock_guard lock{m_};
    return slot >= 0 && slot < capacity_unlocked() && allocated_[static_cast<std::size_t>(slot)];
  }

  /**
   * @brief Allocates `n` slots.
   * @throw strata::invalid_argument when `n` is not positive
   * @throw strata::out_of_memory with the slots asked and available; nothing is allocated
   */
  [[nodiscard]] std::vector<std::int64_t> allocate(std::int64_t n)
  {
    STRATA_EXPECTS(n > 0, "slot_allocator: slots asked must be positive, got ", n);
    std::lock_guard lock{m_};
    STRATA_EXPECTS_AS(out_of_memory, n <= available_unlocked(), "slot_allocator: asked for ", n, " slots, ",
                      available_unlocked(), " of ", capacity_unlocked(), " available");
    std::vector<std::int64_t> out;
    out.reserve(static_cast<std::size_t>(n));
    while (std::int64_t(out.size()) < n) {
      std::int64_t const s = free_.back();
      free_.pop_back();
      if (allocated_[static_cast<std::size_t>(s)]) {  // claimed while it waited here (`claim`)
        --claimed_;
        continue;
      }
      allocated_[static_cast<std::size_t>(s)] = true;
      out.push_back(s);
    }
    // Ascending: slots freed together come back in the order of the pages that take them, so a
    // prefix's pages stay in runs on each tier and its copies merge (or go as strided copies).
    std::sort(out.begin(), out.end());
    return out;
  }

  /**
   * @brief Allocates these very slots (a store that kept its records across a restart hands them to
   *        the index that adopts them).
   * @throw strata::invalid_argument for a slot out of range, allocated, or listed twice; nothing is
   *        allocated then
   */
  void claim(std::span<std::int64_t const> slots)
  {
    std::lock_guard lock{m_};
    for (std::size_t i = 0; i < slots.size(); ++i) {
      auto const s = slots[i];
      bool const in_range = s >= 0 && s < capacity_unlocked();
      if (!in_range || allocated_[static_cast<std::size_t>(s)]) {
        for (std::size_t j = 0; j < i; ++j) {
          allocated_[static_cast<std::size_t>(slots[j])] = false;
        }  // undo
        STRATA_EXPECTS(in_range, "slot_allocator: slot ", s, " out of range [0, ", capacity_unlocked(), ")");
        STRATA_EXPECTS(false, "slot_allocator: slot ", s, " is allocated (or listed twice)");
      }
      allocated_[static_cast<std::size_t>(s)] = true;
    }
    // Its entry in the free stack stays, skipped when it comes up: O(1) per slot.
    claimed_ += static_cast<std::int64_t>(slots.size());
  }

  /**
   * @brief Returns slots to the store.
   * @throw strata::invalid_argument for a slot out of range, not allocated, or listed twice;
   *        nothing is released then
   */
  void release(std::span<std::int64_t const> slots)
  {
    std::lock_guard lock{m_};
    for (std::size_t i = 0; i < slots.size(); ++i) {
      auto const s = slots[i];
      bool const in_range = s >= 0 && s < capacity_unlocked();
      if (!in_range || !allocated_[static_cast<std::size_t>(s)]) {
        for (std::size_t j = 0; j < i; ++j) {
          allocated_[static_cast<std::size_t>(slots[j])] = true;
        }  // undo
        STRATA_EXPECTS(in_range, "slot_allocator: slot ", s, " out of range [0, ", capacity_unlocked(), ")");
        STRATA_EXPECTS(false, "slot_allocator: slot ", s, " is not allocated (released twice, or listed twice)");
      }
      allocated_[static_cast<std::size_t>(s)] = false;  // so that a repeat later in `slots` is caught
    }
    for (auto s : slots) {
      free_.push_back(s);
    }
  }

 private:
  [[nodiscard]] std::int64_t capacity_unlocked() const noexcept { return static_cast<std::int64_t>(allocated_.size()); }
  [[nodiscard]] std::int64_t available_unlocked() const noexcept
  { return static_cast<std::int64_t>(free_.size()) - claimed_; }

  mutable std::mutex m_;
  std::vector<bool> allocated_;
  std::vector<std::int64_t> free_;  // a stack: back() is handed out next (unless claimed since)
  std::int64_t claimed_ = 0;        // entries of `free_` whose slot `claim` took
};

/// @brief Slot allocators the tiers lend the prefix index (host and file; null: the index makes its
///        own from the configured capacity). Indexed by `tier`; the device and remote entries are unused.
using tier_slots = std::array<slot_allocator*, tier_count>;

}  // namespace strata
