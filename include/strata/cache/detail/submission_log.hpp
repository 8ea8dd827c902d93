// SPDX-License-Identifier: Apache-2.0
/**
 * @file cache/detail/submission_log.hpp
 * @brief The cache controller's one queue of copy orders and its record of what is in flight.
 */
#pragma once

#include <strata/cache/executor.hpp>
#include <strata/index/hiradix_tree.hpp>
#include <strata/types.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <iterator>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace strata::detail {

/**
 * @brief Where every copy order the prefix index issues goes on its way to the executor, and what
 *        the controller waits for.
 *
 * - Orders the index queues on its own (write-policy backups, demotions that make room in a full
 *   tier, file write-through) are drained from it here and nowhere else (`collect`); so are its
 *   internal evictions, which are host and file slots the index released itself (nothing for the
 *   caller to do). Demotions an eviction returned wait here too (`queue`).
 * - A batch's loads go as one submission (`submit`); every other order as a submission of its own
 *   (`submit_queued`, `submit_collected`), so that each settles — and frees its source — as soon
 *   as it lands, not when the slowest of a group does.
 * - Invariants: every order queued or in flight is one the index issued and has neither completed
 *   nor cancelled; a device page is `arriving` exactly while a pending load submission fills it.
 *
 * Not thread-safe: the controller's lock serialises every call.
 * @tparam Executor the controller's `copy_executor`
 */
template <class Executor>
class submission_log {
 public:
  using handle_type = typename Executor::handle_type;
  using stream_type = typename Executor::stream_type;

  /// @brief One executor submission.
  struct entry {
    std::uint64_t id;                 ///< the controller's number (never 0)
    handle_type handle;               ///< the executor's
    std::vector<copy_order> orders;   ///< what it moves
    copy_kind kind;                   ///< a batch's loads, or background copies
    std::vector<request_id> readers;  ///< loads: the requests that read the pages it fills
  };

  /// @brief Takes the orders and internal evictions the index queued.
  void collect(hiradix_tree& tree)
  {
    (void)tree.take_internal_evictions();  // host and file slots, released by the index itself
    for (auto& o : tree.take_copies()) {
      queued_.push_back(std::move(o));
    }
  }

  /// @brief Holds orders for the next `submit_queued` (an eviction's demotions).
  void queue(std::vector<copy_order>&& orders)
  { queued_.insert(queued_.end(), std::make_move_iterator(orders.begin()), std::make_move_iterator(orders.end())); }

  /**
   * @brief Hands `orders` to the executor as one submission.
   * @param readers for loads, the requests reading the pages they fill (a failure restarts them)
   * @return its id
   */
  template <class Tiers>
  std::uint64_t submit(Executor& executor, Tiers& tiers, std::vector<copy_order> orders, copy_kind kind,
                       stream_type stream, std::vector<request_id> readers = {})
  {
    std::int64_t const page_bytes = tiers.geometry().page_bytes();
    for (auto const& o : orders) {
      bytes_moved_[std::size_t(o.from)][std::size_t(o.to)] += std::int64_t(o.from_pages.size()) * page_bytes;
    }
    entry e{++submissions_, executor.submit(tiers, std::span<copy_order const>{orders}, kind, stream),
            std::move(orders), kind, std::move(readers)};
    if (kind == copy_kind::load) {
      for (auto const& o : e.orders) {
        for (auto p : o.to_pages) {
          arriving_[p] = e.id;
        }
      }
    }
    in_flight_.push_back(std::move(e));
    return in_flight_.back().id;
  }

