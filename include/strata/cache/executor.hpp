// SPDX-License-Identifier: Apache-2.0
/**
 * @file cache/executor.hpp
 * @brief How the cache controller's copy orders become copies: the `copy_executor` and
 *        `stream_checked_executor` concepts, and `cpu_executor` (a CPU engine's), which runs them
 *        with `host_copy` on the calling thread.
 *
 * The controller stays host-only: it hands an executor the tree's copy orders (tier slots to tier
 * slots) with the tier stack, and asks later whether each submission landed. The executor turns
 * orders into copy plans between the two stores' layouts and runs them its way: `cpu_executor`
 * with `memcpy`, `gpu_executor` (`cache/gpu_executor.cuh`) through a GPU transfer backend chosen
 * per transfer, the simulator's `virtual_executor` in virtual time.
 */
#pragma once

#include <strata/cache/detail/records.hpp>
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

/// @brief What a submission moves: a batch's loads onto the device (per-layer completion matters,
///        the engine waits for them), or background copies — backups, demotions, prefetches — of
///        which only the end matters.
enum class copy_kind { load, background };

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

/**
 * @brief An executor that can tell a stream it cannot order its copies with (a CUDA stream of
 *        another device): `e.check_stream(stream)` throws `strata::invalid_argument` for it. The
 *        cache controller calls it before any call changes anything.
 */
template <class E>
concept stream_checked_executor = requires(E const& e, typename E::stream_type const& stream) {
  { e.check_stream(stream) } -> std::same_as<void>;
};

/// @brief A record page a failed submission did not read back intact: its tier and slot.
struct lost_record {
  tier from = tier::file;  ///< the record tier read
  std::int64_t slot = 0;   ///< the slot whose record did not arrive
  friend bool operator==(lost_record const&, lost_record const&) = default;
};

/**
 * @brief An executor that says which record pages a failed submission lost: `e.lost(h)` lists
 *        them (empty when nothing was lost reading records: the copy failed for another reason).
 *        The cache controller then drops those pages (and what hangs below them) from the index
 *        and keeps the rest; of another executor's failed submission it drops every record page read.
 */
template <class E>
concept loss_reporting_executor = requires(E const& e, typename E::handle_type const& h) {
  { e.lost(h) } -> std::same_as<std::vector<lost_record>>;
};

/**
 * @brief Runs copy orders at once on the calling thread with `host_copy` (a CPU engine, tests, the
 *        reference the GPU executor is checked against). Addressable stores are copied between
 *        directly (their memory must be the CPU's); a record store (a file tier) is read into, or
 *        written from, page-first records in host memory, transposed to or from the other side's
 *        layout as it goes.
 */
class cpu_executor {
 public:
  /// @brief No stream on the CPU.
  struct stream_type {};
  /// @brief A finished submission: done, or failed (a store without a layout, a rejected plan,
  ///        records that did not arrive intact: `lost`).
  struct handle_type {
    bool failed = false;
    std::vector<lost_record> lost;  ///< record pages a failed read lost
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
        } else if constexpr (record_store<S> && detail::holds_records<D>()) {
          // Into page-first memory: the records are read in place.
          auto const legs = detail::record_legs::in_place(pairs, dst.layout(), true);
          detail::read_records(src, legs, d, "cpu_executor");
        } else if constexpr (record_store<D> && detail::holds_records<S>()) {
          auto const legs = detail::record_legs::in_place(pairs, src.layout(), false);
          STRATA_EXPECTS(detail::write_records(dst, legs, d), "cpu_executor: writing ", pairs.size(),
                         " records to the ", to_string(D::kind), " tier failed");
        } else if constexpr ((addressable_store<S> || record_store<S>) && (addressable_store<D> || record_store<D>)) {
          // Through page-first records in host memory: record i holds pair i.
          std::int64_t const n = std::int64_t(pairs.size());
          bounce_.resize(std::size_t(n * g.page_bytes()));
          page_first const records{bounce_.data(), g, n};
          detail::record_legs const legs{pairs, records};
          if constexpr (record_store<S>) {
            detail::read_records(src, legs, d, "cpu_executor");
          } else {
            host_copy{}.copy(
                copy_plan{src.layout(), records, std::span<page_pair const>{legs.in}, layer_range::all(g)});
          }
          if constexpr (record_store<D>) {
            STRATA_EXPECTS(detail::write_records(dst, legs, d), "cpu_executor: writing ", n, " records to the ",
                           to_string(D::kind), " tier failed");
          } else {
            host_copy{}.copy(
                copy_plan{records, dst.layout(), std::span<page_pair const>{legs.out}, layer_range::all(g)});
          }
        } else {
          STRATA_EXPECTS(false, "cpu_executor: no copy between the ", to_string(S::kind), " and ", to_string(D::kind),
                         " tiers (each needs a layout or records)");
        }
      });
    } catch (detail::records_unread const& e) {
      h.failed = true;
      for (auto s : e.slots) {
        h.lost.push_back({e.from, s});
      }
    } catch (std::exception const&) {  // a refused plan, a store's I/O error, no memory for the bounce buffer
      h.failed = true;
    }
    ++submissions_;
    return h;
  }
  /// @brief `done`, or `failed`.
  [[nodiscard]] copy_status status(handle_type const& h) const noexcept
  { return h.failed ? copy_status::failed : copy_status::done; }
  /// @brief The record pages a failed submission lost.
  [[nodiscard]] std::vector<lost_record> lost(handle_type const& h) const { return h.lost; }
  /// @brief Submissions so far.
  [[nodiscard]] std::int64_t submissions() const noexcept { return submissions_; }

 private:
  std::int64_t submissions_ = 0;
  std::vector<std::byte> bounce_;  // page-first records to and from record stores
};
static_assert(loss_reporting_executor<cpu_executor>);

}  // namespace strata
