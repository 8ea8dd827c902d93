// SPDX-License-Identifier: Apache-2.0
/**
 * @file types.hpp
 * @brief The vocabulary the layers share: storage tiers, request and node identities, transfers,
 *        write policies, transient states and copy orders. Host-only, no dependencies beyond the
 *        standard library, so that the scheduler, the cost model, the workloads and the cache
 *        controller can name these without the prefix index.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace strata {

/// @brief Storage tiers, fastest first.
enum class tier : std::uint8_t { device = 0, host = 1, file = 2, remote = 3 };
/// @brief Number of tiers.
inline constexpr std::size_t tier_count = 4;
/// @brief Name of a tier, for messages and reports.
constexpr char const* to_string(tier t) noexcept
{
  constexpr char const* names[] = {"device", "host", "file", "remote"};
  return static_cast<std::size_t>(t) < tier_count ? names[static_cast<std::size_t>(t)] : "?";
}

/// @brief Whether pages of tier `t` are records that reach the device through host memory (the
///        file and remote tiers: `record_store`s, read into page-first host records, then copied
///        over PCIe like a host-tier load).
[[nodiscard]] constexpr bool is_record_tier(tier t) noexcept { return t == tier::file || t == tier::remote; }

/// @brief When device pages are backed up to the host tier.
enum class write_policy {
  write_through,            ///< as soon as they are inserted or committed
  write_through_selective,  ///< once the node has been hit `selective_hits` times
  write_back,               ///< only when evicted from the device
};

/// @brief A request, as the engine numbers them.
struct request_id {
  std::uint64_t value{};
  friend constexpr bool operator==(request_id, request_id) = default;
  friend constexpr auto operator<=>(request_id, request_id) = default;
};

/// @brief Hash of a `request_id`, for unordered containers.
struct request_hash {
  std::size_t operator()(request_id r) const noexcept { return std::hash<std::uint64_t>{}(r.value); }
};

/// @brief A node of the tree (stale once the node is removed: calls then throw).
struct node_ref {
  std::uint32_t index{};
  std::uint32_t generation{};
  friend constexpr bool operator==(node_ref, node_ref) = default;
};

/// @brief A transfer the tree asked for.
using transfer_id = std::uint64_t;

/// @brief Transient state of a node.
enum class transient_state : std::uint8_t {
  none,       ///< permanent: cached in at least one tier
  in_queue,   ///< a waiting request will compute this prefix
  in_flight,  ///< its prefill (or load) is running
};

/// @brief A copy to run: `from_pages` of tier `from` to `to_pages` of tier `to` (remote: keys).
struct copy_order {
  transfer_id id{};
  node_ref node{};
  tier from{};
  tier to{};
  std::vector<std::int64_t> from_pages;
  std::vector<std::int64_t> to_pages;
  bool demotion{};  ///< source pages are freed when it completes (an eviction)
  /// Content key of each page: the index's hash chained over the prefix (`hiradix_tree::page_key`).
  /// A record store writes it into each record and refuses to read a record holding another key,
  /// so a slot reused meanwhile is never served as this page.
  std::vector<std::uint64_t> keys;
  std::uint64_t parent_key{};  ///< key of the page before the first (0: the prompt's first page)
  /// Orders from or to a record store (file, remote): the pages' ids, `ids_per_page` each, as the
  /// index holds them (token ids; one id per page in page-id mode). Records keep them, so that a
  /// restart can rebuild the index from the records alone.
  std::vector<std::int32_t> ids;
  std::int64_t ids_per_page{};  ///< ids per page in `ids` (0: none)
};

}  // namespace strata
