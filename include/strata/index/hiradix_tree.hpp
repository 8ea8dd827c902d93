// SPDX-License-Identifier: Apache-2.0
/**
 * @file index/hiradix_tree.hpp
 * @brief The prefix index over tiers: which token prefixes are cached where, which are being computed
 *        or loaded (transient nodes), and what may be evicted.
 *
 * A radix tree over 32-bit token ids whose edges are whole pages; a trailing partial page is never
 * cached. Each node holds, per tier (device, host, file, remote), whether its pages are resident and
 * where (page ids; file slots; remote keys are the pages' chained content hashes), a lock count and
 * pending transfers; and its hit count and last use.
 *
 * Copies the tree asks for (backups, demotions on eviction, promotions for loads) are returned as
 * `copy_order`s; the caller runs them and reports back with `complete` (or `cancel`). Until then the
 * pages involved are pinned: never evicted, and the destination is not yet counted as resident.
 *
 * Every mutating call validates its input first and throws `strata::invalid_argument` with the tree
 * unchanged. Not thread-safe: the engine's scheduling loop owns it.
 *
 * This header is the face: the documented class. Its options and results are in
 * index/hiradix_types.hpp; the node state and the member definitions in
 * `index/detail/hiradix_tree/` (node.hpp; lookup, changes, eviction, structure and invariants .inl
 * files), included at the end.
 */
#pragma once

#include <strata/error.hpp>
#include <strata/index/detail/hiradix_tree/node.hpp>
#include <strata/index/hiradix_types.hpp>
#include <strata/index/page_key.hpp>
#include <strata/tier/slot_allocator.hpp>
#include <strata/types.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

namespace strata {

/**
 * @brief The prefix index. See the file comment for the model.
 *
 * Rules that keep it simple and safe:
 * - a page is cached when it is resident in at least one tier; `match` stops at the first node
 *   that is not (or that is transient);
 * - transient nodes are leaves owned by one request; nothing is inserted below them;
 * - a node split while a transfer is pending leaves the transfer covering both halves;
 * - eviction takes tier-leaves (no child resident in that tier), least recently used first, and
 *   drops a node's last copy only if it is an unlocked leaf of the whole tree.
 */
class hiradix_tree {
 public:
  /**
   * @param config page size, tier capacities, write policy, delay-hit threshold
   * @param slots host and file slot allocators owned by those tiers (`tier_stack::slots()`); the
   *        tree is their only user and the tier's capacity is the allocator's (overriding
   *        `config.capacity`). Null entries: the tree owns an allocator of the configured capacity.
   *        The allocators must outlive the tree.
   * @throw strata::invalid_argument for a non-positive page size, a negative capacity or byte
   *        count, a device capacity of 0, non-positive selective hits, a negative threshold, or a
   *        lent allocator with slots already in use
   */
  explicit hiradix_tree(hiradix_config config, tier_slots slots = {});

  /// @brief The configuration.
  [[nodiscard]] hiradix_config const& config() const noexcept { return config_; }
  /// @brief The root (the empty prefix).
  [[nodiscard]] node_ref root() const noexcept { return {0, nodes_[0].generation}; }
  /// @brief Whether the tree has tier `t` (the device always; others with a positive capacity).
  [[nodiscard]] bool has_tier(tier t) const noexcept { return config_.capacity[std::size_t(t)] > 0; }

  // --- queries -------------------------------------------------------------------------------------

  /**
   * @brief The longest cached prefix of `tokens` (whole pages), and any transient match beyond it.
   *
   * Counts as a use of the matched nodes (last use, hits; a selective backup may be queued, see
   * `take_copies`). A node is split where the prefix ends inside it, so `node` ends exactly there.
   */
  match_result match(std::span<std::int32_t const> tokens);

  /**
   * @brief `match(tokens)`, following the path of `memo` (a probe of the same tokens) where its
   *        nodes are unchanged instead of comparing tokens: what a scheduler's final match of the
   *        requests it probed costs then is a walk of a few nodes. The same answer and side effects.
   */
  match_result match(std::span<std::int32_t const> tokens, probe_memo& memo);

  /**
   * @brief What `match` would report, without counting it as a use or splitting anything: for
   *        schedulers ranking many requests, routers and what-if questions. `node` is the deepest
   *        node matched whole (the prefix may end inside its child).
   */
  [[nodiscard]] match_result probe(std::span<std::int32_t const> tokens) const;

