// SPDX-License-Identifier: Apache-2.0
/**
 * @file cache/executor.hpp
 * @brief How the cache controller's copy orders become copies: the `copy_executor` concept, and
 *        `host_executor`, which runs them with `host_copy` on the calling thread.
 *
 * The controller stays host-only: it hands an executor the tree's copy orders (tier slots to tier
 * slots) with the tier stack, and asks later whether each submission landed. The executor turns
 * orders into copy plans between the two stores' layouts and runs them its way: `host_executor`
 * with `memcpy`, `gpu_executor` (`cache/gpu_executor.cuh`) through a GPU transfer backend chosen
 * per transfer, the simulator's `virtual_executor` in virtual time.
 */
#pragma once

#include <strata/error.hpp>
#include <strata/layout/page_first.hpp>
#include <strata/tier/concepts.hpp>
#include <strata/transfer/host_copy.hpp>
#include <strata/types.hpp>

#include <concepts>
#include <cstdint>
#include <span>
#include <vector>

namespace strata {

/// @brief Where a submitted copy stands.
enum class copy_status {
  pending,  ///< not yet landed
  done,     ///< landed: the destination holds the bytes
  failed,   ///< will never land: the destination holds nothing usable
};

/// @brief What a submission moves: loads onto the device (per-layer completion matters) or other
///        copies (backups, demotions: only the end matters).
enum class copy_kind { load, copy };

/**
 * @brief An executor of copy orders over a tier stack `Tiers`.
 *
 * - `E::stream_type`: what orders submissions (a CUDA stream; an empty tag on the CPU);
 * - `E::handle_type`: one submission (copyable; an empty handle is done);
 * - `e.submit(tiers, orders, kind, stream) -> handle_type`: starts every order (they share one
 *   handle; the controller never submits an empty list);
 * - `e.status(handle) -> copy_status`, callable from any thread for a handle it returned.
 */
template <class E, class Tiers>
concept copy_executor = std::copyable<typename E::handle_type> && std::default_initializable<typename E::stream_type> &&
                        requires(E& e, E const& ce, Tiers& tiers, std::span<copy_order const> orders, copy_kind kind,
                                 typename E::stream_type stream, typename E::handle_type const& h) {
                          { e.submit(tiers, orders, kind, stream) } -> std::same_as<typename E::handle_type>;
                          { ce.status(h) } -> std::same_as<copy_status>;
                        };

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
  /// The records as sources of a write.
  [[nodiscard]] std::vector<std::byte const*> sources() const { return {at.begin(), at.end()}; }
};

/// @brief Reads the records of `legs` from record store `store`, refusing records of other keys
///        where the store can check them and the orders carry keys. @return whether all arrived intact
template <class S>
[[nodiscard]] bool read_records(S& store, record_legs const& legs, direction const& d)
{
  if constexpr (requires { store.read(legs.from, legs.at, std::span<std::uint64_t const>{d.keys}); }) {
    if (!d.keys.empty()) { return store.read(legs.from, legs.at, std::span<std::uint64_t const>{d.keys}); }
  }
  return store.read(legs.from, legs.at);
}

/// @brief Writes the records of `legs` to record store `store`, with each page's identity where the
///        store keeps it. @return whether all were written
template <class S>
[[nodiscard]] bool write_records(S& store, record_legs const& legs, direction const& d)
{
  auto const sources = legs.sources();
  if constexpr (requires {
                  store.write(legs.to, std::span<std::byte const* const>{sources},
                              std::span<std::uint64_t const>{d.keys}, std::span<std::uint64_t const>{d.parent_keys},
                              std::span<std::int32_t const>{d.ids});
                }) {
    if (!d.keys.empty()) {
      return store.write(legs.to, std::span<std::byte const* const>{sources}, std::span<std::uint64_t const>{d.keys},
                         std::span<std::uint64_t const>{d.parent_keys}, std::span<std::int32_t const>{d.ids});
    }
  }
  return store.write(legs.to, std::span<std::byte const* const>{sources});
}

}  // namespace detail

/**
 * @brief Runs copy orders at once on the calling thread with `host_copy` (a CPU engine, tests, the
 *        reference the GPU executor is checked against). Addressable stores are copied between
 *        directly (their memory must be the CPU's); a record store (a file tier) is read into, or
 *        written from, page-first records in host memory, transposed to or from the other side's
 *        layout as it goes.
 */
class host_executor {
 public:
  /// @brief No stream on the CPU.
  struct stream_type {};
  /// @brief A finished submission: done, or failed (a store without a layout, a rejected plan).
  struct handle_type {
    bool failed = false;
  };

  /**
   * @brief Copies every order now. A direction whose stores are not both addressable, or whose plan
   *        `validate` rejects, fails the submission (nothing of it is copied).
   */
  template <class Tiers>
  handle_type submit(Tiers& tiers, std::span<copy_order const> orders, copy_kind, stream_type = {})
  {
    handle_type h;
    try {
      detail::for_each_direction(tiers, orders, [&](auto& src, auto& dst, detail::direction const& d) {
        std::span<page_pair const> const pairs{d.pairs};
        using S = std::remove_cvref_t<decltype(src)>;
        using D = std::remove_cvref_t<decltype(dst)>;
        kv_geometry const g = src.geometry();
        if constexpr (addressable_store<S> && addressable_store<D>) {
          host_copy{}.copy(copy_plan{src.layout(), dst.layout(), pairs, layer_range::all(g)});
        } else if constexpr ((addressable_store<S> || record_store<S>) && (addressable_store<D> || record_store<D>)) {
          // Through page-first records in host memory: record i holds pair i.
          std::int64_t const n = std::int64_t(pairs.size());
          bounce_.resize(std::size_t(n * g.page_bytes()));
          page_first const records{bounce_.data(), g, n};
          detail::record_legs const legs{pairs, records};
          if constexpr (record_store<S>) {
            STRATA_EXPECTS(detail::read_records(src, legs, d), "host_executor: reading ", n, " records from the ",
                           to_string(S::kind), " tier failed");
          } else {
            host_copy{}.copy(
                copy_plan{src.layout(), records, std::span<page_pair const>{legs.in}, layer_range::all(g)});
          }
          if constexpr (record_store<D>) {
            STRATA_EXPECTS(detail::write_records(dst, legs, d), "host_executor: writing ", n, " records to the ",
                           to_string(D::kind), " tier failed");
          } else {
            host_copy{}.copy(
                copy_plan{records, dst.layout(), std::span<page_pair const>{legs.out}, layer_range::all(g)});
          }
        } else {
          STRATA_EXPECTS(false, "host_executor: no copy between the ", to_string(S::kind), " and ", to_string(D::kind),
                         " tiers (each needs a layout or records)");
        }
      });
    } catch (invalid_argument const&) {
      h.failed = true;
    }
    ++submissions_;
    return h;
  }
  /// @brief `done`, or `failed`.
  [[nodiscard]] copy_status status(handle_type const& h) const noexcept
  { return h.failed ? copy_status::failed : copy_status::done; }
  /// @brief Submissions so far.
  [[nodiscard]] std::int64_t submissions() const noexcept { return submissions_; }

 private:
  std::int64_t submissions_ = 0;
  std::vector<std::byte> bounce_;  // page-first records to and from record stores
};

}  // namespace strata
