// SPDX-License-Identifier: Apache-2.0
/**
 * @file tier/concepts.hpp
 * @brief What a tier is to the cache controller: a page store with a capacity and one slot
 *        allocator (its only owner), reached either through a layout (GPU-addressable stores: the
 *        device pool, pinned host memory) or through host records (record stores: files, remote).
 */
#pragma once

#include <strata/geometry.hpp>
#include <strata/layout/layout.hpp>
#include <strata/tier/slot_allocator.hpp>
#include <strata/types.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>

namespace strata {

/**
 * @brief A page store of one tier.
 *
 * `T::kind` is the tier it serves; `geometry()` the page shape it holds; `capacity()` its pages;
 * `slots()` the allocator of its page ids `[0, capacity())`. Exactly one owner allocates from
 * `slots()`: the controller for the device tier, the prefix index for the others.
 */
template <class T>
concept page_store = requires(T& t, T const& ct) {
  { T::kind } -> std::convertible_to<tier>;
  { ct.geometry() } -> std::convertible_to<kv_geometry>;
  { ct.capacity() } -> std::same_as<std::int64_t>;
  { t.slots() } -> std::same_as<slot_allocator&>;
};

/**
 * @brief A page store whose pages a copy engine or a kernel addresses through a `kv_layout`
 *        (`layout()`): the device pool and host memory. Copies between two such stores are copy plans.
 */
template <class T>
concept addressable_store = page_store<T> && requires(T const& t) { t.layout(); } &&
                            kv_layout<std::remove_cvref_t<decltype(std::declval<T const&>().layout())>>;

/**
 * @brief A page store reached through host memory: `write(slots, records)` stores one page-first
 *        record per slot from host memory, `read(slots, records)` fetches them; both return whether
 *        every record moved intact (a failed read is a miss, never wrong bytes). Files and remote
 *        stores are record stores; a load from one goes through the host tier.
 */
template <class T>
concept record_store =
    page_store<T> && requires(T& t, std::span<std::int64_t const> slots, std::span<std::byte* const> records,
                              std::span<std::byte const* const> sources) {
      { t.write(slots, sources) } -> std::same_as<bool>;
      { t.read(slots, records) } -> std::same_as<bool>;
    };

}  // namespace strata
