// SPDX-License-Identifier: Apache-2.0
/**
 * @file index/detail/hiradix_tree/structure.inl
 * @brief Nodes: allocation, child links, split, removal, and each tier's page ids and residency.
 *
 * Member definitions of `hiradix_tree` (index/hiradix_tree.hpp), which includes this file.
 */
#pragma once

namespace strata {

inline hiradix_tree::hiradix_tree(hiradix_config config, tier_slots slots) : config_{config}
{
  for (std::size_t t = 1; t < 3; ++t) {  // a tier's own allocator: its capacity is the tier's
    if (slots[t] == nullptr) { continue; }
    STRATA_EXPECTS(slots[t]->used() == 0, "hiradix_tree: the ", to_string(tier(t)), " tier's slot allocator has ",
                   slots[t]->used(), " slots in use: the tree must be their only user");
    config.capacity[t] = config_.capacity[t] = slots[t]->capacity();
  }
  STRATA_EXPECTS(config.page_tokens > 0, "hiradix_tree: page_tokens must be positive, got ", config.page_tokens);
  STRATA_EXPECTS(config.tokens_per_id > 0, "hiradix_tree: tokens_per_id must be positive, got ", config.tokens_per_id);
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

inline auto hiradix_tree::new_node() -> std::uint32_t
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
  changed(i);
  return i;
}

inline auto hiradix_tree::link_child(std::uint32_t parent, std::uint32_t child) -> void
{
  std::uint64_t const key = page_hash(nodes_[child].tokens.data(), 0);
  auto [it, inserted] = nodes_[parent].children.try_emplace(key, child);
  if (!inserted) {
    nodes_[child].next_same_key = it->second;
    it->second = child;
  }
  nodes_[child].parent = parent;
  changed(child);
  nodes_[parent].link_stamp = ++changes_;
  for (std::size_t t = 0; t < tier_count; ++t) {
    nodes_[parent].children_resident[t] += nodes_[child].resident[t];
  }
  refresh(parent);
}

inline auto hiradix_tree::unlink_child(std::uint32_t parent, std::uint32_t child) -> void
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
  changed(child);
  for (std::size_t t = 0; t < tier_count; ++t) {
    nodes_[parent].children_resident[t] -= nodes_[child].resident[t];
  }
  refresh(parent);
}

inline auto hiradix_tree::add_node(std::uint32_t parent, std::span<std::int32_t const> tokens, std::int64_t p,
                                   std::int64_t end, transient_state state, request_id owner) -> std::uint32_t
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

inline auto hiradix_tree::split(std::uint32_t i, std::int64_t k) -> std::uint32_t
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

inline auto hiradix_tree::remove_node(std::uint32_t i) -> void
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
  changed(i);
  n.tokens = {};
  n.hashes = {};
  n.children = {};
  n.tier_pages = {};
  free_nodes_.push_back(i);
  refresh(parent);
}

inline auto hiradix_tree::set_pages(std::uint32_t i, tier t, std::span<std::int64_t const> pages) -> void
{
  if (t == tier::remote) { return; }
  auto& v = nodes_[i].tier_pages[std::size_t(t)];
  v.assign(pages.begin(), pages.end());
  for (auto pg : v) {
    owner_[std::size_t(t)][std::size_t(pg)] = i + 1;
  }
}

inline auto hiradix_tree::make_resident(std::uint32_t i, tier t) -> void
{
  node_data& n = nodes_[i];
  if (n.resident[std::size_t(t)]) { return; }
  unaccount(i);
  n.resident[std::size_t(t)] = true;
  changed(i);
  account(i);
  stats_.resident_pages[std::size_t(t)] += n.pages();
  ++nodes_[n.parent].children_resident[std::size_t(t)];
  refresh(i);
  refresh(n.parent);
}

inline auto hiradix_tree::release_pages(std::uint32_t i, tier t) -> std::vector<std::int64_t>
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

inline auto hiradix_tree::drop(std::uint32_t i, tier t, bool remove_if_empty) -> std::vector<std::int64_t>
{
  node_data& n = nodes_[i];
  unaccount(i);
  n.resident[std::size_t(t)] = false;
  changed(i);
  account(i);
  stats_.resident_pages[std::size_t(t)] -= n.pages();
  --nodes_[n.parent].children_resident[std::size_t(t)];
  auto ids = release_pages(i, t);
  refresh(i);
  refresh(n.parent);
  if (remove_if_empty) { remove_empty({i}); }
  return ids;
}

inline auto hiradix_tree::remove_empty(std::vector<std::uint32_t> nodes) -> void
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

}  // namespace strata