  /**
   * @brief Collects what the index queued, then submits every queued order, each on its own.
   * @param device_sources whether orders that read device pages go too. Calls that may come from
   *        any thread with any stream (`poll`, `submit`) keep them for a call on the engine's
   *        stream, which orders them after the compute writing those pages.
   */
  template <class Tiers>
  void submit_queued(Executor& executor, Tiers& tiers, hiradix_tree& tree, stream_type stream, bool device_sources)
  {
    collect(tree);
    std::vector<copy_order> kept;
    for (auto& o : std::exchange(queued_, {})) {
      if (!device_sources && o.from == tier::device) {
        kept.push_back(std::move(o));
        continue;
      }
      std::vector<copy_order> one;
      one.push_back(std::move(o));
      (void)submit(executor, tiers, std::move(one), copy_kind::background, stream);
    }
    queued_ = std::move(kept);
  }

  /**
   * @brief Submits at once, each on its own, only what the index queued since the last `collect`
   *        (the demotions that make room for a prefetch, which waits for them to land).
   * @return their ids
   */
  template <class Tiers>
  std::vector<std::uint64_t> submit_collected(Executor& executor, Tiers& tiers, hiradix_tree& tree, stream_type stream)
  {
    (void)tree.take_internal_evictions();
    std::vector<std::uint64_t> ids;
    for (auto& o : tree.take_copies()) {
      std::vector<copy_order> one;
      one.push_back(std::move(o));
      ids.push_back(submit(executor, tiers, std::move(one), copy_kind::background, stream));
    }
    return ids;
  }

  /// @brief Submissions in flight.
  [[nodiscard]] std::size_t size() const noexcept { return in_flight_.size(); }
  /// @brief Submission `i` (in submission order).
  [[nodiscard]] entry const& operator[](std::size_t i) const { return in_flight_[i]; }
  /// @brief Where submission `id` is, if it is still in flight.
  [[nodiscard]] std::optional<std::size_t> position(std::uint64_t id) const noexcept
  {
    for (std::size_t i = 0; i < in_flight_.size(); ++i) {
      if (in_flight_[i].id == id) { return i; }
    }
    return std::nullopt;
  }
  /// @brief Whether submission `id` is still in flight.
  [[nodiscard]] bool pending(std::uint64_t id) const noexcept { return position(id).has_value(); }

  /// @brief Removes submission `i` (it settled): its loads' pages stop arriving.
  entry take(std::size_t i)
  {
    entry e = std::move(in_flight_[i]);
    in_flight_.erase(in_flight_.begin() + std::ptrdiff_t(i));
    if (e.kind == copy_kind::load) {
      for (auto const& o : e.orders) {
        for (auto p : o.to_pages) {
          if (auto const it = arriving_.find(p); it != arriving_.end() && it->second == e.id) { arriving_.erase(it); }
        }
      }
    }
    return e;
  }

  /// @brief The handles of the pending loads that fill any of `pages`, in submission order.
  [[nodiscard]] std::vector<handle_type> loads_filling(std::span<std::int64_t const> pages) const
  {
    std::set<std::uint64_t> ids;
    for (auto p : pages) {
      if (auto const it = arriving_.find(p); it != arriving_.end()) { ids.insert(it->second); }
    }
    std::vector<handle_type> out;
    for (auto const& e : in_flight_) {
      if (ids.count(e.id) != 0) { out.push_back(e.handle); }
    }
    return out;
  }

  /// @brief Request `id` is gone: no pending load restarts it any more.
  void forget_reader(request_id id)
  {
    for (auto& e : in_flight_) {
      e.readers.erase(std::remove(e.readers.begin(), e.readers.end(), id), e.readers.end());
    }
  }

  /// @brief Bytes handed to the executor, [from][to] tier.
  [[nodiscard]] std::array<std::array<std::int64_t, tier_count>, tier_count> const& bytes_moved() const noexcept
  { return bytes_moved_; }

 private:
  std::vector<copy_order> queued_;
  std::vector<entry> in_flight_;
  std::unordered_map<std::int64_t, std::uint64_t> arriving_;  // device page -> load submission filling it
  std::uint64_t submissions_ = 0;
  std::array<std::array<std::int64_t, tier_count>, tier_count> bytes_moved_{};
};

}  // namespace strata::detail