  /**
   * @brief `probe(tokens)`, answered from `memo` when this tree filled it for the same tokens (the
   *        same memory, as a waiting request keeps its prompt) and no node the probe read has
   *        changed since; otherwise probed afresh, refilling `memo`. The answer is always what
   *        `probe(tokens)` returns now.
   * @return `memo.result()`
   */
  match_result const& probe(std::span<std::int32_t const> tokens, probe_memo& memo) const;

  /// @brief `probe(tokens).tokens`: the longest cached prefix, without side effects.
  [[nodiscard]] std::int64_t peek(std::span<std::int32_t const> tokens) const { return probe(tokens).tokens; }

  /**
   * @brief Page ids of tier `t` along the path root -> `node`, one per page, -1 where the page is
   *        not resident in `t` (remote: the page's key).
   * @param arriving_too also give the pages a pending copy is filling in `t` (a load on its way)
   * @throw strata::invalid_argument for a stale node
   */
  [[nodiscard]] std::vector<std::int64_t> path_pages(node_ref node, tier t, bool arriving_too = false) const;

  /// @brief Whether `node` still exists (a `node_ref` goes stale when its node is removed).
  [[nodiscard]] bool alive(node_ref node) const noexcept
  { return node.index < nodes_.size() && nodes_[node.index].alive && nodes_[node.index].generation == node.generation; }

  /// @brief Whether page `page` of the device, host or file tier belongs to a node (resident, or
  ///        the destination of a pending copy). False for ids out of range and other tiers.
  [[nodiscard]] bool holds(tier t, std::int64_t page) const noexcept;

  /// @brief Pages on the path root -> `node`. @throw strata::invalid_argument for a stale node
  [[nodiscard]] std::int64_t path_length(node_ref node) const;

  // --- insertion and transient nodes ---------------------------------------------------------------

  /**
   * @brief Caches the whole pages of `tokens`, held in `device_pages` (one per whole page): the
   *        request's page table, where its cached prefix may use the very pages the tree holds.
   *
   * A page the tree already holds on the device (or is copying there) under the same id is kept as
   * it is; under another id the caller's page is a duplicate. Duplicates, and pages past a prefix
   * another request is computing, are not taken: the result lists them for the caller to free.
   * Pages cached only in lower tiers take the caller's device pages. Under write-through, backups
   * are queued (`take_copies`).
   * @throw strata::invalid_argument when `device_pages` does not hold one id per whole page, or an id
   *        is out of the device range, repeated, or owned by the tree other than at its position
   */
  [[nodiscard]] insert_result insert(std::span<std::int32_t const> tokens, std::span<std::int64_t const> device_pages);

  /**
   * @brief Marks the uncached whole pages of `tokens` as about to be computed by `request`
   *        (`in_queue`): later matches report them as a transient match (a delay hit past the threshold).
   * @return tokens marked: 0 when everything is cached, or when the prefix continues into another
   *         request's transient node (that request computes it)
   * @throw strata::invalid_argument when `request` already has transient pages
   */
  std::int64_t mark_in_queue(request_id request, std::span<std::int32_t const> tokens);

  /**
   * @brief `in_queue` -> `in_flight` for `request`'s transient pages (its prefill has started).
   * @throw strata::invalid_argument for a request without transient pages
   */
  void mark_in_flight(request_id request)
  {
    std::uint32_t const n = transient_node(request, "mark_in_flight");
    nodes_[n].state = transient_state::in_flight;
    changed(n);
  }

  /// @brief Transient pages of `request` (0 if none): how many device pages `commit` takes.
  [[nodiscard]] std::int64_t transient_pages(request_id request) const;

  /// @brief Requests with transient pages.
  [[nodiscard]] std::size_t transient_requests() const noexcept { return transient_.size(); }

  /**
   * @brief Turns `request`'s transient pages permanent, resident in `device_pages`.
   * @throw strata::invalid_argument for a request without transient pages, a page count different
   *        from `transient_pages(request)`, or device ids out of range, repeated or already owned
   */
  node_ref commit(request_id request, std::span<std::int64_t const> device_pages);

  /**
   * @brief Removes `request`'s transient pages (its prefill was cancelled or failed).
   * @throw strata::invalid_argument for a request without transient pages
   */
  void abort(request_id request);

  // --- tiers that outlive the index, prefetch, lost copies --------------------------------------------

