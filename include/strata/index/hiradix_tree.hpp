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
 */
#pragma once

#include <strata/error.hpp>
#include <strata/tier/slot_allocator.hpp>
#include <strata/types.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

namespace strata {

/// @brief Slot allocators the tiers lend the tree (host and file; null: the tree makes its own from
///        the configured capacity). Indexed by `tier`; the device and remote entries are unused.
using tier_slots = std::array<slot_allocator*, tier_count>;

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
  write_policy policy = write_policy::write_through_selective;  ///< device -> host backups
  /// Host -> file copies: on host eviction only (`write_back`, the default: the file tier holds
  /// what the host lets go), as soon as a page is on the host (`write_through`: the file tier
  /// holds everything the host does, so a restart or a host eviction loses nothing), or once the
  /// node is hit `selective_hits` times (`write_through_selective`).
  write_policy file_policy = write_policy::write_back;
  std::int64_t selective_hits = 2;     ///< hits before a selective backup (to the host, or to the file tier)
  std::int64_t delay_hit_tokens = 64;  ///< shortest transient match reported as a delay hit
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
};

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
  explicit hiradix_tree(hiradix_config config, tier_slots slots = {}) : config_{config}
  {
    for (std::size_t t = 1; t < 3; ++t) {  // a tier's own allocator: its capacity is the tier's
      if (slots[t] == nullptr) { continue; }
      STRATA_EXPECTS(slots[t]->used() == 0, "hiradix_tree: the ", to_string(tier(t)), " tier's slot allocator has ",
                     slots[t]->used(), " slots in use: the tree must be their only user");
      config.capacity[t] = config_.capacity[t] = slots[t]->capacity();
    }
    STRATA_EXPECTS(config.page_tokens > 0, "hiradix_tree: page_tokens must be positive, got ", config.page_tokens);
    STRATA_EXPECTS(config.tokens_per_id > 0, "hiradix_tree: tokens_per_id must be positive, got ",
                   config.tokens_per_id);
    STRATA_EXPECTS(config.page_bytes >= 0, "hiradix_tree: page_bytes must not be negative, got ", config.page_bytes);
    for (std::size_t t = 0; t < tier_count; ++t) {
      STRATA_EXPECTS(config.capacity[t] >= 0, "hiradix_tree: capacity of the ", to_string(tier(t)),
                     " tier must not be negative, got ", config.capacity[t]);
    }
    STRATA_EXPECTS(config.capacity[0] > 0, "hiradix_tree: the device tier needs a positive capacity");
    STRATA_EXPECTS(config.selective_hits > 0, "hiradix_tree: selective_hits must be positive, got ",
                   config.selective_hits);
    STRATA_EXPECTS(config.delay_hit_tokens >= 0, "hiradix_tree: delay_hit_tokens must not be negative, got ",
                   config.delay_hit_tokens);
    for (std::size_t t = 0; t < 3; ++t) {
      owner_[t].assign(static_cast<std::size_t>(config.capacity[t]), 0);
    }
    for (std::size_t t = 1; t < 3; ++t) {
      if (slots[t] != nullptr) {
        slots_[t] = slots[t];
      } else if (config.capacity[t] > 0) {
        own_slots_[t] = std::make_unique<slot_allocator>(config.capacity[t]);
        slots_[t] = own_slots_[t].get();
      }
    }
    nodes_.emplace_back();  // the root: the empty prefix, always alive, never evicted
    nodes_[0].alive = true;
  }

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
  match_result match(std::span<std::int32_t const> tokens)
  {
    ++clock_;
    match_result r;
    std::int64_t const pages = whole_pages(tokens);
    stats_.queried_tokens += pages * page_token_count();
    std::uint32_t cur = 0;
    std::int64_t p = 0;
    bool device_run = true;
    while (p < pages) {
      std::uint32_t const child = find_child(cur, tokens, p);
      if (child == npos) { break; }
      std::int64_t const k = common_pages(nodes_[child], tokens, p, pages);
      if (nodes_[child].state != transient_state::none) {
        note_transient(r, nodes_[child], k);
        break;
      }
      if (!cached(nodes_[child])) { break; }
      bool const partial = k < nodes_[child].pages();
      std::uint32_t const n = partial ? split(child, k) : child;
      touch(n);
      ++nodes_[n].hits;
      node_data const& m = nodes_[n];
      note_cached(r, m, k, device_run);
      if (config_.policy == write_policy::write_through_selective && m.hits >= config_.selective_hits) { backup(n); }
      if (config_.file_policy == write_policy::write_through_selective && m.hits >= config_.selective_hits) {
        file_backup(n);
      }
      cur = n;
      p += k;
      if (partial) { break; }
    }
    r.tokens = p * page_token_count();
    r.node = ref(cur);
    stats_.matched_tokens += r.tokens;
    for (std::size_t t = 0; t < tier_count; ++t) {
      stats_.hit_tokens[t] += r.tier_tokens[t];
    }
    if (r.delay_hit) { ++stats_.delay_hits; }
    return r;
  }

  /**
   * @brief What `match` would report, without counting it as a use or splitting anything: for
   *        schedulers ranking many requests, routers and what-if questions. `node` is the deepest
   *        node matched whole (the prefix may end inside its child).
   */
  [[nodiscard]] match_result probe(std::span<std::int32_t const> tokens) const
  {
    match_result r;
    std::int64_t const pages = whole_pages(tokens);
    std::uint32_t cur = 0;
    std::int64_t p = 0;
    bool device_run = true;
    while (p < pages) {
      std::uint32_t const child = find_child(cur, tokens, p);
      if (child == npos) { break; }
      node_data const& c = nodes_[child];
      std::int64_t const k = common_pages(c, tokens, p, pages);
      if (c.state != transient_state::none) {
        note_transient(r, c, k);
        break;
      }
      if (!cached(c)) { break; }
      note_cached(r, c, k, device_run);
      p += k;
      if (k < c.pages()) { break; }
      cur = child;
    }
    r.tokens = p * page_token_count();
    r.node = ref(cur);
    return r;
  }

  /// @brief `probe(tokens).tokens`: the longest cached prefix, without side effects.
  [[nodiscard]] std::int64_t peek(std::span<std::int32_t const> tokens) const { return probe(tokens).tokens; }

  /**
   * @brief Page ids of tier `t` along the path root -> `node`, one per page, -1 where the page is
   *        not resident in `t` (remote: the page's key).
   * @param arriving_too also give the pages a pending copy is filling in `t` (a load on its way)
   * @throw strata::invalid_argument for a stale node
   */
  [[nodiscard]] std::vector<std::int64_t> path_pages(node_ref node, tier t, bool arriving_too = false) const
  {
    check(node);
    std::vector<std::int64_t> out;
    for (auto i : path_of(node.index)) {
      node_data const& n = nodes_[i];
      bool const arriving =
          arriving_too && t != tier::remote && n.pins[std::size_t(t)] > 0 && !n.tier_pages[std::size_t(t)].empty();
      for (std::int64_t k = 0; k < n.pages(); ++k) {
        if (!n.resident[std::size_t(t)] && !arriving) {
          out.push_back(-1);
        } else if (t == tier::remote) {
          out.push_back(remote_key(n, k));
        } else {
          out.push_back(n.tier_pages[std::size_t(t)][std::size_t(k)]);
        }
      }
    }
    return out;
  }

  /// @brief Whether `node` still exists (a `node_ref` goes stale when its node is removed).
  [[nodiscard]] bool alive(node_ref node) const noexcept
  { return node.index < nodes_.size() && nodes_[node.index].alive && nodes_[node.index].generation == node.generation; }

  /// @brief Whether page `page` of the device, host or file tier belongs to a node (resident, or
  ///        the destination of a pending copy). False for ids out of range and other tiers.
  [[nodiscard]] bool holds(tier t, std::int64_t page) const noexcept
  {
    std::size_t const u = std::size_t(t);
    return u < 3 && page >= 0 && std::size_t(page) < owner_[u].size() && owner_[u][std::size_t(page)] != 0;
  }

  /// @brief Pages on the path root -> `node`. @throw strata::invalid_argument for a stale node
  [[nodiscard]] std::int64_t path_length(node_ref node) const
  {
    check(node);
    std::int64_t n = 0;
    for (auto i : path_of(node.index)) {
      n += nodes_[i].pages();
    }
    return n;
  }

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
  [[nodiscard]] insert_result insert(std::span<std::int32_t const> tokens, std::span<std::int64_t const> device_pages)
  {
    std::int64_t const pages = whole_pages(tokens);
    STRATA_EXPECTS(static_cast<std::int64_t>(device_pages.size()) == pages,
                   "hiradix_tree::insert: ", device_pages.size(), " device pages for ", pages, " whole pages of ",
                   tokens.size(), " tokens");
    check_new_device_pages(device_pages, "insert", &tokens);
    ++clock_;
    insert_result r;
    std::uint32_t cur = 0;
    std::int64_t p = 0;
    auto unused = [&](std::int64_t from, std::int64_t to) {
      r.unused_device_pages.insert(r.unused_device_pages.end(), device_pages.begin() + from, device_pages.begin() + to);
    };
    while (p < pages) {
      std::uint32_t const child = find_child(cur, tokens, p);
      if (child == npos) {
        std::uint32_t const n = add_node(cur, tokens, p, pages, transient_state::none, {});
        set_pages(n, tier::device, device_pages.subspan(std::size_t(p)));
        make_resident(n, tier::device);
        r.new_pages += pages - p;
        if (config_.policy == write_policy::write_through) { backup(n); }
        cur = n;
        p = pages;
        break;
      }
      if (nodes_[child].state != transient_state::none || !cached(nodes_[child])) { break; }
      std::int64_t const k = common_pages(nodes_[child], tokens, p, pages);
      bool const partial = k < nodes_[child].pages();
      std::uint32_t const n = partial ? split(child, k) : child;
      touch(n);
      if (!nodes_[n].resident[0] && nodes_[n].pins[0] == 0) {
        set_pages(n, tier::device, device_pages.subspan(std::size_t(p), std::size_t(k)));
        make_resident(n, tier::device);
        r.new_pages += k;
        if (config_.policy == write_policy::write_through) { backup(n); }
      } else {
        auto const& mine = nodes_[n].tier_pages[0];
        for (std::int64_t j = 0; j < k; ++j) {  // the tree's own pages stay; other ids are duplicates
          std::int64_t const given = device_pages[std::size_t(p + j)];
          if (mine.empty() || mine[std::size_t(j)] != given) { r.unused_device_pages.push_back(given); }
        }
      }
      cur = n;
      p += k;  // after a partial match the next page differs: the next round adds a node for the rest
    }
    unused(p, pages);
    r.node = ref(cur);
    return r;
  }

  /**
   * @brief Marks the uncached whole pages of `tokens` as about to be computed by `request`
   *        (`in_queue`): later matches report them as a transient match (a delay hit past the threshold).
   * @return tokens marked: 0 when everything is cached, or when the prefix continues into another
   *         request's transient node (that request computes it)
   * @throw strata::invalid_argument when `request` already has transient pages
   */
  std::int64_t mark_in_queue(request_id request, std::span<std::int32_t const> tokens)
  {
    STRATA_EXPECTS(transient_.count(request) == 0, "hiradix_tree::mark_in_queue: request ", request.value,
                   " already has transient pages");
    ++clock_;
    std::int64_t const pages = whole_pages(tokens);
    std::uint32_t cur = 0;
    std::int64_t p = 0;
    while (p < pages) {
      std::uint32_t const child = find_child(cur, tokens, p);
      if (child == npos) { break; }
      if (nodes_[child].state != transient_state::none) { return 0; }
      if (!cached(nodes_[child])) { break; }
      std::int64_t const k = common_pages(nodes_[child], tokens, p, pages);
      bool const partial = k < nodes_[child].pages();
      cur = partial ? split(child, k) : child;
      p += k;
      if (partial) { break; }
    }
    if (p == pages) { return 0; }
    if (cur != 0 && (nodes_[cur].state != transient_state::none)) { return 0; }
    std::uint32_t const n = add_node(cur, tokens, p, pages, transient_state::in_queue, request);
    transient_.emplace(request, n);
    return (pages - p) * page_token_count();
  }

  /**
   * @brief `in_queue` -> `in_flight` for `request`'s transient pages (its prefill has started).
   * @throw strata::invalid_argument for a request without transient pages
   */
  void mark_in_flight(request_id request)
  { nodes_[transient_node(request, "mark_in_flight")].state = transient_state::in_flight; }

  /// @brief Transient pages of `request` (0 if none): how many device pages `commit` takes.
  [[nodiscard]] std::int64_t transient_pages(request_id request) const
  {
    auto const it = transient_.find(request);
    return it == transient_.end() ? 0 : nodes_[it->second].pages();
  }

  /// @brief Requests with transient pages.
  [[nodiscard]] std::size_t transient_requests() const noexcept { return transient_.size(); }

  /**
   * @brief Turns `request`'s transient pages permanent, resident in `device_pages`.
   * @throw strata::invalid_argument for a request without transient pages, a page count different
   *        from `transient_pages(request)`, or device ids out of range, repeated or already owned
   */
  node_ref commit(request_id request, std::span<std::int64_t const> device_pages)
  {
    std::uint32_t const n = transient_node(request, "commit");
    STRATA_EXPECTS(static_cast<std::int64_t>(device_pages.size()) == nodes_[n].pages(),
                   "hiradix_tree::commit: request ", request.value, " has ", nodes_[n].pages(),
                   " transient pages, got ", device_pages.size(), " device pages");
    check_new_device_pages(device_pages, "commit");
    ++clock_;
    transient_.erase(request);
    nodes_[n].state = transient_state::none;
    nodes_[n].owner = {};
    set_pages(n, tier::device, device_pages);
    make_resident(n, tier::device);
    touch(n);
    if (config_.policy == write_policy::write_through) { backup(n); }
    return ref(n);
  }

  /**
   * @brief Removes `request`'s transient pages (its prefill was cancelled or failed).
   * @throw strata::invalid_argument for a request without transient pages
   */
  void abort(request_id request)
  {
    std::uint32_t const n = transient_node(request, "abort");
    transient_.erase(request);
    remove_node(n);
  }

  // --- tiers that outlive the index, prefetch, lost copies --------------------------------------------

  /**
   * @brief The content key of a page: its ids (`page_tokens` of them) hashed over the key of the
   *        page before it (0 for a prompt's first page). Equal keys, equal prefixes. Record stores
   *        keep it in every record (`copy_order::keys`): it is part of the file tier's format, so
   *        its definition never changes within a format version.
   * @throw strata::invalid_argument when `page` does not hold `page_tokens` ids
   */
  [[nodiscard]] std::uint64_t page_key(std::span<std::int32_t const> page, std::uint64_t parent_key) const
  {
    STRATA_EXPECTS(std::int64_t(page.size()) == config_.page_tokens, "hiradix_tree::page_key: a page holds ",
                   config_.page_tokens, " ids, got ", page.size());
    return page_hash(page.data(), parent_key);
  }

  /**
   * @brief Records that the whole pages of `tokens` are held in tier `t` (host or file) at `slots`,
   *        one per whole page: a store that kept its pages across a restart (`file_store::open`)
   *        tells a new index where they are. The slots are claimed in the tier's allocator. Pages the
   *        index already holds in `t` keep their slots (the given one is not taken, and stays free);
   *        the walk stops at a transient node (nothing hangs below one). Adopted nodes count as used now.
   * @return pages taken, and the deepest node walked
   * @throw strata::invalid_argument for another tier or one the tree lacks, a slot count other than
   *        the whole pages, or a slot out of range, listed twice or already allocated; nothing changes then
   */
  adopt_result adopt(tier t, std::span<std::int32_t const> tokens, std::span<std::int64_t const> slots)
  {
    STRATA_EXPECTS((t == tier::host || t == tier::file) && has_tier(t),
                   "hiradix_tree::adopt: pages can be adopted into the host or file tier the tree has, not the ",
                   to_string(t), " tier");
    std::int64_t const pages = whole_pages(tokens);
    STRATA_EXPECTS(std::int64_t(slots.size()) == pages, "hiradix_tree::adopt: ", slots.size(), " slots for ", pages,
                   " whole pages");
    slot_allocator& alloc = *slots_[std::size_t(t)];
    {
      std::vector<std::int64_t> sorted(slots.begin(), slots.end());
      std::sort(sorted.begin(), sorted.end());
      for (std::size_t k = 0; k < sorted.size(); ++k) {
        STRATA_EXPECTS(sorted[k] >= 0 && sorted[k] < alloc.capacity(), "hiradix_tree::adopt: slot ", sorted[k],
                       " out of range [0, ", alloc.capacity(), ")");
        STRATA_EXPECTS(k == 0 || sorted[k] != sorted[k - 1], "hiradix_tree::adopt: slot ", sorted[k], " listed twice");
      }
      // The slots of the pages it will take (those the tier does not hold yet) must be free.
      std::uint32_t cur = 0;
      for (std::int64_t p = 0; p < pages;) {
        std::uint32_t const child = find_child(cur, tokens, p);
        bool const fresh = child == npos;
        if (!fresh && nodes_[child].state != transient_state::none) { break; }
        std::int64_t const k = fresh ? pages - p : common_pages(nodes_[child], tokens, p, pages);
        if (fresh || (!nodes_[child].resident[std::size_t(t)] && nodes_[child].pins[std::size_t(t)] == 0)) {
          for (std::int64_t j = p; j < p + k; ++j) {
            STRATA_EXPECTS(!alloc.is_allocated(slots[std::size_t(j)]), "hiradix_tree::adopt: slot ",
                           slots[std::size_t(j)], " of the ", to_string(t), " tier is allocated");
          }
        }
        if (fresh) { break; }
        p += k;
        if (k < nodes_[child].pages()) {  // the walk splits here and adds the rest as a new node
          for (std::int64_t j = p; j < pages; ++j) {
            STRATA_EXPECTS(!alloc.is_allocated(slots[std::size_t(j)]), "hiradix_tree::adopt: slot ",
                           slots[std::size_t(j)], " of the ", to_string(t), " tier is allocated");
          }
          break;
        }
        cur = child;
      }
    }
    ++clock_;
    adopt_result r;
    auto take = [&](std::uint32_t n, std::int64_t from, std::int64_t count) {
      auto const mine = slots.subspan(std::size_t(from), std::size_t(count));
      alloc.claim(mine);
      set_pages(n, t, mine);
      make_resident(n, t);
      touch(n);
      r.pages += count;
    };
    std::uint32_t cur = 0;
    std::int64_t p = 0;
    while (p < pages) {
      std::uint32_t const child = find_child(cur, tokens, p);
      if (child == npos) {
        std::uint32_t const n = add_node(cur, tokens, p, pages, transient_state::none, {});
        take(n, p, pages - p);
        cur = n;
        break;
      }
      if (nodes_[child].state != transient_state::none) { break; }
      std::int64_t const k = common_pages(nodes_[child], tokens, p, pages);
      std::uint32_t const n = k < nodes_[child].pages() ? split(child, k) : child;
      if (!nodes_[n].resident[std::size_t(t)] && nodes_[n].pins[std::size_t(t)] == 0) {
        take(n, p, k);
      } else {
        touch(n);
      }
      cur = n;
      p += k;
    }
    r.node = ref(cur);
    return r;
  }

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
  [[nodiscard]] std::vector<copy_order> prefetch(node_ref node)
  {
    check(node);
    std::vector<copy_order> out;
    if (!has_tier(tier::host)) { return out; }
    ++clock_;
    lock(node, tier::host);  // making room never evicts the path's own host pages
    for (auto i : path_of(node.index)) {
      node_data const& n = nodes_[i];
      if (n.resident[0] || n.resident[1] || n.pins[0] != 0 || n.pins[1] != 0 || !cached(n)) { continue; }
      touch(i);  // as recent as the request waiting for it: room is made from older pages only
      auto pages = allocate(tier::host, nodes_[i].pages(), i);
      if (!pages) { break; }
      set_pages(i, tier::host, *pages);
      out.push_back(order(i, tier(fastest_tier(nodes_[i])), tier::host, false));
    }
    unlock(node, tier::host);
    return out;
  }

  /**
   * @brief The copy of `node` in tier `t` is lost (a record store could not read it back intact):
   *        drop it. When it was the node's only copy the prefix is broken there, and the node goes
   *        with its whole subtree (every copy of it in every tier, and the `in_queue` marks of waiting
   *        requests below it: `unmarked`). A node that would go while it is locked, pinned (a transfer
   *        pending) or `in_flight` stops it: nothing changes, and a later failure tries again.
   * @throw strata::invalid_argument for a stale node
   */
  [[nodiscard]] discard_result discard(node_ref node, tier t)
  {
    check(node);
    discard_result r;
    std::uint32_t const x = node.index;
    auto busy = [&](std::uint32_t i) {
      node_data const& n = nodes_[i];
      return has_pins(n) || n.state == transient_state::in_flight ||
             n.locks[0] + n.locks[1] + n.locks[2] + n.locks[3] > 0;
    };
    if (!nodes_[x].resident[std::size_t(t)]) {
      r.dropped = true;
      return r;
    }
    if (copies_elsewhere(x, t)) {
      if (nodes_[x].pins[std::size_t(t)] != 0 || nodes_[x].locks[std::size_t(t)] != 0) { return r; }
      r.pages[std::size_t(t)] += nodes_[x].pages();
      auto ids = drop(x, t, false);
      if (t == tier::device) { r.freed_device = std::move(ids); }
      r.dropped = true;
      return r;
    }
    std::vector<std::uint32_t> subtree{x};  // parents before children
    for (std::size_t k = 0; k < subtree.size(); ++k) {
      if (busy(subtree[k])) { return r; }
      for (auto const& [key, first] : nodes_[subtree[k]].children) {
        for (std::uint32_t c = first; c != npos; c = nodes_[c].next_same_key) {
          subtree.push_back(c);
        }
      }
    }
    std::uint32_t const parent = nodes_[x].parent;
    if (nodes_[x].state != transient_state::none) { return r; }     // not a cached node
    for (auto it = subtree.rbegin(); it != subtree.rend(); ++it) {  // children first
      if (nodes_[*it].state == transient_state::in_queue) {         // a waiting request's mark: it marks again
        r.unmarked.push_back(nodes_[*it].owner);
        transient_.erase(nodes_[*it].owner);
        remove_node(*it);
        continue;
      }
      for (std::size_t u = 0; u < tier_count; ++u) {
        if (!nodes_[*it].resident[u]) { continue; }
        r.pages[u] += nodes_[*it].pages();
        auto ids = drop(*it, tier(u), false);
        if (u == 0) { r.freed_device.insert(r.freed_device.end(), ids.begin(), ids.end()); }
      }
      remove_node(*it);
    }
    remove_empty({parent});
    r.dropped = true;
    return r;
  }

  // --- locks -----------------------------------------------------------------------------------------

  /**
   * @brief Locks the pages of tier `t` along root -> `node`: not evicted from `t` until unlocked.
   * @throw strata::invalid_argument for a stale node
   */
  void lock(node_ref node, tier t)
  {
    check(node);
    for (std::uint32_t i = node.index; i != 0; i = nodes_[i].parent) {
      unaccount(i);
      ++nodes_[i].locks[std::size_t(t)];
      account(i);
      refresh(i);
    }
  }

  /**
   * @brief Undoes one `lock(node, t)`.
   * @throw strata::invalid_argument for a stale node, or a path not locked in `t`
   */
  void unlock(node_ref node, tier t)
  {
    check(node);
    for (std::uint32_t i = node.index; i != 0; i = nodes_[i].parent) {
      STRATA_EXPECTS(nodes_[i].locks[std::size_t(t)] > 0, "hiradix_tree::unlock: node ", node.index,
                     " is not locked in the ", to_string(t), " tier");
    }
    for (std::uint32_t i = node.index; i != 0; i = nodes_[i].parent) {
      unaccount(i);
      --nodes_[i].locks[std::size_t(t)];
      account(i);
      refresh(i);
    }
  }

  /// @brief Lock count of tier `t` on `node`. @throw strata::invalid_argument for a stale node
  [[nodiscard]] std::int64_t locks(node_ref node, tier t) const
  {
    check(node);
    return nodes_[node.index].locks[std::size_t(t)];
  }

  // --- copies ----------------------------------------------------------------------------------------

  /// @brief Pages on the path root -> `node` not on (or on their way to) the device.
  [[nodiscard]] std::int64_t pages_to_load(node_ref node) const
  {
    check(node);
    std::int64_t need = 0;
    for (auto i : path_of(node.index)) {
      need += loadable(i) ? nodes_[i].pages() : 0;
    }
    return need;
  }

  /**
   * @brief Loads the path root -> `node` onto the device: a copy, from the fastest lower tier holding
   *        it, for every node of the path that is not on the device or on its way there.
   * @param device_pages free device pages, `pages_to_load(node)` of them, in path order
   * @throw strata::invalid_argument for a stale node, the wrong number of pages, or ids out of
   *        range, repeated or owned
   */
  [[nodiscard]] std::vector<copy_order> load(node_ref node, std::span<std::int64_t const> device_pages)
  {
    std::int64_t const need = pages_to_load(node);
    STRATA_EXPECTS(static_cast<std::int64_t>(device_pages.size()) == need, "hiradix_tree::load: ", need,
                   " pages to load, got ", device_pages.size(), " device pages");
    check_new_device_pages(device_pages, "load");
    std::vector<copy_order> out;
    std::size_t at = 0;
    for (auto i : path_of(node.index)) {
      if (!loadable(i)) { continue; }
      std::size_t from = 1;
      while (!nodes_[i].resident[from]) {
        ++from;
      }
      auto const pages = device_pages.subspan(at, std::size_t(nodes_[i].pages()));
      at += pages.size();
      set_pages(i, tier::device, pages);
      out.push_back(order(i, tier(from), tier::device, false));
    }
    return out;
  }

  /**
   * @brief Pages the tree evicted on its own to make room (for a backup or a demotion into a full
   *        tier), as (tier, page ids or remote keys) lists; emptied. Their demotions are in
   *        `take_copies`.
   */
  [[nodiscard]] std::vector<std::pair<tier, std::vector<std::int64_t>>> take_internal_evictions()
  {
    auto out = std::move(internal_);
    internal_.clear();
    return out;
  }

  /// @brief Backups and demotions queued by the write policy and by internal evictions; emptied.
  [[nodiscard]] std::vector<copy_order> take_copies()
  {
    std::vector<copy_order> out = std::move(queued_);
    queued_.clear();
    return out;
  }

  /**
   * @brief A copy has landed: its destination becomes resident; for a demotion the source pages are
   *        freed, and returned when they are device pages (for the engine to reuse). A source that
   *        another pending transfer still reads (a load from the tier being left) stays pinned until
   *        that transfer completes or is cancelled, which then frees it; a source locked in its tier
   *        meanwhile stays (the demotion became a backup).
   * @return device pages freed now: the caller must return them to its pool
   * @throw strata::invalid_argument for an unknown or finished transfer
   */
  [[nodiscard]] std::vector<std::int64_t> complete(transfer_id id)
  {
    auto const it = transfers_.find(id);
    STRATA_EXPECTS(it != transfers_.end(), "hiradix_tree::complete: unknown transfer ", id);
    pending const t = it->second;
    transfers_.erase(it);
    unpin(t);
    std::vector<std::int64_t> freed;
    for (auto i : t.nodes) {
      make_resident(i, t.to);
      // Another pending transfer may still read the source (a load from the tier being left):
      // the pages stay, pinned, and are dropped when the last such transfer ends.
      // A node locked in the source tier meanwhile (a request reads those pages) keeps its copy
      // there: the demotion turns into a backup.
      if (t.demotion && nodes_[i].locks[std::size_t(t.from)] == 0) {
        nodes_[i].drop_pending[std::size_t(t.from)] = true;
      }
    }
    apply_pending_drops(t, freed);
    if (t.to == tier::host && config_.file_policy == write_policy::write_through) {
      for (auto i : t.nodes) {
        if (nodes_[i].alive) { file_backup(i); }
      }
    }
    return freed;
  }

  /**
   * @brief A copy failed or was abandoned: its destination pages are released (device destination
   *        pages are the caller's again), nothing else changes — except that a demotion which
   *        completed while this copy still read its source frees that source now.
   * @return device pages freed by such a deferred demotion (for the engine to reuse)
   * @throw strata::invalid_argument for an unknown or finished transfer
   */
  [[nodiscard]] std::vector<std::int64_t> cancel(transfer_id id)
  {
    auto const it = transfers_.find(id);
    STRATA_EXPECTS(it != transfers_.end(), "hiradix_tree::cancel: unknown transfer ", id);
    pending const t = it->second;
    transfers_.erase(it);
    unpin(t);
    for (auto i : t.nodes) {
      (void)release_pages(i, t.to);
      refresh(i);
    }
    std::vector<std::int64_t> freed;
    apply_pending_drops(t, freed);
    remove_empty(t.nodes);
    return freed;
  }

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
   * A node whose only copy finds no room below is dropped if it is an unlocked leaf of the whole
   * tree, and otherwise stays.
   * @throw strata::invalid_argument for a negative page count, or a tier the tree does not have
   */
  [[nodiscard]] eviction_result evict(tier t, std::int64_t pages) { return evict_up_to(t, pages, ~std::uint64_t{0}); }

 private:
  /// `evict`, taking only nodes last used no later than `newest`: making room for a demotion (or a
  /// backup) never pushes out what was used more recently than the node moving in.
  eviction_result evict_up_to(tier t, std::int64_t pages, std::uint64_t newest)
  {
    STRATA_EXPECTS(pages >= 0, "hiradix_tree::evict: pages must not be negative, got ", pages);
    STRATA_EXPECTS(has_tier(t), "hiradix_tree::evict: no ", to_string(t), " tier");
    eviction_result r;
    auto& candidates = lru_[std::size_t(t)];
    std::vector<std::uint32_t> skipped;
    while (r.pages < pages && !candidates.empty() && candidates.begin()->first <= newest) {
      std::uint32_t const i = candidates.begin()->second;
      std::int64_t const count = nodes_[i].pages();
      if (auto const below = demotion_target(i, t)) {
        auto to = allocate(*below, count, i);
        tier into = *below;
        // A node stuck on the device (its only copy, nodes below it) that finds no room on the
        // host goes further down rather than stay.
        for (std::size_t u = std::size_t(into) + 1; !to && stuck_on_device(i, t) && u < tier_count; ++u) {
          if (has_tier(tier(u))) { to = allocate(into = tier(u), count, i); }
        }
        if (to) {
          set_pages(i, into, *to);
          r.demotions.push_back(order(i, t, into, true));
          r.pages += count;
          stats_.evicted_pages[std::size_t(t)] += count;
          continue;
        }
      }
      // Making room below may have changed the set (dropped nodes refresh their parents): `i` is
      // acted on only while it is still a candidate, and taken out of the set by itself, not by
      // position.
      if (!nodes_[i].candidate[std::size_t(t)]) { continue; }
      bool const unlocked = nodes_[i].locks[0] + nodes_[i].locks[1] + nodes_[i].locks[2] + nodes_[i].locks[3] == 0;
      if (!copies_elsewhere(i, t) && (!nodes_[i].children.empty() || !unlocked)) {  // no room below for the only copy
        set_candidate(i, t, false);
        skipped.push_back(i);
        continue;
      }
      auto freed = drop(i, t, true);
      r.pages += count;
      stats_.evicted_pages[std::size_t(t)] += count;
      r.freed.insert(r.freed.end(), freed.begin(), freed.end());
    }
    for (auto i : skipped) {
      if (nodes_[i].alive) { refresh(i); }
    }
    return r;
  }

 public:
  /**
   * @brief Pages eviction from tier `t` could free, leaf after leaf: the tier's resident pages but
   *        those of locked nodes and of nodes with a pending transfer (a little more than it can
   *        free while a pinned node blocks its unlocked ancestors, until the copy lands).
   */
  [[nodiscard]] std::int64_t reclaimable_pages(tier t) const noexcept
  { return stats_.resident_pages[std::size_t(t)] - held_[std::size_t(t)]; }

  /// @brief Pages evictable from tier `t` right now (tier-leaves only).
  [[nodiscard]] std::int64_t evictable_pages(tier t) const
  {
    std::int64_t n = 0;
    for (auto const& [key, i] : lru_[std::size_t(t)]) {
      n += nodes_[i].pages();
    }
    return n;
  }

  // --- state -----------------------------------------------------------------------------------------

  /// @brief Counters and residency.
  [[nodiscard]] hiradix_stats stats() const
  {
    hiradix_stats s = stats_;
    for (std::size_t t = 0; t < tier_count; ++t) {
      s.resident_bytes[t] = s.resident_pages[t] * config_.page_bytes;
    }
    return s;
  }
  /// @brief Nodes alive, the root included.
  [[nodiscard]] std::size_t node_count() const noexcept { return nodes_.size() - free_nodes_.size(); }
  /// @brief Whether `node` is resident in tier `t`. @throw strata::invalid_argument for a stale node
  [[nodiscard]] bool resident(node_ref node, tier t) const
  {
    check(node);
    return nodes_[node.index].resident[std::size_t(t)];
  }
  /// @brief Free slots of the host or file tier (0 for the others).
  [[nodiscard]] std::int64_t free_slots(tier t) const
  {
    auto const& s = slots_[std::size_t(t)];
    return s ? s->available() : 0;
  }
  /// @brief Bytes of index memory: nodes, tokens, hashes, page tables, child maps, owner tables.
  [[nodiscard]] std::size_t memory_bytes() const
  {
    std::size_t b = nodes_.capacity() * sizeof(node_data) + free_nodes_.capacity() * sizeof(std::uint32_t);
    for (auto const& n : nodes_) {
      b += n.tokens.capacity() * sizeof(std::int32_t) + n.hashes.capacity() * sizeof(std::uint64_t);
      for (auto const& v : n.tier_pages) {
        b += v.capacity() * sizeof(std::int32_t);
      }
      b += n.children.bucket_count() * sizeof(void*) + n.children.size() * 32;  // libstdc++ node: ~32 B
    }
    for (auto const& o : owner_) {
      b += o.capacity() * sizeof(std::uint32_t);
    }
    return b + page_marks_.capacity() * sizeof(std::uint64_t);
  }

  /**
   * @brief Checks every internal invariant; throws `strata::error` naming the first one broken.
   *
   * For tests: lock counts are non-negative and never larger below than above (a lock holds a whole
   * path); resident page counts equal a recount; no page id is owned twice in a tier and the owner
   * tables agree; transient nodes are leaves of a live request; every permanent node is cached or on
   * its way; resident-children counts are exact; the eviction candidates are exactly the evictable
   * nodes, keyed by their last use.
   */
  void check_invariants() const
  {
    std::array<std::int64_t, tier_count> resident{};
    std::array<std::vector<std::uint32_t>, 3> seen;
    for (std::size_t t = 0; t < 3; ++t) {
      seen[t].assign(owner_[t].size(), 0);
    }
    auto fail = [](std::uint32_t i, auto const&... what) {
      throw error(detail::concat("hiradix_tree invariant, node ", i, ": ", what...));
    };
    for (std::uint32_t i = 1; i < nodes_.size(); ++i) {
      node_data const& n = nodes_[i];
      if (!n.alive) { continue; }
      if (n.pages() <= 0 || std::int64_t(n.tokens.size()) != n.pages() * config_.page_tokens) { fail(i, "page count"); }
      if (!nodes_[n.parent].alive) { fail(i, "dead parent"); }
      std::array<std::int32_t, tier_count> children_resident{};
      for (auto const& [key, first] : n.children) {
        for (std::uint32_t c = first; c != npos; c = nodes_[c].next_same_key) {
          if (nodes_[c].parent != i || !nodes_[c].alive) { fail(i, "child link"); }
          for (std::size_t t = 0; t < tier_count; ++t) {
            children_resident[t] += nodes_[c].resident[t] ? 1 : 0;
          }
        }
      }
      for (std::size_t t = 0; t < tier_count; ++t) {
        if (n.locks[t] < 0 || n.pins[t] < 0) { fail(i, "negative lock or pin count"); }
        if (n.parent != 0 && nodes_[n.parent].locks[t] < n.locks[t]) { fail(i, "parent holds fewer locks"); }
        if (children_resident[t] != n.children_resident[t]) { fail(i, "resident-children count, tier ", t); }
        if (n.resident[t]) { resident[t] += n.pages(); }
        if (t < 3) {
          if (!n.tier_pages[t].empty() && std::int64_t(n.tier_pages[t].size()) != n.pages()) {
            fail(i, "page table size");
          }
          if (n.resident[t] && n.tier_pages[t].empty()) { fail(i, "resident in tier ", t, " without pages"); }
          if (!n.resident[t] && !n.tier_pages[t].empty() && n.pins[t] == 0) { fail(i, "stray pages in tier ", t); }
          for (auto pg : n.tier_pages[t]) {
            if (pg < 0 || std::size_t(pg) >= seen[t].size()) { fail(i, "page id out of range"); }
            if (seen[t][std::size_t(pg)]++ != 0) { fail(i, "page ", pg, " of tier ", t, " owned twice"); }
            if (owner_[t][std::size_t(pg)] != i + 1) { fail(i, "owner table disagrees for page ", pg); }
          }
        }
        bool const should = evictable(i, tier(t));
        if (should != n.candidate[t]) { fail(i, "eviction candidacy in tier ", t); }
        if (should && lru_[t].count({n.lru_key[t], i}) != 1) { fail(i, "missing from the LRU set of tier ", t); }
      }
      if (n.state != transient_state::none) {
        if (!n.children.empty() || cached(n)) { fail(i, "transient node with children or residency"); }
        auto const it = transient_.find(n.owner);
        if (it == transient_.end() || it->second != i) { fail(i, "transient node without its request"); }
      } else if (!cached(n) && !has_pins(n)) {
        fail(i, "permanent node cached nowhere");
      }
    }
    // A pending transfer reads pages its source tier still holds, and writes pages its
    // destination tier holds for it: neither may be free (or handed to another node) meanwhile.
    for (auto const& [id, p] : transfers_) {
      for (auto i : p.nodes) {
        node_data const& n = nodes_[i];
        if (!n.alive) { fail(i, "transfer ", id, " on a removed node"); }
        if (!n.resident[std::size_t(p.from)]) {
          fail(i, "transfer ", id, " reads the ", to_string(p.from), " tier, where the node is not resident");
        }
        for (tier t : {p.from, p.to}) {
          if (t != tier::remote && std::int64_t(n.tier_pages[std::size_t(t)].size()) != n.pages()) {
            fail(i, "transfer ", id, " uses ", to_string(t), " pages the node no longer holds");
          }
        }
      }
    }
    std::array<std::int64_t, tier_count> held{};
    for (std::uint32_t i = 1; i < nodes_.size(); ++i) {
      for (std::size_t t = 0; t < tier_count; ++t) {
        held[t] += held_in(nodes_[i], t) ? nodes_[i].pages() : 0;
      }
    }
    if (held != held_) { throw error("hiradix_tree invariant: held (locked or pinned) page counts are stale"); }
    for (std::size_t t = 0; t < tier_count; ++t) {
      if (resident[t] != stats_.resident_pages[t]) {
        throw error(detail::concat("hiradix_tree invariant: tier ", t, " resident pages recount ", resident[t],
                                   " != ", stats_.resident_pages[t]));
      }
      std::size_t members = 0;
      for (auto const& n : nodes_) {
        members += n.alive && n.candidate[t] ? 1 : 0;
      }
      if (members != lru_[t].size()) { throw error(detail::concat("hiradix_tree invariant: LRU set size, tier ", t)); }
    }
    for (std::size_t t = 0; t < 3; ++t) {
      for (std::size_t pg = 0; pg < owner_[t].size(); ++pg) {
        if (owner_[t][pg] != 0 && seen[t][pg] == 0) {
          throw error(detail::concat("hiradix_tree invariant: tier ", t, " page ", pg, " owned by a node without it"));
        }
      }
      if (slots_[t] && slots_[t]->used() != std::int64_t(std::count_if(owner_[t].begin(), owner_[t].end(),
                                                                       [](std::uint32_t o) { return o != 0; }))) {
        throw error(detail::concat("hiradix_tree invariant: tier ", t, " slot allocator disagrees with the owners"));
      }
    }
  }

 private:
  static constexpr std::uint32_t npos = 0xffffffffu;

  struct node_data {
    std::uint32_t parent{};
    std::uint32_t generation{};
    std::uint32_t next_same_key{npos};  // next sibling whose first page hashes alike
    bool alive{};
    transient_state state{};
    request_id owner{};
    std::vector<std::int32_t> tokens;                     // pages() * page_tokens
    std::vector<std::uint64_t> hashes;                    // chained content hash per page
    std::array<std::vector<std::int32_t>, 3> tier_pages;  // device, host, file page ids
    std::array<bool, tier_count> resident{};
    std::array<bool, tier_count> candidate{};
    std::array<std::uint64_t, tier_count> lru_key{};
    std::array<std::int32_t, tier_count> locks{};
    std::array<std::int32_t, tier_count> pins{};  // pending transfers from or to the tier
    std::array<bool, tier_count> drop_pending{};  // demoted out of the tier: dropped once unpinned there
    std::array<std::int32_t, tier_count> children_resident{};
    std::uint64_t last_use{};
    std::int64_t hits{};
    std::unordered_map<std::uint64_t, std::uint32_t> children;  // first-page hash -> a child

    [[nodiscard]] std::int64_t pages() const noexcept { return static_cast<std::int64_t>(hashes.size()); }
  };

  struct pending {
    std::vector<std::uint32_t> nodes;  // the ordered node, and the upper halves it was split into
    tier from, to;
    bool demotion;
  };

  // -- hashing and lookup --
  static std::uint64_t mix(std::uint64_t h) noexcept
  {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
  }
  [[nodiscard]] std::uint64_t page_hash(std::int32_t const* page, std::uint64_t seed) const noexcept
  {
    std::uint64_t h = mix(seed + 0x9e3779b97f4a7c15ull);
    std::int64_t i = 0;
    for (; i + 2 <= config_.page_tokens; i += 2) {
      std::uint64_t w;
      std::memcpy(&w, page + i, sizeof w);
      h = (h ^ w) * 0x100000001b3ull + (h >> 29);
    }
    if (i < config_.page_tokens) { h = (h ^ static_cast<std::uint32_t>(page[i])) * 0x100000001b3ull; }
    return mix(h);
  }
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
                                         std::int64_t p) const
  {
    auto const& children = nodes_[parent].children;
    if (children.empty()) { return npos; }
    auto const it = children.find(page_hash(page_at(tokens, p), 0));
    if (it == children.end()) { return npos; }
    for (std::uint32_t c = it->second; c != npos; c = nodes_[c].next_same_key) {
      if (same_pages(nodes_[c].tokens.data(), page_at(tokens, p), 1)) { return c; }
    }
    return npos;
  }
  /// Pages of `c`'s edge equal to tokens' pages from `p` (at least 1: `find_child` matched the first).
  [[nodiscard]] std::int64_t common_pages(node_data const& c, std::span<std::int32_t const> tokens, std::int64_t p,
                                          std::int64_t pages) const noexcept
  {
    std::int64_t const most = std::min(c.pages(), pages - p);
    if (same_pages(c.tokens.data(), page_at(tokens, p), most)) { return most; }
    std::int64_t lo = 1, hi = most;  // page lo-1 matches, some page before hi does not
    std::size_t const pt = static_cast<std::size_t>(config_.page_tokens);
    while (hi - lo > 1) {
      std::int64_t const mid = (lo + hi) / 2;
      if (same_pages(c.tokens.data() + std::size_t(lo) * pt, page_at(tokens, p + lo), mid - lo)) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    return same_pages(c.tokens.data() + std::size_t(lo) * pt, page_at(tokens, p + lo), 1) ? lo + 1 : lo;
  }

  // -- structure --
  [[nodiscard]] node_ref ref(std::uint32_t i) const noexcept { return {i, nodes_[i].generation}; }
  void check(node_ref r) const
  {
    STRATA_EXPECTS(r.index < nodes_.size() && nodes_[r.index].alive && nodes_[r.index].generation == r.generation,
                   "hiradix_tree: node ", r.index, " (generation ", r.generation, ") does not exist");
  }
  [[nodiscard]] std::vector<std::uint32_t> path_of(std::uint32_t i) const
  {
    std::vector<std::uint32_t> path;
    for (; i != 0; i = nodes_[i].parent) {
      path.push_back(i);
    }
    std::reverse(path.begin(), path.end());
    return path;
  }
  static bool cached(node_data const& n) noexcept
  { return n.resident[0] || n.resident[1] || n.resident[2] || n.resident[3]; }
  /// The fastest tier holding a cached node (a load comes from there).
  static std::size_t fastest_tier(node_data const& n) noexcept
  {
    std::size_t t = 0;
    while (t + 1 < tier_count && !n.resident[t]) {
      ++t;
    }
    return t;
  }
  static bool has_pins(node_data const& n) noexcept { return n.pins[0] + n.pins[1] + n.pins[2] + n.pins[3] > 0; }
  [[nodiscard]] bool loadable(std::uint32_t i) const noexcept
  {
    node_data const& n = nodes_[i];
    return !n.resident[0] && n.pins[0] == 0 && cached(n);
  }
  std::uint32_t transient_node(request_id request, char const* what) const
  {
    auto const it = transient_.find(request);
    STRATA_EXPECTS(it != transient_.end(), "hiradix_tree::", what, ": request ", request.value,
                   " has no transient pages");
    return it->second;
  }
  /// Rejects device ids out of range, repeated, or owned by the tree; `held[p]`, when given, is the
  /// id the tree holds at position p of the inserted path, which the caller may pass there.
  /// Range, duplicates, and pages the tree owns: allowed only for `insert`, at the position of the
  /// prompt's cached path (`insert_tokens`) where the tree holds that very page.
  void check_new_device_pages(std::span<std::int64_t const> pages, char const* what,
                              std::span<std::int32_t const> const* insert_tokens = nullptr)
  {
    // Duplicates: one bit per device page, set while checking and cleared on the way out (also when
    // a check throws), so the check is linear in the pages given, not in the pool.
    if (page_marks_.empty()) { page_marks_.assign(std::size_t((config_.capacity[0] + 63) / 64), 0); }
    struct clear_marks {
      std::vector<std::uint64_t>& marks;
      std::span<std::int64_t const> pages;
      std::size_t set = 0;
      ~clear_marks()
      {
        for (std::size_t k = 0; k < set; ++k) {
          marks[std::size_t(pages[k]) >> 6] = 0;
        }
      }
    } guard{page_marks_, pages};
    for (std::size_t k = 0; k < pages.size(); ++k) {
      auto const pg = pages[k];
      STRATA_EXPECTS(pg >= 0 && pg < config_.capacity[0], "hiradix_tree::", what, ": device page ", pg,
                     " out of range [0, ", config_.capacity[0], ")");
      std::uint64_t& word = page_marks_[std::size_t(pg) >> 6];
      std::uint64_t const bit = std::uint64_t{1} << (pg & 63);
      STRATA_EXPECTS((word & bit) == 0, "hiradix_tree::", what, ": device page ", pg, " given twice");
      word |= bit;
      guard.set = k + 1;
    }
    std::vector<std::int64_t> held;  // walked only when a page is owned: the common case has none
    for (std::size_t p = 0; p < pages.size(); ++p) {
      if (owner_[0][std::size_t(pages[p])] == 0) { continue; }
      if (held.empty() && insert_tokens != nullptr) {
        held = held_device_pages(*insert_tokens, std::int64_t(pages.size()));
      }
      bool const own_position = p < held.size() && held[p] == pages[p];
      STRATA_EXPECTS(own_position, "hiradix_tree::", what, ": device page ", pages[p], " is already owned by the tree");
    }
  }
  /// The device page the tree holds (or is loading) at each position of `tokens`' cached path; -1
  /// past it or where there is none. Read-only.
  [[nodiscard]] std::vector<std::int64_t> held_device_pages(std::span<std::int32_t const> tokens,
                                                            std::int64_t pages) const
  {
    std::vector<std::int64_t> held(static_cast<std::size_t>(pages), -1);
    std::uint32_t cur = 0;
    std::int64_t p = 0;
    while (p < pages) {
      std::uint32_t const child = find_child(cur, tokens, p);
      if (child == npos || nodes_[child].state != transient_state::none || !cached(nodes_[child])) { break; }
      node_data const& c = nodes_[child];
      std::int64_t const k = common_pages(c, tokens, p, pages);
      if (!c.tier_pages[0].empty()) {
        for (std::int64_t j = 0; j < k; ++j) {
          held[std::size_t(p + j)] = c.tier_pages[0][std::size_t(j)];
        }
      }
      if (k < c.pages()) { break; }
      cur = child;
      p += k;
    }
    return held;
  }

  std::uint32_t new_node()
  {
    std::uint32_t i;
    if (!free_nodes_.empty()) {
      i = free_nodes_.back();
      free_nodes_.pop_back();
      std::uint32_t const g = nodes_[i].generation + 1;
      nodes_[i] = node_data{};
      nodes_[i].generation = g;
    } else {
      nodes_.emplace_back();
      i = static_cast<std::uint32_t>(nodes_.size() - 1);
    }
    nodes_[i].alive = true;
    nodes_[i].last_use = clock_;
    return i;
  }
  void link_child(std::uint32_t parent, std::uint32_t child)
  {
    std::uint64_t const key = page_hash(nodes_[child].tokens.data(), 0);
    auto [it, inserted] = nodes_[parent].children.try_emplace(key, child);
    if (!inserted) {
      nodes_[child].next_same_key = it->second;
      it->second = child;
    }
    nodes_[child].parent = parent;
    for (std::size_t t = 0; t < tier_count; ++t) {
      nodes_[parent].children_resident[t] += nodes_[child].resident[t];
    }
    refresh(parent);
  }
  void unlink_child(std::uint32_t parent, std::uint32_t child)
  {
    auto& children = nodes_[parent].children;
    auto const it = children.find(page_hash(nodes_[child].tokens.data(), 0));
    if (it->second == child) {
      if (nodes_[child].next_same_key == npos) {
        children.erase(it);
      } else {
        it->second = nodes_[child].next_same_key;
      }
    } else {
      std::uint32_t c = it->second;
      while (nodes_[c].next_same_key != child) {
        c = nodes_[c].next_same_key;
      }
      nodes_[c].next_same_key = nodes_[child].next_same_key;
    }
    nodes_[child].next_same_key = npos;
    for (std::size_t t = 0; t < tier_count; ++t) {
      nodes_[parent].children_resident[t] -= nodes_[child].resident[t];
    }
    refresh(parent);
  }
  std::uint32_t add_node(std::uint32_t parent, std::span<std::int32_t const> tokens, std::int64_t p, std::int64_t end,
                         transient_state state, request_id owner)
  {
    std::uint32_t const i = new_node();
    node_data& n = nodes_[i];
    n.tokens.assign(page_at(tokens, p), page_at(tokens, end));
    n.hashes.resize(std::size_t(end - p));
    std::uint64_t h = parent == 0 ? 0 : nodes_[parent].hashes.back();
    for (std::int64_t k = 0; k < end - p; ++k) {
      h = page_hash(page_at(tokens, p + k), h);
      n.hashes[std::size_t(k)] = h;
    }
    n.state = state;
    n.owner = owner;
    link_child(parent, i);
    refresh(i);
    return i;
  }
  /// Splits node `i` (no pending transfer) after its first `k` pages; returns the node of those `k`.
  std::uint32_t split(std::uint32_t i, std::int64_t k)
  {
    std::uint32_t const top = new_node();
    std::uint32_t const parent = nodes_[i].parent;
    unaccount(i);
    for (std::size_t t = 0; t < tier_count; ++t) {
      set_candidate(i, tier(t), false);
    }
    unlink_child(parent, i);
    node_data& n = nodes_[i];
    node_data& t = nodes_[top];
    std::size_t const kk = static_cast<std::size_t>(k);
    std::size_t const pt = static_cast<std::size_t>(config_.page_tokens);
    t.tokens.assign(n.tokens.begin(), n.tokens.begin() + std::ptrdiff_t(kk * pt));
    n.tokens.erase(n.tokens.begin(), n.tokens.begin() + std::ptrdiff_t(kk * pt));
    t.hashes.assign(n.hashes.begin(), n.hashes.begin() + std::ptrdiff_t(kk));
    n.hashes.erase(n.hashes.begin(), n.hashes.begin() + std::ptrdiff_t(kk));
    for (std::size_t tr = 0; tr < 3; ++tr) {
      if (n.tier_pages[tr].empty()) { continue; }
      t.tier_pages[tr].assign(n.tier_pages[tr].begin(), n.tier_pages[tr].begin() + std::ptrdiff_t(kk));
      n.tier_pages[tr].erase(n.tier_pages[tr].begin(), n.tier_pages[tr].begin() + std::ptrdiff_t(kk));
      for (auto pg : t.tier_pages[tr]) {
        owner_[tr][std::size_t(pg)] = top + 1;
      }
    }
    t.resident = n.resident;
    t.locks = n.locks;
    t.last_use = n.last_use;
    t.hits = n.hits;
    t.pins = n.pins;
    t.drop_pending = n.drop_pending;
    link_child(parent, top);
    link_child(top, i);
    for (auto& [id, p] : transfers_) {  // a pending transfer of `i` covers both halves
      if (std::find(p.nodes.begin(), p.nodes.end(), i) != p.nodes.end()) { p.nodes.push_back(top); }
    }
    account(top);
    account(i);
    refresh(top);
    refresh(i);
    return top;
  }
  void remove_node(std::uint32_t i)
  {
    unaccount(i);
    for (std::size_t t = 0; t < tier_count; ++t) {
      set_candidate(i, tier(t), false);
    }
    std::uint32_t const parent = nodes_[i].parent;
    unlink_child(parent, i);
    node_data& n = nodes_[i];
    for (std::size_t t = 0; t < 3; ++t) {
      for (auto pg : n.tier_pages[t]) {
        owner_[t][std::size_t(pg)] = 0;
      }
    }
    n.alive = false;
    n.tokens = {};
    n.hashes = {};
    n.children = {};
    n.tier_pages = {};
    free_nodes_.push_back(i);
    refresh(parent);
  }

  // -- residency --
  void set_pages(std::uint32_t i, tier t, std::span<std::int64_t const> pages)
  {
    if (t == tier::remote) { return; }
    auto& v = nodes_[i].tier_pages[std::size_t(t)];
    v.assign(pages.begin(), pages.end());
    for (auto pg : v) {
      owner_[std::size_t(t)][std::size_t(pg)] = i + 1;
    }
  }
  void make_resident(std::uint32_t i, tier t)
  {
    node_data& n = nodes_[i];
    if (n.resident[std::size_t(t)]) { return; }
    unaccount(i);
    n.resident[std::size_t(t)] = true;
    account(i);
    stats_.resident_pages[std::size_t(t)] += n.pages();
    ++nodes_[n.parent].children_resident[std::size_t(t)];
    refresh(i);
    refresh(n.parent);
  }
  /// Gives back the pages of tier `t` (host and file slots to their allocator); returns their ids.
  std::vector<std::int64_t> release_pages(std::uint32_t i, tier t)
  {
    std::vector<std::int64_t> ids;
    if (t == tier::remote) {
      remote_used_ -= nodes_[i].pages();
      for (std::int64_t k = 0; k < nodes_[i].pages(); ++k) {
        ids.push_back(remote_key(nodes_[i], k));
      }
      return ids;
    }
    auto& v = nodes_[i].tier_pages[std::size_t(t)];
    ids.assign(v.begin(), v.end());
    for (auto pg : v) {
      owner_[std::size_t(t)][std::size_t(pg)] = 0;
    }
    if (slots_[std::size_t(t)]) { slots_[std::size_t(t)]->release(ids); }
    v.clear();
    return ids;
  }
  /// Removes the copy in tier `t` (and the node, once it is cached nowhere, if asked). Returns the
  /// page ids.
  std::vector<std::int64_t> drop(std::uint32_t i, tier t, bool remove_if_empty)
  {
    node_data& n = nodes_[i];
    unaccount(i);
    n.resident[std::size_t(t)] = false;
    account(i);
    stats_.resident_pages[std::size_t(t)] -= n.pages();
    --nodes_[n.parent].children_resident[std::size_t(t)];
    auto ids = release_pages(i, t);
    refresh(i);
    refresh(n.parent);
    if (remove_if_empty) { remove_empty({i}); }
    return ids;
  }
  /// Removes those of `nodes` (and then their emptied ancestors) that are cached nowhere, have no
  /// pending transfer, no children and are not transient.
  void remove_empty(std::vector<std::uint32_t> nodes)
  {
    for (bool changed = true; changed;) {
      changed = false;
      for (auto& i : nodes) {
        if (i == 0 || !nodes_[i].alive) { continue; }
        node_data const& n = nodes_[i];
        if (n.state == transient_state::none && !cached(n) && !has_pins(n) && n.children.empty()) {
          std::uint32_t const parent = n.parent;
          remove_node(i);
          i = parent;
          changed = true;
        }
      }
    }
  }
  [[nodiscard]] bool copies_elsewhere(std::uint32_t i, tier t) const noexcept
  {
    for (std::size_t u = 0; u < tier_count; ++u) {
      if (u != std::size_t(t) && nodes_[i].resident[u]) { return true; }
    }
    return false;
  }
  /// A node whose only copy is on the device while nodes hang below it (a backup that found no
  /// room, or a selective one not yet due): it may not be dropped, so it is demoted under any write
  /// policy — keeping it would pin its device pages for good. (A leaf is dropped.)
  [[nodiscard]] bool stuck_on_device(std::uint32_t i, tier t) const noexcept
  {
    node_data const& n = nodes_[i];
    return t == tier::device && !n.resident[1] && !n.resident[2] && !n.resident[3] && !n.children.empty();
  }
  /// Where a node leaving tier `t` goes (nothing: it is dropped).
  [[nodiscard]] std::optional<tier> demotion_target(std::uint32_t i, tier t) const noexcept
  {
    node_data const& n = nodes_[i];
    if (t == tier::device) {
      if (config_.policy == write_policy::write_back && has_tier(tier::host) && !n.resident[1]) { return tier::host; }
      if (stuck_on_device(i, t)) {  // the first tier below that exists
        for (std::size_t u = 1; u < tier_count; ++u) {
          if (has_tier(tier(u))) { return tier(u); }
        }
      }
      return std::nullopt;
    }
    for (std::size_t u = std::size_t(t) + 1; u < tier_count; ++u) {
      if (!has_tier(tier(u))) { continue; }
      if (n.resident[u]) { return std::nullopt; }  // a copy is already there
      return tier(u);
    }
    return std::nullopt;
  }
  /// Pages for `count` pages of node `owner` in tier `t` (host and file: slots, evicting to make
  /// room; remote: capacity). Nothing when there is no room.
  std::optional<std::vector<std::int64_t>> allocate(tier t, std::int64_t count, std::uint32_t owner)
  {
    if (t == tier::remote) {
      if (remote_used_ + count > config_.capacity[3]) { return std::nullopt; }
      remote_used_ += count;
      std::vector<std::int64_t> keys;
      for (std::int64_t k = 0; k < count; ++k) {
        keys.push_back(remote_key(nodes_[owner], k));
      }
      return keys;
    }
    auto& slots = *slots_[std::size_t(t)];
    if (slots.available() < count) {
      eviction_result r = evict_up_to(t, count - slots.available(), nodes_[owner].last_use);
      for (auto& d : r.demotions) {
        queued_.push_back(std::move(d));
      }
      if (!r.freed.empty()) { internal_.emplace_back(t, std::move(r.freed)); }
    }
    if (slots.available() < count) { return std::nullopt; }
    return slots.allocate(count);
  }
  /// Queues a copy of node `i` from `from` to `to` (whose pages are already set) and pins both.
  copy_order order(std::uint32_t i, tier from, tier to, bool demotion)
  {
    transfer_id const id = ++next_transfer_;
    transfers_.emplace(id, pending{{i}, from, to, demotion});
    node_data& n = nodes_[i];
    unaccount(i);
    ++n.pins[std::size_t(from)];
    ++n.pins[std::size_t(to)];
    account(i);
    refresh(i);
    copy_order o;
    o.id = id;
    o.node = ref(i);
    o.from = from;
    o.to = to;
    o.demotion = demotion;
    auto ids = [&](tier t) {
      std::vector<std::int64_t> v;
      for (std::int64_t k = 0; k < n.pages(); ++k) {
        v.push_back(t == tier::remote ? remote_key(n, k) : n.tier_pages[std::size_t(t)][std::size_t(k)]);
      }
      return v;
    };
    o.from_pages = ids(from);
    o.to_pages = ids(to);
    o.keys = n.hashes;
    o.parent_key = n.parent == 0 ? 0 : nodes_[n.parent].hashes.back();
    if (from >= tier::file || to >= tier::file) {  // record stores keep what a restart rebuilds the index from
      o.ids = n.tokens;
      o.ids_per_page = config_.page_tokens;
    }
    return o;
  }
  void unpin(pending const& t)
  {
    for (auto i : t.nodes) {
      unaccount(i);
      --nodes_[i].pins[std::size_t(t.from)];
      --nodes_[i].pins[std::size_t(t.to)];
      account(i);
    }
  }
  /// Drops the copies that completed demotions left behind once nothing reads them any more: the
  /// nodes of `t` in the tier `t` read from. Device ids go to `freed`.
  void apply_pending_drops(pending const& t, std::vector<std::int64_t>& freed)
  {
    bool any = false;
    for (auto i : t.nodes) {
      std::size_t const u = std::size_t(t.from);
      if (!nodes_[i].alive || !nodes_[i].drop_pending[u] || nodes_[i].pins[u] != 0) { continue; }
      nodes_[i].drop_pending[u] = false;
      if (nodes_[i].locks[u] != 0) { continue; }  // locked since the demotion landed: it became a backup
      auto ids = drop(i, t.from, /*remove_if_empty=*/false);
      if (t.from == tier::device) { freed.insert(freed.end(), ids.begin(), ids.end()); }
      any = true;
    }
    if (any) { remove_empty(t.nodes); }
  }

  // -- match / probe bookkeeping: the same answer whether or not the walk has side effects --
  /// `k` pages of transient node `c` matched: the walk stops there.
  void note_transient(match_result& r, node_data const& c, std::int64_t k) const noexcept
  {
    r.transient_tokens = k * page_token_count();
    r.transient = c.state;
    r.transient_owner = c.owner;
    r.delay_hit = r.transient_tokens > 0 && r.transient_tokens >= config_.delay_hit_tokens;
  }
  /// `k` cached pages of node `c` matched; `device_run` tracks whether the prefix so far is all on the device.
  void note_cached(match_result& r, node_data const& c, std::int64_t k, bool& device_run) const noexcept
  {
    std::int64_t const t = k * page_token_count();
    for (std::size_t u = 0; u < tier_count; ++u) {
      r.tier_tokens[u] += c.resident[u] ? t : 0;
    }
    std::int64_t walked = 0;  // tokens before this node
    for (auto f : r.fastest_tokens) {
      walked += f;
    }
    if (r.upper_prefix_tokens == walked && (c.resident[0] || c.resident[1])) { r.upper_prefix_tokens += t; }
    device_run = device_run && c.resident[0];
    if (device_run) { r.device_prefix_tokens += t; }
    r.fastest_tokens[fastest_tier(c)] += t;
  }

  /// Queues a device -> host backup of node `i` if it is on the device only and nothing is pending.
  void backup(std::uint32_t i)
  {
    node_data const& n = nodes_[i];
    if (!has_tier(tier::host) || !n.resident[0] || n.resident[1] || n.pins[0] != 0 || n.pins[1] != 0) { return; }
    if (auto pages = allocate(tier::host, n.pages(), i)) {
      set_pages(i, tier::host, *pages);
      queued_.push_back(order(i, tier::device, tier::host, false));
    }
  }

  /// Queues a host -> file copy of node `i` (the file write policy) if it is on the host only and
  /// nothing is pending.
  void file_backup(std::uint32_t i)
  {
    node_data const& n = nodes_[i];
    if (!has_tier(tier::file) || !n.resident[1] || n.resident[2] || n.pins[1] != 0 || n.pins[2] != 0) { return; }
    if (auto pages = allocate(tier::file, n.pages(), i)) {
      set_pages(i, tier::file, *pages);
      queued_.push_back(order(i, tier::host, tier::file, false));
    }
  }

  // -- held pages: resident and locked or pinned, per tier (for reclaimable_pages) --
  [[nodiscard]] static bool held_in(node_data const& n, std::size_t t) noexcept
  { return n.alive && n.resident[t] && (n.locks[t] > 0 || has_pins(n)); }
  void unaccount(std::uint32_t i) noexcept
  {
    for (std::size_t t = 0; t < tier_count; ++t) {
      held_[t] -= held_in(nodes_[i], t) ? nodes_[i].pages() : 0;
    }
  }
  void account(std::uint32_t i) noexcept
  {
    for (std::size_t t = 0; t < tier_count; ++t) {
      held_[t] += held_in(nodes_[i], t) ? nodes_[i].pages() : 0;
    }
  }

  // -- eviction candidates: tier-leaves that are resident, unlocked, unpinned, permanent --
  [[nodiscard]] bool evictable(std::uint32_t i, tier t) const noexcept
  {
    node_data const& n = nodes_[i];
    std::size_t const u = std::size_t(t);
    if (i == 0 || !n.alive || n.state != transient_state::none || !n.resident[u] || n.locks[u] != 0 || has_pins(n) ||
        n.children_resident[u] != 0) {
      return false;
    }
    bool const unlocked = n.locks[0] + n.locks[1] + n.locks[2] + n.locks[3] == 0;
    return copies_elsewhere(i, t) || demotion_target(i, t).has_value() || (n.children.empty() && unlocked);
  }
  void set_candidate(std::uint32_t i, tier t, bool on)
  {
    node_data& n = nodes_[i];
    std::size_t const u = std::size_t(t);
    if (n.candidate[u] && (!on || n.lru_key[u] != n.last_use)) {
      lru_[u].erase({n.lru_key[u], i});
      n.candidate[u] = false;
    }
    if (on && !n.candidate[u]) {
      n.lru_key[u] = n.last_use;
      lru_[u].insert({n.last_use, i});
      n.candidate[u] = true;
    }
  }
  void refresh(std::uint32_t i)
  {
    if (i == 0) { return; }
    for (std::size_t t = 0; t < tier_count; ++t) {
      set_candidate(i, tier(t), evictable(i, tier(t)));
    }
  }
  void touch(std::uint32_t i)
  {
    nodes_[i].last_use = clock_;
    refresh(i);
  }

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
  hiradix_stats stats_{};
  std::array<std::int64_t, tier_count> held_{};
};

}  // namespace strata
