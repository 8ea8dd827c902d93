// SPDX-License-Identifier: Apache-2.0
/**
 * @file index/detail/hiradix_tree/changes.inl
 * @brief What the caller asks of the tree: insert, transient marks, adopt, prefetch, discard,
 *        locks, loads, and the copy orders with their completion.
 *
 * Member definitions of `hiradix_tree` (index/hiradix_tree.hpp), which includes this file.
 */
#pragma once

namespace strata {

inline auto hiradix_tree::insert(std::span<std::int32_t const> tokens, std::span<std::int64_t const> device_pages)
    -> insert_result
{
  std::int64_t const pages = whole_pages(tokens);
  STRATA_EXPECTS(static_cast<std::int64_t>(device_pages.size()) == pages, "hiradix_tree::insert: ", device_pages.size(),
                 " device pages for ", pages, " whole pages of ", tokens.size(), " tokens");
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
      if (config_.backup_policy == write_policy::write_through) { backup(n); }
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
      if (config_.backup_policy == write_policy::write_through) { backup(n); }
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

inline auto hiradix_tree::mark_in_queue(request_id request, std::span<std::int32_t const> tokens) -> std::int64_t
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

inline auto hiradix_tree::commit(request_id request, std::span<std::int64_t const> device_pages) -> node_ref
{
  std::uint32_t const n = transient_node(request, "commit");
  STRATA_EXPECTS(static_cast<std::int64_t>(device_pages.size()) == nodes_[n].pages(), "hiradix_tree::commit: request ",
                 request.value, " has ", nodes_[n].pages(), " transient pages, got ", device_pages.size(),
                 " device pages");
  check_new_device_pages(device_pages, "commit");
  ++clock_;
  transient_.erase(request);
  nodes_[n].state = transient_state::none;
  nodes_[n].owner = {};
  changed(n);
  set_pages(n, tier::device, device_pages);
  make_resident(n, tier::device);
  touch(n);
  if (config_.backup_policy == write_policy::write_through) { backup(n); }
  return ref(n);
}

inline auto hiradix_tree::abort(request_id request) -> void
{
  std::uint32_t const n = transient_node(request, "abort");
  transient_.erase(request);
  remove_node(n);
}

inline auto hiradix_tree::page_key(std::span<std::int32_t const> page, std::uint64_t parent_key) const -> std::uint64_t
{
  STRATA_EXPECTS(std::int64_t(page.size()) == config_.page_tokens, "hiradix_tree::page_key: a page holds ",
                 config_.page_tokens, " ids, got ", page.size());
  return page_hash(page.data(), parent_key);
}

inline auto hiradix_tree::check_adopt_slots(tier t, std::span<std::int32_t const> tokens,
                                            std::span<std::int64_t const> slots) const -> void
{
  std::int64_t const pages = whole_pages(tokens);
  slot_allocator const& alloc = *slots_[std::size_t(t)];
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
}

inline auto hiradix_tree::adopt(tier t, std::span<std::int32_t const> tokens, std::span<std::int64_t const> slots)
    -> adopt_result
{
  STRATA_EXPECTS((t == tier::host || t == tier::file || t == tier::remote) && has_tier(t),
                 "hiradix_tree::adopt: pages can be adopted into the host, file or remote tier the tree has, not the ",
                 to_string(t), " tier");
  std::int64_t const pages = whole_pages(tokens);
  if (t == tier::remote) {
    STRATA_EXPECTS(slots.empty(), "hiradix_tree::adopt: remote pages are named by their keys, got ", slots.size(),
                   " slots");
  } else {
    STRATA_EXPECTS(std::int64_t(slots.size()) == pages, "hiradix_tree::adopt: ", slots.size(), " slots for ", pages,
                   " whole pages");
    check_adopt_slots(t, tokens, slots);
  }
  ++clock_;
  adopt_result r;
  // The remote tier has no slots, only a capacity: the walk stops where it ends.
  auto room = [&](std::int64_t count) { return t != tier::remote || remote_used_ + count <= config_.capacity[3]; };
  auto take = [&](std::uint32_t n, std::int64_t from, std::int64_t count) {
    if (t == tier::remote) {
      remote_used_ += count;
    } else {
      auto const mine = slots.subspan(std::size_t(from), std::size_t(count));
      slots_[std::size_t(t)]->claim(mine);
      set_pages(n, t, mine);
    }
    make_resident(n, t);
    touch(n);
    r.pages += count;
  };
  std::uint32_t cur = 0;
  std::int64_t p = 0;
  while (p < pages) {
    std::uint32_t const child = find_child(cur, tokens, p);
    if (child == npos) {
      if (!room(pages - p)) { break; }
      std::uint32_t const n = add_node(cur, tokens, p, pages, transient_state::none, {});
      take(n, p, pages - p);
      cur = n;
      break;
    }
    if (nodes_[child].state != transient_state::none) { break; }
    std::int64_t const k = common_pages(nodes_[child], tokens, p, pages);
    bool const takes = !nodes_[child].resident[std::size_t(t)] && nodes_[child].pins[std::size_t(t)] == 0;
    if (takes && !room(k)) { break; }
    std::uint32_t const n = k < nodes_[child].pages() ? split(child, k) : child;
    if (takes) {
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

inline auto hiradix_tree::prefetch(node_ref node) -> std::vector<copy_order>
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

inline auto hiradix_tree::discard(node_ref node, tier t) -> discard_result
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

inline auto hiradix_tree::discard_from(tier t, std::int64_t page) -> discard_result
{
  auto const u = std::size_t(t);
  STRATA_EXPECTS(t == tier::host || t == tier::file, "hiradix_tree::discard_from: ", to_string(t),
                 " pages are not discarded one by one");
  STRATA_EXPECTS(page >= 0 && std::size_t(page) < owner_[u].size(), "hiradix_tree::discard_from: ", to_string(t),
                 " page ", page, " out of range [0, ", owner_[u].size(), ")");
  std::uint32_t const owner = owner_[u][std::size_t(page)];
  if (owner == 0) {
    discard_result r;
    r.dropped = true;
    return r;
  }
  std::uint32_t const x = owner - 1;
  auto const& pages = nodes_[x].tier_pages[u];
  auto const k = std::int64_t(std::find(pages.begin(), pages.end(), std::int32_t(page)) - pages.begin());
  if (k > 0) { (void)split(x, k); }  // `x` keeps the lower half, from `page` on
  return discard(node_ref{x, nodes_[x].generation}, t);
}

inline auto hiradix_tree::lock(node_ref node, tier t) -> void
{
  check(node);
  for (std::uint32_t i = node.index; i != 0; i = nodes_[i].parent) {
    unaccount(i);
    ++nodes_[i].locks[std::size_t(t)];
    account(i);
    refresh(i);
  }
}

inline auto hiradix_tree::unlock(node_ref node, tier t) -> void
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

inline auto hiradix_tree::load(node_ref node, std::span<std::int64_t const> device_pages) -> std::vector<copy_order>
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

inline auto hiradix_tree::take_internal_evictions() -> std::vector<std::pair<tier, std::vector<std::int64_t>>>
{
  auto out = std::move(internal_);
  internal_.clear();
  return out;
}

inline auto hiradix_tree::take_copies() -> std::vector<copy_order>
{
  std::vector<copy_order> out = std::move(queued_);
  queued_.clear();
  return out;
}

inline auto hiradix_tree::complete(transfer_id id) -> std::vector<std::int64_t>
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
    if (t.demotion && nodes_[i].locks[std::size_t(t.from)] == 0) { nodes_[i].drop_pending[std::size_t(t.from)] = true; }
  }
  apply_pending_drops(t, freed);
  if (t.to == tier::host && config_.file_backup_policy == write_policy::write_through) {
    for (auto i : t.nodes) {
      if (nodes_[i].alive) { file_backup(i); }
    }
  }
  if (t.to == tier::host && config_.remote_backup_policy == write_policy::write_through) {
    for (auto i : t.nodes) {
      if (nodes_[i].alive) { remote_backup(i); }
    }
  }
  return freed;
}

inline auto hiradix_tree::cancel(transfer_id id) -> std::vector<std::int64_t>
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

inline auto hiradix_tree::order(std::uint32_t i, tier from, tier to, bool demotion) -> copy_order
{
  transfer_id const id = ++next_transfer_;
  transfers_.emplace(id, pending{{i}, from, to, demotion, nodes_[i].pages()});
  inbound_[std::size_t(to)] += nodes_[i].pages();
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

inline auto hiradix_tree::unpin(pending const& t) -> void
{
  inbound_[std::size_t(t.to)] -= t.pages;
  for (auto i : t.nodes) {
    unaccount(i);
    --nodes_[i].pins[std::size_t(t.from)];
    --nodes_[i].pins[std::size_t(t.to)];
    account(i);
  }
}

inline auto hiradix_tree::apply_pending_drops(pending const& t, std::vector<std::int64_t>& freed) -> void
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

inline auto hiradix_tree::backup(std::uint32_t i) -> void
{
  node_data const& n = nodes_[i];
  if (!has_tier(tier::host) || !n.resident[0] || n.resident[1] || n.pins[0] != 0 || n.pins[1] != 0) { return; }
  if (n.pages() > config_.capacity[1]) {  // larger than the whole host tier: the file tier keeps it
    if (!has_tier(tier::file) || n.resident[2] || n.pins[2] != 0 || !admit_record(i, tier::file)) { return; }
    if (auto pages = allocate(tier::file, n.pages(), i)) {
      set_pages(i, tier::file, *pages);
      queued_.push_back(order(i, tier::device, tier::file, false));
    }
    return;
  }
  if (auto pages = allocate(tier::host, n.pages(), i)) {
    set_pages(i, tier::host, *pages);
    queued_.push_back(order(i, tier::device, tier::host, false));
  }
}

inline auto hiradix_tree::file_backup(std::uint32_t i) -> void
{
  if (!record_copy_possible(i, tier::file) || !admit_record(i, tier::file)) { return; }
  if (record_copy(i, tier::file)) { record_ancestors(i, tier::file); }
}

inline auto hiradix_tree::remote_backup(std::uint32_t i) -> void
{
  if (!record_copy_possible(i, tier::remote) || !admit_record(i, tier::remote)) { return; }
  if (record_copy(i, tier::remote)) { record_ancestors(i, tier::remote); }
}

inline auto hiradix_tree::record_copy_possible(std::uint32_t i, tier t) const -> bool
{
  node_data const& n = nodes_[i];
  if (!has_tier(t) || !n.resident[1] || n.resident[std::size_t(t)] || n.pins[std::size_t(t)] != 0) { return false; }
  return t == tier::remote || n.pins[1] == 0;  // other copies may read the host pages of a remote write
}

inline auto hiradix_tree::record_copy(std::uint32_t i, tier t) -> bool
{
  auto pages = allocate(t, nodes_[i].pages(), i);
  if (!pages) { return false; }
  if (t == tier::file) { set_pages(i, t, *pages); }
  queued_.push_back(order(i, tier::host, t, false));
  return true;
}

inline auto hiradix_tree::record_ancestors(std::uint32_t i, tier t) -> void
{
  for (std::uint32_t k = nodes_[i].parent; k != 0 && !nodes_[k].resident[std::size_t(t)]; k = nodes_[k].parent) {
    if (!record_copy_possible(k, t)) { return; }  // a gap stays: what is below it waits for it
    std::size_t const u = std::size_t(t);
    std::int64_t const pages = nodes_[k].pages();
    if (config_.write_backlog_pages[u] > 0 && inbound_[u] + pages > config_.write_backlog_pages[u]) {
      stats_.writes_dropped[u] += pages;
      return;
    }
    if (!record_copy(k, t)) { return; }
  }
}

inline auto hiradix_tree::depth_tokens(std::uint32_t i) const noexcept -> std::int64_t
{
  std::int64_t pages = 0;
  for (std::uint32_t k = nodes_[i].parent; k != 0; k = nodes_[k].parent) {
    pages += nodes_[k].pages();
  }
  return pages * page_token_count();
}

inline auto hiradix_tree::admit_record(std::uint32_t i, tier t) -> bool
{
  std::size_t const u = std::size_t(t);
  std::int64_t const pages = nodes_[i].pages();
  double const middle = double(depth_tokens(i)) + 0.5 * double(pages * page_token_count());
  if (middle < config_.record_breakeven_tokens[u]) {
    stats_.writes_not_worth[u] += pages;
    return false;
  }
  if (config_.write_backlog_pages[u] > 0 && inbound_[u] > 0 && inbound_[u] + pages > config_.write_backlog_pages[u]) {
    stats_.writes_dropped[u] += pages;
    return false;
  }
  return true;
}

}  // namespace strata
