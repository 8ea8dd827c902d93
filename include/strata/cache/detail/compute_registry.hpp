// SPDX-License-Identifier: Apache-2.0
/**
 * @file cache/detail/compute_registry.hpp
 * @brief Who computes which pages, beyond what the index's transient marks say: the cache
 *        controller's guard against computing a prefix twice at once.
 */
#pragma once

#include <strata/types.hpp>

#include <cstdint>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace strata::detail {

/**
 * @brief Two records the index's transient marks cannot keep.
 *
 * - Every page a started request computes, by content key (`chain_key`). The marks cover only
 *   its uncached pages, and only when it could mark (its prefix may run into another request's
 *   transient prefix shorter than the delay-hit threshold, and nothing hangs below a transient
 *   node); the cached pages its plan chose to recompute (a slow tier) are in the index but not
 *   marked. A request extending them waits for the whole run (`computed_elsewhere`) instead of
 *   computing it too: a recomputed run and a marked run, each shorter than the threshold, may be
 *   longer than it together.
 * - Requests that could not mark their uncached prefix because another request's transient prefix
 *   was in the way: they mark again when that one commits or goes (`take_waiters`), so that of
 *   several requests extending the same prefix, one marks — and computes — the extension.
 *
 * Invariants: a key belongs to at most one request, and every key a request holds is listed under
 * it. Not thread-safe: the controller's lock serialises every call.
 */
class compute_registry {
 public:
  /**
   * @brief Whether another request computes the first pages of `keys`, at least `threshold_tokens`
   *        of them (the delay-hit threshold: a shorter shared run is not worth waiting for).
   */
  [[nodiscard]] bool computed_elsewhere(std::span<std::uint64_t const> keys, std::int64_t page_tokens,
                                        std::int64_t threshold_tokens) const
  {
    std::int64_t shared = 0;
    request_id other{};
    for (auto k : keys) {
      auto const it = computing_.find(k);
      if (it == computing_.end() || (shared > 0 && it->second != other)) { break; }
      other = it->second;
      ++shared;
    }
    return shared > 0 && shared * page_tokens >= threshold_tokens;
  }

  /// @brief `id` computes the pages of `keys`; keys another request holds already stay that one's.
  void add(request_id id, std::span<std::uint64_t const> keys)
  {
    for (auto k : keys) {
      if (computing_.emplace(k, id).second) { keys_of_[id].push_back(k); }
    }
  }

  /// @brief `id` computes nothing any more (it committed, or gave up).
  void remove(request_id id)
  {
    auto const it = keys_of_.find(id);
    if (it == keys_of_.end()) { return; }
    for (auto k : it->second) {
      computing_.erase(k);
    }
    keys_of_.erase(it);
  }

  /// @brief `waiter` could not mark because `owner`'s transient prefix was in the way.
  void wait_for_mark(request_id owner, request_id waiter) { waiters_[owner].push_back(waiter); }

  /// @brief The requests that waited for `owner`'s transient prefix to commit or go, in order; forgotten.
  [[nodiscard]] std::vector<request_id> take_waiters(request_id owner)
  {
    auto const it = waiters_.find(owner);
    if (it == waiters_.end()) { return {}; }
    std::vector<request_id> ids = std::move(it->second);
    waiters_.erase(it);
    return ids;
  }

 private:
  std::unordered_map<std::uint64_t, request_id> computing_;                           // key -> its request
  std::unordered_map<request_id, std::vector<std::uint64_t>, request_hash> keys_of_;  // request -> its keys
  std::unordered_map<request_id, std::vector<request_id>, request_hash> waiters_;     // owner -> waiting to mark
};

}  // namespace strata::detail
