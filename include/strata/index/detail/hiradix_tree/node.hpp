// SPDX-License-Identifier: Apache-2.0
/**
 * @file index/detail/hiradix_tree/node.hpp
 * @brief What the prefix index keeps per node and per pending transfer (`hiradix_tree`'s state;
 *        users never name these).
 */
#pragma once

#include <strata/types.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace strata::detail {

/// @brief "No node" in child chains.
inline constexpr std::uint32_t radix_npos = 0xffffffffu;

/// @brief A serial number per prefix index, so that a `probe_memo` filled by one is never taken
///        for another's.
inline std::uint64_t next_tree_serial() noexcept
{
  static std::atomic<std::uint64_t> serials{0};
  return ++serials;
}

/**
 * @brief One node: an edge of whole pages, with per tier its page ids, residency, locks, pins and
 *        eviction candidacy. Nodes live in a vector and are named by index (+ generation).
 */
struct radix_node {
  std::uint32_t parent{};
  std::uint32_t generation{};
  std::uint32_t next_same_key{radix_npos};  ///< next sibling whose first page hashes alike
  bool alive{};
  transient_state state{};
  request_id owner{};
  std::vector<std::int32_t> tokens;                     ///< pages() * page_tokens
  std::vector<std::uint64_t> hashes;                    ///< content key per page (`chain_key`)
  std::array<std::vector<std::int32_t>, 3> tier_pages;  ///< device, host, file page ids
  std::array<bool, tier_count> resident{};
  std::array<bool, tier_count> candidate{};  ///< in the tier's LRU set, under `lru_key`
  std::array<std::uint64_t, tier_count> lru_key{};
  std::array<std::int32_t, tier_count> locks{};
  std::array<std::int32_t, tier_count> pins{};  ///< pending transfers from or to the tier
  std::array<bool, tier_count> drop_pending{};  ///< demoted out of the tier: dropped once unpinned there
  std::array<std::int32_t, tier_count> children_resident{};
  /// When anything a probe reads of this node last changed (its tokens, transient state, residency,
  /// its place in the tree): the tree's change clock then. `probe_memo`s compare it.
  std::uint64_t stamp{};
  std::uint64_t link_stamp{};  ///< the tree's change clock when a child was last linked below it
  std::uint64_t last_use{};
  std::int64_t hits{};
  std::unordered_map<std::uint64_t, std::uint32_t> children;  ///< first page's key -> a child

  [[nodiscard]] std::int64_t pages() const noexcept { return static_cast<std::int64_t>(hashes.size()); }
};

/// @brief A copy the index ordered and has not seen complete: it pins its nodes in both tiers.
struct radix_transfer {
  std::vector<std::uint32_t> nodes;  ///< the ordered node, and the upper halves it was split into
  tier from, to;
  bool demotion;
  std::int64_t pages;  ///< pages it moves (counted in the destination's inbound backlog)
};

}  // namespace strata::detail