  /**
   * @brief The content key of a page: its ids (`page_tokens` of them) hashed over the key of the
   *        page before it (0 for a prompt's first page). Equal keys, equal prefixes. Record stores
   *        keep it in every record (`copy_order::keys`): it is part of the file tier's format, so
   *        its definition never changes within a format version.
   * @throw strata::invalid_argument when `page` does not hold `page_tokens` ids
   */
  [[nodiscard]] std::uint64_t page_key(std::span<std::int32_t const> page, std::uint64_t parent_key) const;

  /**
   * @brief Records that the whole pages of `tokens` are held in tier `t` (host or file) at `slots`,
   *        one per whole page: a store that kept its pages across a restart (`file_store::open`)
   *        tells a new index where they are. The slots are claimed in the tier's allocator. Pages the
   *        index already holds in `t` keep their slots (the given one is not taken, and stays free);
   *        the walk stops at a transient node (nothing hangs below one). Adopted nodes count as used now.
   *        The remote tier takes no slots (`slots` empty: its pages are named by their keys): the
   *        pages another instance put in a shared store; the walk stops where its capacity ends.
   * @return pages taken, and the deepest node walked
   * @throw strata::invalid_argument for another tier or one the tree lacks, a slot count other than
   *        the whole pages, or a slot out of range, listed twice or already allocated; nothing changes then
   */
  adopt_result adopt(tier t, std::span<std::int32_t const> tokens, std::span<std::int64_t const> slots);

  /**
   * @brief Copies the path root -> `node` into the host tier from below (file or remote) wherever a
   *        node is on neither the device nor the host and nothing is on its way there: a waiting
   *        request's prefix moves up before its load needs it. Host slots come from the host tier,
   *        evicting (demoting) pages used before now; the walk stops where there is no room. The
   *        copies are like backups: the lower copy stays, and until `complete` a load still reads
   *        from below (so a prefetch that lands late costs nothing but its bandwidth).
   * @return the copies to run (empty without a host tier, or when nothing is below it)
   * @throw strata::invalid_argument for a stale node
   */
  [[nodiscard]] std::vector<copy_order> prefetch(node_ref node);

  /**
   * @brief The copy of `node` in tier `t` is lost (a record store could not read it back intact):
   *        drop it. When it was the node's only copy the prefix is broken there, and the node goes
   *        with its whole subtree (every copy of it in every tier, and the `in_queue` marks of waiting
   *        requests below it: `unmarked`). A node that would go while it is locked, pinned (a transfer
   *        pending) or `in_flight` stops it: nothing changes, and a later failure tries again.
   * @throw strata::invalid_argument for a stale node
   */
  [[nodiscard]] discard_result discard(node_ref node, tier t);

  /**
   * @brief Page `page` of tier `t` (a host or file slot) is lost: as `discard`, from that page on.
   *        The node holding it is split there; the pages before it keep their copy in `t` (the
   *        intact prefix stays cached), the page and what follows go as `discard` of the lower
   *        half. A page no node holds in `t` (already gone) changes nothing (`dropped` true).
   * @throw strata::invalid_argument for the device tier, or a page out of the tier's range
   */
  [[nodiscard]] discard_result discard_from(tier t, std::int64_t page);

  // --- locks -----------------------------------------------------------------------------------------

  /**
   * @brief Locks the pages of tier `t` along root -> `node`: not evicted from `t` until unlocked.
   * @throw strata::invalid_argument for a stale node
   */
  void lock(node_ref node, tier t);

  /**
   * @brief Undoes one `lock(node, t)`.
   * @throw strata::invalid_argument for a stale node, or a path not locked in `t`
   */
  void unlock(node_ref node, tier t);

  /// @brief Lock count of tier `t` on `node`. @throw strata::invalid_argument for a stale node
  [[nodiscard]] std::int64_t locks(node_ref node, tier t) const;

  // --- copies ----------------------------------------------------------------------------------------

  /// @brief Pages on the path root -> `node` not on (or on their way to) the device.
  [[nodiscard]] std::int64_t pages_to_load(node_ref node) const;

  /**
   * @brief Loads the path root -> `node` onto the device: a copy, from the fastest lower tier holding
   *        it, for every node of the path that is not on the device or on its way there.
   * @param device_pages free device pages, `pages_to_load(node)` of them, in path order
   * @throw strata::invalid_argument for a stale node, the wrong number of pages, or ids out of
   *        range, repeated or owned
   */
  [[nodiscard]] std::vector<copy_order> load(node_ref node, std::span<std::int64_t const> device_pages);

