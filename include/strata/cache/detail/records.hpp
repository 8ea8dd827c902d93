// SPDX-License-Identifier: Apache-2.0
/**
 * @file cache/detail/records.hpp
 * @brief What both executors do with a submission's copy orders: group them by direction (one copy
 *        plan per pair of tiers), lay out the page-first host records a record store moves through,
 *        and read or write those records with each page's key and identity where the store keeps them.
 */
#pragma once

#include <strata/error.hpp>
#include <strata/layout/page_first.hpp>
#include <strata/tier/concepts.hpp>
#include <strata/transfer/copy_plan.hpp>
#include <strata/types.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace strata {

namespace detail {

/// @brief The pages of `orders` that move from one tier to another, in order, with what a record
///        store keeps of each (`copy_order::keys`, `parent_key`, `ids`).
struct direction {
  std::vector<page_pair> pairs;
  std::vector<std::uint64_t> keys;         ///< per pair (empty unless every order carries keys)
  std::vector<std::uint64_t> parent_keys;  ///< per pair, with `keys`
  std::vector<std::int32_t> ids;           ///< `ids_per_page` per pair (empty unless every order carries them)
  std::int64_t ids_per_page = 0;
};

/// @brief Pairs `[at, at + m)` of `d`, with what a record store keeps of them.
inline direction slice(direction const& d, std::size_t at, std::size_t m)
{
  direction out;
  auto const cut = [&](auto const& v, std::size_t per) {
    using V = std::remove_cvref_t<decltype(v)>;
    return v.empty() ? V{} : V(v.begin() + std::ptrdiff_t(at * per), v.begin() + std::ptrdiff_t((at + m) * per));
  };
  out.pairs = cut(d.pairs, 1);
  out.keys = cut(d.keys, 1);
  out.parent_keys = cut(d.parent_keys, 1);
  out.ids = cut(d.ids, std::size_t(d.ids_per_page));
  out.ids_per_page = d.ids_per_page;
  return out;
}

/// @brief The pages of `orders` that move from tier `from` to tier `to`.
inline direction direction_between(std::span<copy_order const> orders, tier from, tier to)
{
  direction d;
  bool keys = true, ids = true;
  for (auto const& o : orders) {
    if (o.from != from || o.to != to) { continue; }
    keys = keys && o.keys.size() == o.from_pages.size();
    ids = ids && o.ids_per_page > 0 && o.ids.size() == o.from_pages.size() * std::size_t(o.ids_per_page) &&
          (d.ids_per_page == 0 || d.ids_per_page == o.ids_per_page);
    if (ids) { d.ids_per_page = o.ids_per_page; }
    for (std::size_t i = 0; i < o.from_pages.size(); ++i) {
      d.pairs.push_back({o.from_pages[i], o.to_pages[i]});
      if (keys) {
        d.keys.push_back(o.keys[i]);
        d.parent_keys.push_back(i == 0 ? o.parent_key : o.keys[i - 1]);
      }
    }
    if (ids) { d.ids.insert(d.ids.end(), o.ids.begin(), o.ids.end()); }
  }
  if (!keys) { d.keys.clear(), d.parent_keys.clear(); }
  if (!ids) { d.ids.clear(), d.ids_per_page = 0; }
  return d;
}

/**
 * @brief Calls `f(src_store, dst_store, direction)` once per (from, to) tier pair present in
 *        `orders`, with the pages of every order between them (one copy plan per direction instead
 *        of one per node).
 */
template <class Tiers, class F>
void for_each_direction(Tiers& tiers, std::span<copy_order const> orders, F&& f)
{
  bool seen[tier_count][tier_count]{};
  for (auto const& o : orders) {
    auto const a = std::size_t(o.from), b = std::size_t(o.to);
    if (seen[a][b]) { continue; }
    seen[a][b] = true;
    direction const d = direction_between(orders, o.from, o.to);
    tiers.for_each([&](auto& src) {
      if (std::remove_cvref_t<decltype(src)>::kind != o.from) { return; }
      tiers.for_each([&](auto& dst) {
        if (std::remove_cvref_t<decltype(dst)>::kind != o.to) { return; }
        f(src, dst, d);
      });
    });
  }
}

/// @brief A copy through page-first host records, record `i` holding pair `i`: the slots, the
///        records' addresses, and the pairs of both legs (source -> record, record -> destination).
struct record_legs {
  std::vector<std::int64_t> from, to;  ///< source and destination slot of each pair
  std::vector<std::byte*> at;          ///< record i
  std::vector<page_pair> in, out;      ///< {source, i} and {i, destination}

