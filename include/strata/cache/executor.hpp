// SPDX-License-Identifier: Apache-2.0
/**
 * @file cache/executor.hpp
 * @brief How the cache controller's copy orders become copies: the `copy_executor` and
 *        `stream_checked_executor` concepts, and `cpu_executor` (a CPU engine's), which runs them
 *        with `host_copy`, record I/O off the calling thread.
 *
 * The controller stays host-only: it hands an executor the tree's copy orders (tier slots to tier
 * slots) with the tier stack, and asks later whether each submission landed. The executor turns
 * orders into copy plans between the two stores' layouts and runs them its way: `cpu_executor`
 * with `memcpy`, `gpu_executor` (`cache/gpu_executor.cuh`) through a GPU transfer backend chosen
 * per transfer, the simulator's `virtual_executor` in virtual time.
 */
#pragma once

#include <strata/cache/detail/record_io.hpp>
#include <strata/cache/detail/records.hpp>
#include <strata/error.hpp>
#include <strata/layout/page_first.hpp>
#include <strata/tier/concepts.hpp>
#include <strata/transfer/host_copy.hpp>
#include <strata/types.hpp>

#include <algorithm>
#include <array>
#include <concepts>
#include <cstdint>
#include <exception>
#include <memory>
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

namespace detail {
/// @brief The record pages a failed submission lost, from its error (`records_unread`; none for
///        another error: the records were not at fault).
inline std::vector<lost_record> lost_records(std::exception_ptr const& e)
{
  std::vector<lost_record> out;
  if (!e) { return out; }
  try {
    std::rethrow_exception(e);
  } catch (records_unread const& r) {
    for (auto s : r.slots) {
      out.push_back({r.from, s});
    }
  } catch (...) {
  }
  return out;
}
}  // namespace detail

/**
 * @brief Runs copy orders with `host_copy` (a CPU engine, tests, the reference the GPU executor is
 *        checked against). Addressable stores are copied between at once, on the calling thread
 *        (their memory must be the CPU's). Record stores (a file tier) never make the caller wait
 *        for a disk: records read into or written from page-first memory in place (a prefetch
 *        into the host tier, a backup or demotion from it) move on an `async_record_store`'s own
 *        I/O queues, and records to or from any other layout (the engine's pool) move on one of
 *        the executor's two record threads — one for loads, one for background copies, so that a
 *        load never waits behind a backup — through a bounded page-first staging buffer of its
 *        own (`record_staging_bytes`), transposed to or from the other side's layout as it goes.
 *        `submit` starts them and returns a pending handle, which `status` finishes; the
 *        destructor waits for them.
 */
class cpu_executor {
 public:
  /// @brief No stream on the CPU.
  struct stream_type {};
  /// @brief A submission: failed at once (a store without a layout, a rejected plan), done, or
  ///        record I/O still moving (`io`: null when none).
  struct handle_type {
    bool failed = false;
    std::shared_ptr<detail::record_io> io;  ///< record I/O off the caller's thread (null: none)
  };

  /// @brief Record threads with 64 MiB of staging each.
  cpu_executor() : cpu_executor(std::int64_t{64} << 20) {}
  /**
   * @param record_staging_bytes page-first staging of each record thread: records move through it
   *        chunk by chunk (at least one page)
   * @throw strata::invalid_argument when it is not positive
   */
  explicit cpu_executor(std::int64_t record_staging_bytes) : staging_bytes_{record_staging_bytes}
  {
    STRATA_EXPECTS(record_staging_bytes > 0, "cpu_executor: record_staging_bytes must be positive (got ",
                   record_staging_bytes, ")");
  }
  cpu_executor(cpu_executor&&) noexcept = default;
  cpu_executor& operator=(cpu_executor&&) = delete;
  cpu_executor(cpu_executor const&) = delete;
  cpu_executor& operator=(cpu_executor const&) = delete;
  /// @brief Waits for the record I/O in flight (its threads write into the tiers' memory).
  ~cpu_executor() { synchronize(); }