  /**
   * @brief Pages the tree evicted on its own to make room (for a backup or a demotion into a full
   *        tier), as (tier, page ids or remote keys) lists; emptied. Their demotions are in
   *        `take_copies`.
   */
  [[nodiscard]] std::vector<std::pair<tier, std::vector<std::int64_t>>> take_internal_evictions();

  /// @brief Backups and demotions queued by the write policy and by internal evictions; emptied.
  [[nodiscard]] std::vector<copy_order> take_copies();

  /**
   * @brief A copy has landed: its destination becomes resident; for a demotion the source pages are
   *        freed, and returned when they are device pages (for the engine to reuse). A source that
   *        another pending transfer still reads (a load from the tier being left) stays pinned until
   *        that transfer completes or is cancelled, which then frees it; a source locked in its tier
   *        meanwhile stays (the demotion became a backup).
   * @return device pages freed now: the caller must return them to its pool
   * @throw strata::invalid_argument for an unknown or finished transfer
   */
  [[nodiscard]] std::vector<std::int64_t> complete(transfer_id id);

  /**
   * @brief A copy failed or was abandoned: its destination pages are released (device destination
   *        pages are the caller's again), nothing else changes — except that a demotion which
   *        completed while this copy still read its source frees that source now.
   * @return device pages freed by such a deferred demotion (for the engine to reuse)
   * @throw strata::invalid_argument for an unknown or finished transfer
   */
  [[nodiscard]] std::vector<std::int64_t> cancel(transfer_id id);

  /// @brief Transfers ordered and not yet completed or cancelled.
  [[nodiscard]] std::size_t pending_transfers() const noexcept { return transfers_.size(); }

  // --- eviction --------------------------------------------------------------------------------------

  /**
   * @brief Frees `pages` pages of tier `t` (the last node taken may add a few more), least recently
   *        used tier-leaves first; fewer when not enough are evictable now (never locked, transient
   *        or pinned nodes). A node becomes a tier-leaf once its children have left the tier: a
   *        dropped leaf's parent is taken in the same call, a demoted leaf's only once its demotion
   *        completes (until then both copies are held), so under write-back a call frees at most
   *        the tier's current leaves and a caller that needs more calls again after completing.
   *
   * Where a node goes: leaving the device, it is demoted to the host under write-back, and dropped
   * otherwise (under write-through the host holds it already; a selective policy did not find it
   * worth keeping) — except a node whose only copy is on the device while nodes hang below it (a
   * backup that found no room, or a selective one not yet due): it may not be dropped, so it is
   * demoted under any policy, to the host or, when the host has no room, to the first lower tier
   * that has. Leaving the host or the file tier, a node is demoted to the next configured tier.
   * A record tier (file, remote) takes only a node worth reading back and within its write backlog
   * (`record_breakeven_tokens`, `write_backlog_pages`); one it refuses finds no room there. A node
   * whose only copy finds no room below is dropped if it is an unlocked leaf of the whole tree, or
   * if everything below it is unlocked and cached in record tiers only (that subtree goes with it:
   * no prefix reaches it any more), and otherwise stays.
   * @throw strata::invalid_argument for a negative page count, or a tier the tree does not have
   */
  [[nodiscard]] eviction_result evict(tier t, std::int64_t pages) { return evict_up_to(t, pages, ~std::uint64_t{0}); }

  /**
   * @brief Pages eviction from tier `t` could free, leaf after leaf: the tier's resident pages but
   *        those of locked nodes and of nodes with a pending transfer (a little more than it can
   *        free while a pinned node blocks its unlocked ancestors, until the copy lands).
   */
  [[nodiscard]] std::int64_t reclaimable_pages(tier t) const noexcept
  { return stats_.resident_pages[std::size_t(t)] - held_[std::size_t(t)]; }

  /// @brief Pages evictable from tier `t` right now (tier-leaves only).
  [[nodiscard]] std::int64_t evictable_pages(tier t) const;

  // --- state -----------------------------------------------------------------------------------------