  record_legs(std::span<page_pair const> pairs, page_first const& records)
      : from(pairs.size()), to(pairs.size()), at(pairs.size()), in(pairs.size()), out(pairs.size())
  {
    for (std::size_t i = 0; i < pairs.size(); ++i) {
      auto const r = std::int64_t(i);
      from[i] = pairs[i].src;
      to[i] = pairs[i].dst;
      at[i] = records.page_data(r);
      in[i] = {pairs[i].src, r};
      out[i] = {r, pairs[i].dst};
    }
  }
  /// Records in place, in a page-first layout (`holds_records_v`): record i is the destination
  /// page of pair i (a read straight into it) or its source page (a write straight from it).
  template <class L>
  [[nodiscard]] static record_legs in_place(std::span<page_pair const> pairs, L const& pages, bool at_destination)
  {
    record_legs legs{pairs.size()};
    for (std::size_t i = 0; i < pairs.size(); ++i) {
      legs.from[i] = pairs[i].src;
      legs.to[i] = pairs[i].dst;
      legs.at[i] = pages.page_data(at_destination ? pairs[i].dst : pairs[i].src);
    }
    return legs;
  }
  /// The records as sources of a write.
  [[nodiscard]] std::vector<std::byte const*> sources() const { return {at.begin(), at.end()}; }

