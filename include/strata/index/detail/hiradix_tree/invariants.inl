// SPDX-License-Identifier: Apache-2.0
/**
 * @file index/detail/hiradix_tree/invariants.inl
 * @brief The invariant checker (for tests) and the index's memory footprint.
 *
 * Member definitions of `hiradix_tree` (index/hiradix_tree.hpp), which includes this file.
 */
#pragma once

namespace strata {

inline auto hiradix_tree::memory_bytes() const -> std::size_t
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

inline auto hiradix_tree::check_invariants() const -> void
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

}  // namespace strata