  /// @brief Counters and residency.
  [[nodiscard]] hiradix_stats stats() const;
  /// @brief Nodes alive, the root included.
  [[nodiscard]] std::size_t node_count() const noexcept { return nodes_.size() - free_nodes_.size(); }
  /// @brief Whether `node` is resident in tier `t`. @throw strata::invalid_argument for a stale node
  [[nodiscard]] bool resident(node_ref node, tier t) const;
  /// @brief Free slots of the host or file tier (0 for the others).
  [[nodiscard]] std::int64_t free_slots(tier t) const;
  /// @brief Bytes of index memory: nodes, tokens, hashes, page tables, child maps, owner tables.
  [[nodiscard]] std::size_t memory_bytes() const;

  /**
   * @brief Checks every internal invariant; throws `strata::error` naming the first one broken.
   *
   * For tests: lock counts are non-negative and never larger below than above (a lock holds a whole
   * path); resident page counts equal a recount; no page id is owned twice in a tier and the owner
   * tables agree; transient nodes are leaves of a live request; every permanent node is cached or on
   * its way; resident-children counts are exact; the eviction candidates are exactly the evictable
   * nodes, keyed by their last use.
   */
  void check_invariants() const;

 private:
  // The machinery: defined in index/detail/hiradix_tree/*.inl, never part of the API. Each node's
  // state is `detail::radix_node`; pending transfers are `detail::radix_transfer`.
  using node_data = detail::radix_node;
  using pending = detail::radix_transfer;
  static constexpr std::uint32_t npos = detail::radix_npos;

  /// `evict`, taking only nodes last used no later than `newest`: making room for a demotion (or a
  /// backup) never pushes out what was used more recently than the node moving in.
  eviction_result evict_up_to(tier t, std::int64_t pages, std::uint64_t newest);

  // -- hashing and lookup --
  [[nodiscard]] std::uint64_t page_hash(std::int32_t const* page, std::uint64_t seed) const noexcept;
  static std::int64_t remote_key(node_data const& n, std::int64_t k) noexcept
  { return static_cast<std::int64_t>(n.hashes[std::size_t(k)] >> 1); }
  /// Real tokens of one page, for reported counts.
  [[nodiscard]] std::int64_t page_token_count() const noexcept { return config_.page_tokens * config_.tokens_per_id; }
  [[nodiscard]] std::int64_t whole_pages(std::span<std::int32_t const> tokens) const noexcept
  { return static_cast<std::int64_t>(tokens.size()) / config_.page_tokens; }
  [[nodiscard]] std::int32_t const* page_at(std::span<std::int32_t const> tokens, std::int64_t p) const noexcept
  { return tokens.data() + p * config_.page_tokens; }
  [[nodiscard]] bool same_pages(std::int32_t const* a, std::int32_t const* b, std::int64_t pages) const noexcept
  { return std::memcmp(a, b, static_cast<std::size_t>(pages * config_.page_tokens) * sizeof(std::int32_t)) == 0; }
  [[nodiscard]] std::uint32_t find_child(std::uint32_t parent, std::span<std::int32_t const> tokens,
                                         std::int64_t p) const;
  /// `match`'s walk; with `memo` (which holds for `tokens`), along its path while it is unchanged.
  match_result match_walk(std::span<std::int32_t const> tokens, probe_memo* memo);
  /// `probe`'s walk; with `memo`, records what it read there.
  [[nodiscard]] match_result walk(std::span<std::int32_t const> tokens, probe_memo* memo) const;
  /// Whether `memo` still answers a probe of `tokens` (refreshes its record of a lookup still empty).
  [[nodiscard]] bool memo_holds(std::span<std::int32_t const> tokens, probe_memo& memo) const;
  /// Node `i` changed in a way a probe reads.
  void changed(std::uint32_t i) noexcept { nodes_[i].stamp = ++changes_; }
  /// Pages of `c`'s edge equal to tokens' pages from `p` (at least 1: `find_child` matched the first).
  [[nodiscard]] std::int64_t common_pages(node_data const& c, std::span<std::int32_t const> tokens, std::int64_t p,
                                          std::int64_t pages) const noexcept;

