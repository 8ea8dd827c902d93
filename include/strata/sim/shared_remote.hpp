// SPDX-License-Identifier: Apache-2.0
/**
 * @file sim/shared_remote.hpp
 * @brief The simulator's remote tier: page ids only, and — when engines share one — a store every
 *        instance writes to and asks, in virtual time, as `remote_tier` asks a Redis Cluster.
 */
#pragma once

#include <strata/cache/remote_tier.hpp>
#include <strata/error.hpp>
#include <strata/geometry.hpp>
#include <strata/index/page_key.hpp>
#include <strata/tier/concepts.hpp>
#include <strata/tier/slot_allocator.hpp>
#include <strata/types.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>

namespace strata::sim {

/// @brief The pages engine instances wrote to a shared remote store: each page's chain key (the
///        index's, which names its whole prefix) and when its write lands, in virtual time.
class shared_remote_pages {
 public:
  /// @brief Pages whose writes land at `at` (a page already there keeps its earlier time).
  void written(std::span<std::uint64_t const> keys, double at)
  {
    for (auto k : keys) {
      auto [it, fresh] = landed_.emplace(k, at);
      if (!fresh) { it->second = std::min(it->second, at); }
    }
  }
  /// @brief How many leading pages of `keys` have landed by `now`.
  [[nodiscard]] std::int64_t leading(std::span<std::uint64_t const> keys, double now) const
  {
    std::int64_t n = 0;
    for (auto k : keys) {
      auto const it = landed_.find(k);
      if (it == landed_.end() || it->second > now) { break; }
      ++n;
    }
    return n;
  }
  /// @brief Pages written.
  [[nodiscard]] std::size_t size() const noexcept { return landed_.size(); }

 private:
  std::unordered_map<std::uint64_t, double> landed_;
};

/**
 * @brief The simulator's remote tier: page ids only (like `virtual_pool`), and a
 *        `prompt_lookup_store` over `shared` when engines share a store (null: a remote tier of one
 *        instance, asked nothing). A lookup is answered at once from what has landed by the
 *        engine's clock; the round trip of each read is the cost model's remote latency.
 */
class virtual_remote {
 public:
  static constexpr tier kind = tier::remote;

  /// @throw strata::invalid_argument for an invalid geometry or a negative capacity
  virtual_remote(kv_geometry const& geometry, std::int64_t capacity,
                 std::shared_ptr<shared_remote_pages> shared = nullptr, std::function<double()> clock = {})
      : geometry_{(geometry.validate(), geometry)},
        capacity_{capacity},
        slots_{1},
        shared_{std::move(shared)},
        clock_{std::move(clock)}
  { STRATA_EXPECTS(capacity >= 0, "virtual_remote: capacity must not be negative, got ", capacity); }

  [[nodiscard]] kv_geometry geometry() const noexcept { return geometry_; }
  [[nodiscard]] std::int64_t capacity() const noexcept { return capacity_; }
  /// @brief Unused: remote pages are named by their keys.
  [[nodiscard]] slot_allocator& slots() noexcept { return slots_; }

  void learn(std::span<std::int32_t const>, std::int64_t) const noexcept {}
  io_ticket submit_lookup(std::span<std::int32_t const> ids, std::int64_t ids_per_page)
  {
    std::int64_t found = 0;
    if (shared_) { found = shared_->leading(chain_keys(ids, ids_per_page), clock_ ? clock_() : 0.0); }
    answers_.emplace(++next_, found);
    return {next_};
  }
  std::optional<std::int64_t> poll_lookup(io_ticket t)
  {
    auto const it = answers_.find(t.id);
    STRATA_EXPECTS(it != answers_.end(), "virtual_remote: ticket ", t.id, " is not pending here");
    std::int64_t const found = it->second;
    answers_.erase(it);
    return found;
  }
  /// @brief Copies into this tier land at `at` (the virtual executor tells).
  void written(std::span<std::uint64_t const> keys, double at)
  {
    if (shared_) { shared_->written(keys, at); }
  }

 private:
  kv_geometry geometry_;
  std::int64_t capacity_;
  slot_allocator slots_;
  std::shared_ptr<shared_remote_pages> shared_;
  std::function<double()> clock_;
  std::map<std::uint64_t, std::int64_t> answers_;
  std::uint64_t next_ = 0;
};
static_assert(page_store<virtual_remote>);
static_assert(prompt_lookup_store<virtual_remote>);

/// @brief A remote tier that hears when the simulator's copies into it land.
template <class S>
concept remote_write_log = requires(S& s, std::span<std::uint64_t const> keys, double at) { s.written(keys, at); };

}  // namespace strata::sim