  /**
   * @brief Copies every order between addressable stores now and starts the record I/O (see the
   *        class comment). A direction whose stores are not both addressable or record stores, or
   *        whose plan `validate` rejects, fails the submission.
   */
  template <class Tiers>
  handle_type submit(Tiers& tiers, std::span<copy_order const> orders, copy_kind kind, stream_type = {})
  {
    handle_type h;
    auto io = std::make_shared<detail::record_io>();
    try {
      detail::for_each_direction(tiers, orders, [&](auto& src, auto& dst, detail::direction const& d) {
        std::span<page_pair const> const pairs{d.pairs};
        using S = std::remove_cvref_t<decltype(src)>;
        using D = std::remove_cvref_t<decltype(dst)>;
        if constexpr (addressable_store<S> && addressable_store<D>) {
          host_copy{}.copy(copy_plan{src.layout(), dst.layout(), pairs, layer_range::all(src.geometry())});
        } else if constexpr (record_store<S> && detail::holds_records<D>()) {
          io->read(src, detail::record_legs::in_place(pairs, dst.layout(), true), d, "cpu_executor");
        } else if constexpr (record_store<D> && detail::holds_records<S>()) {
          io->write(dst, detail::record_legs::in_place(pairs, src.layout(), false), d, "cpu_executor");
        } else if constexpr ((addressable_store<S> || record_store<S>) && (addressable_store<D> || record_store<D>)) {
          constexpr tier t = record_store<S> ? S::kind : D::kind;
          io->run(
              thread(kind), kind == copy_kind::load, t,
              [&src, &dst, d, bytes = staging_bytes_] { through_records(src, dst, d, bytes); }, "cpu_executor");
        } else {
          STRATA_EXPECTS(false, "cpu_executor: no copy between the ", to_string(S::kind), " and ", to_string(D::kind),
                         " tiers (each needs a layout or records)");
        }
      });
    } catch (std::exception const&) {  // a refused plan, a store refusing a transfer, no memory
      h.failed = true;
    }
    ++submissions_;
    if (h.failed) {
      (void)io->poll(true);  // what started must end before the index frees its pages
    } else if (!io->empty()) {
      in_flight_->add(io);
      h.io = std::move(io);
    }
    return h;
  }
  /// @brief `pending` while its record I/O moves, then `done` or `failed`. Never blocks; any thread.
  [[nodiscard]] copy_status status(handle_type const& h) const noexcept
  {
    if (h.failed) { return copy_status::failed; }
    if (!h.io) { return copy_status::done; }
    switch (h.io->poll(false)) {
      case io_status::pending:
        return copy_status::pending;
      case io_status::succeeded:
        return copy_status::done;
      default:
        return copy_status::failed;
    }
  }
  /// @brief The record pages a failed submission lost.
  [[nodiscard]] std::vector<lost_record> lost(handle_type const& h) const
  { return h.io ? detail::lost_records(h.io->error()) : std::vector<lost_record>{}; }
  /// @brief Blocks until `h` landed: true, or false when it failed. Any thread.
  [[nodiscard]] bool wait(handle_type const& h) const noexcept
  { return !h.failed && (!h.io || h.io->poll(true) == io_status::succeeded); }
  /// @brief Blocks until the record I/O of every submission so far finished (tests, shutdown). Any thread.
  void synchronize() noexcept
  {
    if (in_flight_) { in_flight_->wait_all(); }  // (none when moved from)
  }
  /// @brief Submissions so far.
  [[nodiscard]] std::int64_t submissions() const noexcept { return submissions_; }

 private:
  /// The record thread of `kind`'s copies, started at first use.
  detail::thread_pool& thread(copy_kind kind)
  {
    auto& t = threads_[kind == copy_kind::load ? 0 : 1];
    if (!t) { t = std::make_unique<detail::thread_pool>(1); }
    return *t;
  }

  /// On a record thread: the pages of `d` from `src` to `dst` (one of them a record store) through
  /// page-first staging, a chunk of at most `staging_bytes` at a time. A read that lost records
  /// throws `records_unread` (the chunks before it were copied), a failed write `strata::error`.
  template <class S, class D>
  static void through_records(S& src, D& dst, detail::direction const& d, std::int64_t staging_bytes)
  {
    kv_geometry const g = src.geometry();
    auto const per = std::size_t(std::max<std::int64_t>(1, staging_bytes / g.page_bytes()));
    std::vector<std::byte> staging(std::min(per, d.pairs.size()) * std::size_t(g.page_bytes()));
    for (std::size_t at = 0; at < d.pairs.size(); at += per) {
      detail::direction const part = detail::slice(d, at, std::min(per, d.pairs.size() - at));
      page_first const records{staging.data(), g, std::int64_t(part.pairs.size())};
      detail::record_legs const legs{part.pairs, records};
      if constexpr (record_store<S>) {
        detail::read_records(src, legs, part, "cpu_executor");
      } else {
        host_copy{}.copy(copy_plan{src.layout(), records, std::span<page_pair const>{legs.in}, layer_range::all(g)});
      }
      if constexpr (record_store<D>) {
        STRATA_EXPECTS_AS(error, detail::write_records(dst, legs, part), "cpu_executor: writing ", part.pairs.size(),
                          " records to the ", to_string(D::kind), " tier failed");
      } else {
        host_copy{}.copy(copy_plan{records, dst.layout(), std::span<page_pair const>{legs.out}, layer_range::all(g)});
      }
    }
  }

  std::int64_t staging_bytes_;
  std::int64_t submissions_ = 0;
  std::unique_ptr<detail::record_io_log> in_flight_ = std::make_unique<detail::record_io_log>();
  std::array<std::unique_ptr<detail::thread_pool>, 2> threads_;  // loads, background (after `in_flight_`: joined first)
};
static_assert(loss_reporting_executor<cpu_executor>);

}  // namespace strata
