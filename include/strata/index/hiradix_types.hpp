// SPDX-License-Identifier: Apache-2.0
/**
 * @file index/hiradix_types.hpp
 * @brief What the prefix index (`hiradix_tree`, index/hiradix_tree.hpp) is configured with and
 *        answers: its configuration, the results of its calls, its counters, and the probes a
 *        caller keeps for reuse (`probe_memo`).
 */
#pragma once

#include <strata/index/detail/hiradix_tree/node.hpp>
#include <strata/types.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace strata {

/// @brief Configuration of a `hiradix_tree`.
struct hiradix_config {
  std::int64_t page_tokens = 32;  ///< ids per page (per edge unit): token ids, or 1 when each id is a page
  /// Real tokens per id, for every token count the tree reports (`match_result`, stats,
  /// `mark_in_queue`) and for `delay_hit_tokens`: 1 when the index holds token ids; the model's
  /// page size when it holds one id per page (the simulator's compact index).
  std::int64_t tokens_per_id = 1;
  std::int64_t page_bytes = 0;  ///< bytes of one page's KV, for statistics (0: not reported)
  /// Pages per tier: the device pool's size (page ids the engine passes must be below it), and the
  /// host, file and remote capacities the tree allocates from (0: tier absent).
  std::array<std::int64_t, tier_count> capacity{0, 0, 0, 0};
  write_policy backup_policy = write_policy::write_through_selective;  ///< device -> host backups
  /// Host -> file copies: on host eviction only (`write_back`, the default: the file tier holds
  /// what the host lets go), as soon as a page is on the host (`write_through`: the file tier
  /// holds everything the host does, so a restart or a host eviction loses nothing), or once the
  /// node is hit `selective_hits` times (`write_through_selective`).
  write_policy file_backup_policy = write_policy::write_back;
  /// Host -> remote copies: as soon as a page is on the host (`write_through`, the default: a shared
  /// tier serves other instances only what it has), or on eviction from the tier above it only
  /// (`write_back`, `write_through_selective`).
  write_policy remote_backup_policy = write_policy::write_through;
  std::int64_t selective_hits = 2;     ///< hits before a selective backup (to the host, or to the file tier)
  std::int64_t delay_hit_tokens = 64;  ///< shortest transient match reported as a delay hit
  /// Which nodes a record tier (file, remote) is worth: writing and reading a page back cost the
  /// same at any depth while recomputing it grows with the context before it, so a node whose
  /// middle lies fewer than `record_breakeven_tokens[t]` real tokens into its prompt saves less by
  /// a later read than its write and read cost. Such a node is not copied into t for itself
  /// (`hiradix_stats::writes_not_worth`), only as the ancestor of a node t takes by a write-through
  /// or selective copy (a record is found only through a path from the root). The default,
  /// -infinity: every node is worth it; the cache controller derives it from its cost model
  /// (`cost_model::record_breakeven_tokens`).
  std::array<double, tier_count> record_breakeven_tokens{
      -std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
      -std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()};
  /// Pages that may be on their way into each record tier at once (what its write staging holds):
  /// a copy that would pass it is dropped rather than queued, so that a slow tier's backlog never
  /// holds pages that are needed back (`hiradix_stats::writes_dropped`). 0: no bound.
  std::array<std::int64_t, tier_count> write_backlog_pages{};
};

/// @brief What `match` found.
struct match_result {
  std::int64_t tokens{};  ///< longest cached prefix (whole pages, resident in some tier)
  /// Of those, tokens resident in each tier (a page may be resident in several).
  std::array<std::int64_t, tier_count> tier_tokens{};
  std::int64_t device_prefix_tokens{};  ///< leading tokens resident on the device (no load needed)
  /// Leading tokens resident on the device or the host: the part of the prefix a load brings
  /// without reading a record store (file, remote).
  std::int64_t upper_prefix_tokens{};
  /// Of `tokens`, those whose fastest tier is each tier: [device] need no load, the others are
  /// what loading the prefix onto the device moves from each tier.
  std::array<std::int64_t, tier_count> fastest_tokens{};
  node_ref node{};                  ///< deepest cached node of the prefix (the root if none)
  std::int64_t transient_tokens{};  ///< tokens matched beyond `tokens` in a transient node
  transient_state transient{};      ///< its state
  request_id transient_owner{};     ///< the request that will compute it
  bool delay_hit{};                 ///< `transient_tokens >= delay_hit_tokens`
};