  // -- structure --
  [[nodiscard]] node_ref ref(std::uint32_t i) const noexcept { return {i, nodes_[i].generation}; }
  void check(node_ref r) const;
  [[nodiscard]] std::vector<std::uint32_t> path_of(std::uint32_t i) const;
  static bool cached(node_data const& n) noexcept
  { return n.resident[0] || n.resident[1] || n.resident[2] || n.resident[3]; }
  /// The fastest tier holding a cached node (a load comes from there).
  static std::size_t fastest_tier(node_data const& n) noexcept;
  static bool has_pins(node_data const& n) noexcept { return n.pins[0] + n.pins[1] + n.pins[2] + n.pins[3] > 0; }
  [[nodiscard]] bool loadable(std::uint32_t i) const noexcept;
  std::uint32_t transient_node(request_id request, char const* what) const;
  /// Rejects device ids out of range, repeated, or owned by the tree; `held[p]`, when given, is the
  /// id the tree holds at position p of the inserted path, which the caller may pass there.
  /// Range, duplicates, and pages the tree owns: allowed only for `insert`, at the position of the
  /// prompt's cached path (`insert_tokens`) where the tree holds that very page.
  void check_new_device_pages(std::span<std::int64_t const> pages, char const* what,
                              std::span<std::int32_t const> const* insert_tokens = nullptr);
  /// The device page the tree holds (or is loading) at each position of `tokens`' cached path; -1
  /// past it or where there is none. Read-only.
  [[nodiscard]] std::vector<std::int64_t> held_device_pages(std::span<std::int32_t const> tokens,
                                                            std::int64_t pages) const;

  std::uint32_t new_node();
  void link_child(std::uint32_t parent, std::uint32_t child);
  void unlink_child(std::uint32_t parent, std::uint32_t child);
  std::uint32_t add_node(std::uint32_t parent, std::span<std::int32_t const> tokens, std::int64_t p, std::int64_t end,
                         transient_state state, request_id owner);
  /// Splits node `i` (no pending transfer) after its first `k` pages; returns the node of those `k`.
  std::uint32_t split(std::uint32_t i, std::int64_t k);
  void remove_node(std::uint32_t i);

  // -- residency --
  void set_pages(std::uint32_t i, tier t, std::span<std::int64_t const> pages);
  void make_resident(std::uint32_t i, tier t);
  /// Gives back the pages of tier `t` (host and file slots to their allocator); returns their ids.
  std::vector<std::int64_t> release_pages(std::uint32_t i, tier t);
  /// Removes the copy in tier `t` (and the node, once it is cached nowhere, if asked). Returns the
  /// page ids.
  std::vector<std::int64_t> drop(std::uint32_t i, tier t, bool remove_if_empty);
  /// Removes those of `nodes` (and then their emptied ancestors) that are cached nowhere, have no
  /// pending transfer, no children and are not transient.
  void remove_empty(std::vector<std::uint32_t> nodes);
  [[nodiscard]] bool copies_elsewhere(std::uint32_t i, tier t) const noexcept;
  /// A node whose only copy is on the device while nodes hang below it (a backup that found no
  /// room, or a selective one not yet due): it may not be dropped, so it is demoted under any write
  /// policy — keeping it would pin its device pages for good. (A leaf is dropped.)
  [[nodiscard]] bool stuck_on_device(std::uint32_t i, tier t) const noexcept;
  /// Where a node leaving tier `t` goes (nothing: it is dropped).
  [[nodiscard]] std::optional<tier> demotion_target(std::uint32_t i, tier t) const noexcept;
  /// Pages for `count` pages of node `owner` in tier `t` (host and file: slots, evicting to make
  /// room; remote: capacity). Nothing when there is no room.
  std::optional<std::vector<std::int64_t>> allocate(tier t, std::int64_t count, std::uint32_t owner);
  /// Queues a copy of node `i` from `from` to `to` (whose pages are already set) and pins both.
  copy_order order(std::uint32_t i, tier from, tier to, bool demotion);
  void unpin(pending const& t);
  /// Drops the copies that completed demotions left behind once nothing reads them any more: the
  /// nodes of `t` in the tier `t` read from. Device ids go to `freed`.
  void apply_pending_drops(pending const& t, std::vector<std::int64_t>& freed);

  // -- match / probe bookkeeping: the same answer whether or not the walk has side effects --
  /// `k` pages of transient node `c` matched: the walk stops there.
  void note_transient(match_result& r, node_data const& c, std::int64_t k) const noexcept;
  /// `k` cached pages of node `c` matched; `device_run` tracks whether the prefix so far is all on the device.
  void note_cached(match_result& r, node_data const& c, std::int64_t k, bool& device_run) const noexcept;