 private:
  explicit record_legs(std::size_t n) : from(n), to(n), at(n) {}
};

/// @brief Whether layout `L` keeps each page as one contiguous page-first record: a record store
///        then reads into and writes from its pages in place, with no bounce buffer and no copy.
template <class L>
inline constexpr bool holds_records_v = std::is_same_v<L, page_first> || std::is_same_v<L, page_first_chunked>;

/// @brief Whether store `S` is addressable with a layout that `holds_records_v`.
template <class S>
[[nodiscard]] constexpr bool holds_records() noexcept
{
  if constexpr (addressable_store<S>) {
    return holds_records_v<std::remove_cvref_t<decltype(std::declval<S const&>().layout())>>;
  } else {
    return false;
  }
}

/// @brief A record read that did not bring every page back intact: the slots of tier `from` that
///        it lost (the others arrived). Executors throw it out of a direction, and report the slots.
class records_unread : public error {
 public:
  records_unread(std::string const& what, tier tier_read, std::vector<std::int64_t> lost)
      : error(what), from(tier_read), slots(std::move(lost))
  {
  }
  tier from;                        ///< the record tier read
  std::vector<std::int64_t> slots;  ///< its slots whose records did not arrive intact
};

/// @brief `read_records`' read: the slots lost go to `lost` (left empty when all arrived).
template <record_store S>
void read_records_into(S& store, record_legs const& legs, direction const& d, std::vector<std::int64_t>& lost)
{
  if constexpr (page_status_store<S>) {
    std::unique_ptr<bool[]> intact{new bool[legs.from.size()]};
    std::span<std::uint64_t const> const keys{d.keys};
    if (store.read(legs.from, legs.at, keys, std::span<bool>{intact.get(), legs.from.size()})) { return; }
    for (std::size_t i = 0; i < legs.from.size(); ++i) {
      if (!intact[i]) { lost.push_back(legs.from[i]); }
    }
  } else {
    bool ok = false;
    if constexpr (keyed_record_store<S>) {
      ok = d.keys.empty() ? store.read(legs.from, legs.at)
                          : store.read(legs.from, legs.at, std::span<std::uint64_t const>{d.keys});
    } else {
      ok = store.read(legs.from, legs.at);
    }
    if (!ok) { lost = legs.from; }
  }
}

/// @brief The `records_unread` of a read of `legs` from tier `from` that lost `lost` (`error`: why
///        the read as a whole failed, when it threw).
inline records_unread unread(tier from, record_legs const& legs, std::vector<std::int64_t> lost, char const* who,
                             char const* error = nullptr)
{
  if (error != nullptr) {
    return records_unread(concat("strata: ", who, ": reading ", legs.from.size(), " records from the ", to_string(from),
                                 " tier failed: ", error),
                          from, legs.from);
  }
  std::string what = concat("strata: ", who, ": ", lost.size(), " of ", legs.from.size(), " records read from the ",
                            to_string(from), " tier did not arrive intact (a miss)");
  return records_unread(what, from, std::move(lost));
}

/// @brief Reads the records of `legs` from record store `store`, refusing records of other keys
///        where the store checks them (`keyed_record_store`) and the orders carry keys.
/// @throw records_unread naming the slots lost: those a `page_status_store` says did not arrive,
///        every slot of the read for another store, and for a read that throws
template <record_store S>
void read_records(S& store, record_legs const& legs, direction const& d, char const* who)
{
  std::vector<std::int64_t> lost;
  try {
    read_records_into(store, legs, d, lost);
  } catch (std::exception const& e) {  // an I/O error as an exception, no memory: nothing is known intact
    throw unread(S::kind, legs, {}, who, e.what());
  }
  if (!lost.empty()) { throw unread(S::kind, legs, std::move(lost), who); }
}

/// @brief A read of an `async_record_store` in flight: its records (`legs`), what it checks them
///        against (`part`), its ticket and where the store says which arrived.
struct record_read {
  direction part;
  record_legs legs;
  io_ticket ticket;
  std::unique_ptr<bool[]> intact;
};

/// @brief Starts reading pairs `part` into `records` (checking keys where `part` has them).
/// @throw as the store's `submit_read`: nothing started
template <async_record_store S>
[[nodiscard]] record_read start_read(S& store, direction part, page_first const& records)
{
  record_legs legs{part.pairs, records};
  std::unique_ptr<bool[]> intact{new bool[legs.from.size()]};
  io_ticket const t = store.submit_read(legs.from, legs.at, std::span<std::uint64_t const>{part.keys});
  return record_read{std::move(part), std::move(legs), t, std::move(intact)};
}

/// @brief Waits for `r`. @throw records_unread as `read_records`
template <async_record_store S>
void finish_read(S& store, record_read& r, char const* who)
{
  std::span<bool> const intact{r.intact.get(), r.legs.from.size()};
  bool ok = false;
  try {
    ok = store.wait(r.ticket, intact);
  } catch (std::exception const& e) {
    throw unread(S::kind, r.legs, {}, who, e.what());
  }
  if (ok) { return; }
  std::vector<std::int64_t> lost;
  for (std::size_t i = 0; i < intact.size(); ++i) {
    if (!intact[i]) { lost.push_back(r.legs.from[i]); }
  }
  if (!lost.empty()) { throw unread(S::kind, r.legs, std::move(lost), who); }
}

/// @brief Writes the records of `legs` to record store `store`, with each page's identity where the
///        store keeps it (`keyed_record_store`). @return whether all were written
template <record_store S>
[[nodiscard]] bool write_records(S& store, record_legs const& legs, direction const& d)
{
  auto const sources = legs.sources();
  if constexpr (keyed_record_store<S>) {
    if (!d.keys.empty()) {
      return store.write(legs.to, std::span<std::byte const* const>{sources}, std::span<std::uint64_t const>{d.keys},
                         std::span<std::uint64_t const>{d.parent_keys}, std::span<std::int32_t const>{d.ids});
    }
  }
  return store.write(legs.to, std::span<std::byte const* const>{sources});
}

}  // namespace detail

}  // namespace strata
