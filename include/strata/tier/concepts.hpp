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
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

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
 *        stores are record stores; a load from one goes through the host tier, or through an
 *        executor's staging. Executors call `read` and `write` from their own record threads, beside
 *        the prefix index allocating `slots()` on its thread: a record store is thread-safe.
 */
template <class T>
concept record_store =
    page_store<T> && requires(T& t, std::span<std::int64_t const> slots, std::span<std::byte* const> records,
                              std::span<std::byte const* const> sources) {
      { t.write(slots, sources) } -> std::same_as<bool>;
      { t.read(slots, records) } -> std::same_as<bool>;
    };

/**
 * @brief A record store that knows each record's page. Reads check each record's content key
 *        (`read(slots, records, expected_keys)`: a slot that holds another page fails the read, so a
 *        slot reused meanwhile is never served as this page); writes keep the page's identity — its
 *        key, the key of the page before it, its ids (`write(slots, sources, keys, parent_keys,
 *        ids)`), at most `T::max_record_ids` ids per page — so that a restart can rebuild the index.
 *        Executors pass keys and identities to such stores; a plain `record_store` gets neither.
 */
template <class T>
concept keyed_record_store =
    record_store<T> && requires(T& t, std::span<std::int64_t const> slots, std::span<std::byte* const> records,
                                std::span<std::byte const* const> sources, std::span<std::uint64_t const> keys,
                                std::span<std::int32_t const> ids) {
      { t.read(slots, records, keys) } -> std::same_as<bool>;
      { t.write(slots, sources, keys, keys, ids) } -> std::same_as<bool>;
      { T::max_record_ids } -> std::convertible_to<std::int64_t>;
    };

/**
 * @brief A keyed record store that says which records of a read arrived:
 *        `read(slots, records, expected_keys, intact)` (keys may be empty: any key) sets
 *        `intact[i]` for each record, so that one bad record fails its own page, not the batch.
 *        Executors report such pages one by one (`loss_reporting_executor`); of a plain store's
 *        failed read every record is lost.
 */
template <class T>
concept page_status_store =
    keyed_record_store<T> && requires(T& t, std::span<std::int64_t const> slots, std::span<std::byte* const> records,
                                      std::span<std::uint64_t const> keys, std::span<bool> intact) {
      { t.read(slots, records, keys, intact) } -> std::same_as<bool>;
    };

/// @brief An asynchronous read or write in flight (`async_record_store`: `submit_read` / `submit_write`).
struct io_ticket {
  std::uint64_t id{};  ///< 0 is never issued
};

/// @brief State of an asynchronous operation.
enum class io_status {
  pending,    ///< still moving
  succeeded,  ///< every record moved intact
  failed      ///< at least one record did not (the store says why, e.g. `file_store::last_error()`)
};

/**
 * @brief A page-status store whose transfers run on its own I/O queues: `submit_read(slots,
 *        records, expected_keys)` and `submit_write(slots, sources, keys, parent_keys, ids)` start
 *        them and return at once (buffers stay valid until the ticket completes), `poll(ticket,
 *        intact)` never blocks, `wait(ticket, intact)` does; a completed ticket is consumed.
 *        Executors start such a store's record I/O in `submit` and finish it when polled, so that
 *        no caller waits for a disk; every call may come from any thread.
 */
template <class T>
concept async_record_store =
    page_status_store<T> && requires(T& t, std::span<std::int64_t const> slots, std::span<std::byte* const> records,
                                     std::span<std::byte const* const> sources, std::span<std::uint64_t const> keys,
                                     std::span<std::int32_t const> ids, io_ticket ticket, std::span<bool> intact) {
      { t.submit_read(slots, records, keys) } -> std::same_as<io_ticket>;
      { t.submit_write(slots, sources, keys, keys, ids) } -> std::same_as<io_ticket>;
      { t.poll(ticket, intact) } -> std::same_as<io_status>;
      { t.wait(ticket, intact) } -> std::same_as<bool>;
    };

/**
 * @brief A keyed record store whose records outlive the process: reopened, it lists the intact
 *        records it kept (`recovered()`: each with its `slot`, `key`, `parent_key` and `ids`) with
 *        their slots allocated, and says which key a slot holds now (`key(slot)`). A cache
 *        controller over one gives the slots back and lets the index adopt every prefix they chain to.
 */
template <class T>
concept restorable_store = keyed_record_store<T> && requires(T& t, std::int64_t slot) {
  { t.key(slot) } -> std::same_as<std::optional<std::uint64_t>>;
  { t.recovered().size() } -> std::convertible_to<std::size_t>;
  { t.recovered()[0].slot } -> std::convertible_to<std::int64_t>;
  { t.recovered()[0].key } -> std::convertible_to<std::uint64_t>;
  { t.recovered()[0].parent_key } -> std::convertible_to<std::uint64_t>;
  { t.recovered()[0].ids[0] } -> std::convertible_to<std::int32_t>;
};

}  // namespace strata