class hiradix_tree;

/**
 * @brief A probe kept for reuse: `hiradix_tree::probe(tokens, memo)` answers from it while nothing
 *        the probe read has changed, and probes afresh otherwise.
 *
 * A scheduler ranks the same waiting requests round after round while each round changes a few
 * nodes; keeping one memo per waiting request makes a round's probes cost a check of the few nodes
 * on each request's path (and one child lookup where the path ended at a node that gained
 * children) instead of a comparison of every token. Default-constructed: empty. It knows the
 * tokens by their buffer's address and size only: probe the same buffer, unchanged, or a fresh memo
 * (a buffer freed and allocated again for other tokens looks the same to it).
 */
class probe_memo {
 public:
  /// @brief The kept answer (meaningful once a probe filled the memo).
  [[nodiscard]] match_result const& result() const noexcept { return result_; }
  /// @brief How many probes it answered without walking the tree.
  [[nodiscard]] std::int64_t reuses() const noexcept { return reuses_; }

 private:
  friend class hiradix_tree;
  match_result result_{};
  struct step {
    std::uint32_t node;   // a node whose edge the probe read
    std::uint64_t stamp;  // its stamp then
    std::int64_t pages;   // pages of its edge equal to the tokens'
  };
  std::vector<step> read_;
  std::uint32_t miss_node_ = detail::radix_npos;  // the node where a child lookup found nothing
  std::uint64_t miss_link_stamp_{};               // its link_stamp then
  std::int64_t miss_page_{};                      // the page looked up
  std::uint64_t tree_{};                          // the tree's serial (0: empty)
  std::int32_t const* data_{};                    // the tokens probed
  std::size_t size_{};
  std::int64_t reuses_{};
};

/// @brief What `insert` did.
struct insert_result {
  std::int64_t new_pages{};  ///< pages added to the tree or newly resident on the device
  node_ref node{};           ///< deepest node holding the inserted prefix
  /// The caller's device pages the tree did not take (already cached on the device, or past a
  /// prefix another request is computing): free them.
  std::vector<std::int64_t> unused_device_pages;
};

/// @brief What `adopt` did.
struct adopt_result {
  std::int64_t pages{};  ///< pages whose slot the tree took (the others were held in the tier already)
  node_ref node{};       ///< deepest node of the prefix walked
};

/// @brief What `discard` did.
struct discard_result {
  bool dropped{};  ///< false: a node that would go is locked, pinned or transient; nothing changed
  /// Pages that went with it, per tier (the node's copy, and the whole subtree when that was its only copy).
  std::array<std::int64_t, tier_count> pages{};
  std::vector<std::int64_t> freed_device;  ///< device pages freed: the caller returns them to its pool
  /// Requests whose `in_queue` marks hung below the prefix that went: their marks were removed, so
  /// they mark again (`mark_in_queue`) where the prefix now ends.
  std::vector<request_id> unmarked;
};

/// @brief What `evict` did.
struct eviction_result {
  std::int64_t pages{};               ///< pages leaving the tier (now, or when their copy completes)
  std::vector<std::int64_t> freed;    ///< page ids (remote: keys) of the tier free now
  std::vector<copy_order> demotions;  ///< copies to run first; their sources are freed by `complete`
};

/// @brief Counters since construction.
struct hiradix_stats {
  std::array<std::int64_t, tier_count> hit_tokens{};      ///< matched tokens resident in each tier
  std::int64_t matched_tokens{};                          ///< cached tokens matched
  std::int64_t queried_tokens{};                          ///< whole-page tokens asked for
  std::int64_t delay_hits{};                              ///< matches reported as delay hits
  std::array<std::int64_t, tier_count> evicted_pages{};   ///< pages evicted from each tier
  std::array<std::int64_t, tier_count> resident_pages{};  ///< pages resident in each tier now
  std::array<std::int64_t, tier_count> resident_bytes{};  ///< the same in bytes (0 without page_bytes)
  /// Pages kept out of each record tier because recomputing them is cheaper than reading them back
  /// (`hiradix_config::record_breakeven_tokens`): each time a copy into the tier was considered.
  std::array<std::int64_t, tier_count> writes_not_worth{};
  /// Pages not copied into each record tier because its write backlog was full
  /// (`hiradix_config::write_backlog_pages`): the tier could not keep up.
  std::array<std::int64_t, tier_count> writes_dropped{};
};

}  // namespace strata