  /// Whether a copy of node `i` into record tier `t` is admitted: worth reading back
  /// (`record_breakeven_tokens`) and within the tier's write backlog; counts what it refuses.
  bool admit_record(std::uint32_t i, tier t);
  /// Real tokens on the path above node `i`.
  [[nodiscard]] std::int64_t depth_tokens(std::uint32_t i) const noexcept;
  /// Drops node `i`'s only copy in tier `t` together with its whole subtree when that subtree is
  /// cached in record tiers only and nothing of it is locked, pinned or transient (it cannot be
  /// reached once `i` goes). Returns whether it did; the freed pages of `t` go to `freed`.
  bool drop_with_record_subtree(std::uint32_t i, tier t, std::vector<std::int64_t>& freed);

  /// Queues a device -> host backup of node `i` if it is on the device only and nothing is pending
  /// (a node larger than the whole host tier is backed up to the file tier instead, if admitted).
  void backup(std::uint32_t i);

  /// Queues a host -> file copy of node `i` (the file write policy) if it is on the host only and
  /// nothing is pending.
  void file_backup(std::uint32_t i);
  /// Host -> remote copy of a node on the host the remote tier lacks (`remote_backup_policy`).
  void remote_backup(std::uint32_t i);
  /// Whether a host -> record tier copy of a node can start now (on the host, not in `t`, unpinned).
  [[nodiscard]] bool record_copy_possible(std::uint32_t i, tier t) const;
  /// Starts a host -> record tier copy of a node (room allowing): true when queued.
  bool record_copy(std::uint32_t i, tier t);
  /// After a node was admitted to a record tier: its ancestors the tier lacks go there too, whatever
  /// their depth, because a record is found only through a path from the root (a remote lookup
  /// counts leading pages, a restart adopts chains from a first page).
  void record_ancestors(std::uint32_t i, tier t);
  /// `adopt`'s checks of a host or file tier's slots (nothing changes).
  void check_adopt_slots(tier t, std::span<std::int32_t const> tokens, std::span<std::int64_t const> slots) const;

  // -- held pages: resident and locked or pinned, per tier (for reclaimable_pages) --
  [[nodiscard]] static bool held_in(node_data const& n, std::size_t t) noexcept
  { return n.alive && n.resident[t] && (n.locks[t] > 0 || has_pins(n)); }
  void unaccount(std::uint32_t i) noexcept;
  void account(std::uint32_t i) noexcept;

  // -- eviction candidates: tier-leaves that are resident, unlocked, unpinned, permanent --
  [[nodiscard]] bool evictable(std::uint32_t i, tier t) const noexcept;
  void set_candidate(std::uint32_t i, tier t, bool on);
  void refresh(std::uint32_t i);
  void touch(std::uint32_t i);

  hiradix_config config_;
  std::vector<node_data> nodes_;
  std::vector<std::uint32_t> free_nodes_;
  std::array<std::vector<std::uint32_t>, 3> owner_;  // page id -> node index + 1 (0: free)
  std::vector<std::uint64_t> page_marks_;            // scratch of check_new_device_pages: all zero between calls
  std::array<std::unique_ptr<slot_allocator>, 3> own_slots_;  // when no tier lends its allocator
  std::array<slot_allocator*, 3> slots_{};                    // host and file slots, whoever owns them
  std::int64_t remote_used_{};
  std::array<std::set<std::pair<std::uint64_t, std::uint32_t>>, tier_count> lru_;
  std::unordered_map<request_id, std::uint32_t, request_hash> transient_;
  std::map<transfer_id, pending> transfers_;
  std::vector<copy_order> queued_;
  std::vector<std::pair<tier, std::vector<std::int64_t>>> internal_;
  transfer_id next_transfer_{};
  std::uint64_t clock_{};
  std::uint64_t changes_{};                           // the change clock of node stamps (probe memos)
  std::uint64_t serial_{detail::next_tree_serial()};  // tells this tree's memos from another's
  hiradix_stats stats_{};
  std::array<std::int64_t, tier_count> held_{};
  std::array<std::int64_t, tier_count> inbound_{};  // pages of pending copies into each tier
};

}  // namespace strata

#include <strata/index/detail/hiradix_tree/changes.inl>
#include <strata/index/detail/hiradix_tree/eviction.inl>
#include <strata/index/detail/hiradix_tree/invariants.inl>
#include <strata/index/detail/hiradix_tree/lookup.inl>
#include <strata/index/detail/hiradix_tree/structure.inl>
