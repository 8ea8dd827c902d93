// SPDX-License-Identifier: Apache-2.0
/**
 * @file index/detail/hiradix_tree/eviction.inl
 * @brief Eviction: the LRU candidates per tier, where a leaving node goes, and room made in a full
 *        tier.
 *
 * Member definitions of `hiradix_tree` (index/hiradix_tree.hpp), which includes this file.
 */
#pragma once

namespace strata {

inline auto hiradix_tree::evict_up_to(tier t, std::int64_t pages, std::uint64_t newest) -> eviction_result
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
      // Into a record tier only what is worth reading back, and what its backlog can take.
      tier into = *below;
      auto to = is_record_tier(into) && !admit_record(i, into) ? std::nullopt : allocate(into, count, i);
      // A node stuck on the device (its only copy, nodes below it) that finds no room on the
      // host goes further down rather than stay.
      for (std::size_t u = std::size_t(into) + 1; !to && stuck_on_device(i, t) && u < tier_count; ++u) {
        if (has_tier(tier(u)) && admit_record(i, tier(u))) { to = allocate(into = tier(u), count, i); }
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
      // Nodes below it that only record tiers hold go with it: once it leaves no prefix reaches them.
      if (unlocked && drop_with_record_subtree(i, t, r.freed)) {
        r.pages += count;
        stats_.evicted_pages[std::size_t(t)] += count;
        continue;
      }
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

inline auto hiradix_tree::drop_with_record_subtree(std::uint32_t i, tier t, std::vector<std::int64_t>& freed) -> bool
{
  std::vector<std::uint32_t> below;  // parents before children
  auto add_children = [&](std::uint32_t k) {
    for (auto const& [key, first] : nodes_[k].children) {
      for (std::uint32_t c = first; c != npos; c = nodes_[c].next_same_key) {
        below.push_back(c);
      }
    }
  };
  add_children(i);
  if (below.empty()) { return false; }
  for (std::size_t k = 0; k < below.size(); ++k) {
    node_data const& n = nodes_[below[k]];
    bool const locked = n.locks[0] + n.locks[1] + n.locks[2] + n.locks[3] > 0;
    if (n.state != transient_state::none || has_pins(n) || locked || n.resident[0] || n.resident[1]) { return false; }
    add_children(below[k]);
  }
  for (auto it = below.rbegin(); it != below.rend(); ++it) {  // children first
    for (std::size_t u = 0; u < tier_count; ++u) {
      if (nodes_[*it].resident[u]) {
        stats_.evicted_pages[u] += nodes_[*it].pages();
        internal_.emplace_back(tier(u), drop(*it, tier(u), false));  // record slots the tree freed itself
      }
    }
    remove_node(*it);
  }
  auto ids = drop(i, t, true);
  freed.insert(freed.end(), ids.begin(), ids.end());
  return true;
}

inline auto hiradix_tree::copies_elsewhere(std::uint32_t i, tier t) const noexcept -> bool
{
  for (std::size_t u = 0; u < tier_count; ++u) {
    if (u != std::size_t(t) && nodes_[i].resident[u]) { return true; }
  }
  return false;
}

inline auto hiradix_tree::stuck_on_device(std::uint32_t i, tier t) const noexcept -> bool
{
  node_data const& n = nodes_[i];
  return t == tier::device && !n.resident[1] && !n.resident[2] && !n.resident[3] && !n.children.empty();
}

inline auto hiradix_tree::demotion_target(std::uint32_t i, tier t) const noexcept -> std::optional<tier>
{
  node_data const& n = nodes_[i];
  if (t == tier::device) {
    if (config_.backup_policy == write_policy::write_back && has_tier(tier::host) && !n.resident[1]) {
      return tier::host;
    }
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

inline auto hiradix_tree::allocate(tier t, std::int64_t count, std::uint32_t owner)
    -> std::optional<std::vector<std::int64_t>>
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

inline auto hiradix_tree::unaccount(std::uint32_t i) noexcept -> void
{
  for (std::size_t t = 0; t < tier_count; ++t) {
    held_[t] -= held_in(nodes_[i], t) ? nodes_[i].pages() : 0;
  }
}

inline auto hiradix_tree::account(std::uint32_t i) noexcept -> void
{
  for (std::size_t t = 0; t < tier_count; ++t) {
    held_[t] += held_in(nodes_[i], t) ? nodes_[i].pages() : 0;
  }
}

inline auto hiradix_tree::evictable(std::uint32_t i, tier t) const noexcept -> bool
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

inline auto hiradix_tree::set_candidate(std::uint32_t i, tier t, bool on) -> void
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

inline auto hiradix_tree::refresh(std::uint32_t i) -> void
{
  if (i == 0) { return; }
  for (std::size_t t = 0; t < tier_count; ++t) {
    set_candidate(i, tier(t), evictable(i, tier(t)));
  }
}

inline auto hiradix_tree::touch(std::uint32_t i) -> void
{
  nodes_[i].last_use = clock_;
  refresh(i);
}

}  // namespace strata
