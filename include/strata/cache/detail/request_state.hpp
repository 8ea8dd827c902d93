// SPDX-License-Identifier: Apache-2.0
/**
 * @file cache/detail/request_state.hpp
 * @brief What the cache controller keeps per live request.
 */
#pragma once

#include <strata/types.hpp>

#include <cstdint>
#include <optional>
#include <vector>

namespace strata::detail {

/// @brief Where a request is in its lifecycle.
enum class request_stage {
  waiting,     ///< submitted (or sent back by a failed load): its first chunk has not started
  prefilling,  ///< its first chunk started; chunks are left to run
  prefilled,   ///< its last chunk ran: `finish_prefill` is due
  running,     ///< decoding, until `release`
};

/**
 * @brief One live request: its prompt, where its pages are, and what it waits for.
 *
 * Its page table is `prefix` (device pages of the cached path when it started), `computed` (the
 * whole prompt pages it computes) and `extra` (pages the index does not hold: the partial tail,
 * the output, uncached pages past another request's prefix).
 */
struct request_state {
  std::vector<std::int32_t> tokens;
  std::int64_t prompt_tokens = 0;
  std::int64_t max_new_tokens = 1;
  request_stage at = request_stage::waiting;
  bool failed = false;  ///< a load it already computed on failed: its output is wrong
  node_ref node{};      ///< its cached path's deepest node, locked on the device while `locked`
  bool locked = false;
  std::int64_t cached_pages = 0;     ///< pages of the cached path when it started
  std::int64_t transient_pages = 0;  ///< pages its transient mark covers
  std::vector<std::int64_t> prefix;
  std::vector<std::int64_t> computed;
  std::vector<std::int64_t> extra;
  std::uint64_t prefetch = 0;                ///< submission of its pending prefetch (0: none)
  bool prefetch_retry = false;               ///< its prefetch found the host full and made room: try again
  int prefetch_tries = 0;                    ///< prefetches started for it (retries are bounded)
  std::vector<std::uint64_t> prefetch_room;  ///< the demotions making room for it: retry once they landed
  std::optional<double> prefetch_at;         ///< when its first prefetch started (the controller's clock)
  std::uint64_t remote_lookup = 0;           ///< ticket of its pending remote-tier lookup (0: none)
  std::uint64_t submission = 0;              ///< which `submit` made it (an id may come back once released)
};

}  // namespace strata::detail
