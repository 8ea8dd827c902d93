// SPDX-License-Identifier: Apache-2.0
/**
 * @file tier/tier_stack.hpp
 * @brief `tier_stack<Tiers...>`: the tiers of one cache, fastest first, as a static set.
 */
#pragma once

#include <strata/tier/concepts.hpp>
#include <strata/tier/slot_allocator.hpp>

#include <tuple>
#include <type_traits>
#include <utility>

namespace strata {

/**
 * @brief The page stores of one cache, fastest first: a device tier, then any of host, file and
 *        remote, each at most once and in that order.
 *
 * Holds its stores by value, or by reference when a `Tiers` is a reference type (a store the
 * engine keeps, e.g. `tier_stack<device_pool<L>, pinned_host_pool&>`). Each store owns its slot
 * allocator; `slots()` lends the host and file allocators to the prefix index, which is then their
 * only user.
 *
 * @tparam Tiers `page_store` types (or references to them)
 */
template <class... Tiers>
requires(sizeof...(Tiers) >= 1 && (page_store<std::remove_cvref_t<Tiers>> && ...))
class tier_stack {
  static constexpr std::array<tier, sizeof...(Tiers)> kinds_{std::remove_cvref_t<Tiers>::kind...};
  static constexpr bool ordered()
  {
    for (std::size_t i = 1; i < kinds_.size(); ++i) {
      if (kinds_[i] <= kinds_[i - 1]) { return false; }
    }
    return kinds_[0] == tier::device;
  }
  static_assert(ordered(), "tier_stack: the first tier must be the device, the others distinct and slower in order");

 public:
  /// @brief The store types, references removed.
  template <std::size_t I>
  using store_type = std::remove_cvref_t<std::tuple_element_t<I, std::tuple<Tiers...>>>;
  /// @brief Tiers in the stack.
  static constexpr std::size_t size = sizeof...(Tiers);

  /**
   * @param tiers the stores, fastest first
   * @throw strata::invalid_argument when the stores' geometries differ
   */
  explicit tier_stack(Tiers&&... tiers) : tiers_{std::forward<Tiers>(tiers)...}
  {
    kv_geometry const g = std::get<0>(tiers_).geometry();
    for_each([&](auto const& s) {
      STRATA_EXPECTS(kv_geometry(s.geometry()) == g, "tier_stack: the ",
                     to_string(std::remove_cvref_t<decltype(s)>::kind), " tier holds pages of geometry ",
                     kv_geometry(s.geometry()), ", the device tier ", g);
    });
  }

  /// @brief Whether the stack has tier `t`.
  [[nodiscard]] static constexpr bool has(tier t) noexcept
  {
    for (auto k : kinds_) {
      if (k == t) { return true; }
    }
    return false;
  }
  /// @brief Index in `Tiers` of tier `K` (only for a tier the stack has).
  template <tier K>
  static constexpr std::size_t index_of() noexcept
  {
    static_assert(has(K), "tier_stack: no such tier");
    for (std::size_t i = 0; i < kinds_.size(); ++i) {
      if (kinds_[i] == K) { return i; }
    }
    return 0;
  }
  /// @brief The store of tier `K`.
  template <tier K>
  [[nodiscard]] auto& get() noexcept
  { return std::get<index_of<K>()>(tiers_); }
  /// @brief The store of tier `K`.
  template <tier K>
  [[nodiscard]] auto const& get() const noexcept
  { return std::get<index_of<K>()>(tiers_); }
  /// @brief The device store.
  [[nodiscard]] auto& device() noexcept { return std::get<0>(tiers_); }
  /// @brief The device store.
  [[nodiscard]] auto const& device() const noexcept { return std::get<0>(tiers_); }

  /// @brief Shape of every tier's pages.
  [[nodiscard]] kv_geometry geometry() const { return std::get<0>(tiers_).geometry(); }
  /// @brief Pages of tier `t` (0 when absent).
  [[nodiscard]] std::int64_t capacity(tier t) const
  {
    std::int64_t c = 0;
    for_each([&](auto const& s) {
      if (std::remove_cvref_t<decltype(s)>::kind == t) { c = s.capacity(); }
    });
    return c;
  }
  /// @brief The host and file tiers' slot allocators, for `hiradix_tree` (null where absent or of
  ///        no capacity).
  [[nodiscard]] tier_slots slots()
  {
    tier_slots out{};
    for_each([&](auto& s) {
      constexpr tier k = std::remove_cvref_t<decltype(s)>::kind;
      if constexpr (k == tier::host || k == tier::file) {
        if (s.capacity() > 0) { out[std::size_t(k)] = &s.slots(); }
      }
    });
    return out;
  }

  /// @brief Calls `f(store)` for every store, fastest first.
  template <class F>
  void for_each(F&& f)
  {
    std::apply([&](auto&... s) { (f(s), ...); }, tiers_);
  }
  /// @brief Calls `f(store)` for every store, fastest first.
  template <class F>
  void for_each(F&& f) const
  {
    std::apply([&](auto const&... s) { (f(s), ...); }, tiers_);
  }

 private:
  std::tuple<Tiers...> tiers_;
};

/// @brief Deduces a stack of stores held by value: `tier_stack{device_pool{layout}, host_pool{g, n}}`.
template <class... Tiers>
tier_stack(Tiers&&...) -> tier_stack<std::remove_cvref_t<Tiers>...>;

}  // namespace strata
