// SPDX-License-Identifier: Apache-2.0
/**
 * @file index/detail/hiradix_tree/lookup.inl
 * @brief Walking the tree: matches and probes, child lookup by content key, path queries, and the
 *        checks of device pages the caller passes.
 *
 * Member definitions of `hiradix_tree` (index/hiradix_tree.hpp), which includes this file.
 */
#pragma once

namespace strata {

inline auto hiradix_tree::match(std::span<std::int32_t const> tokens) -> match_result
{ return match_walk(tokens, nullptr); }

inline auto hiradix_tree::match(std::span<std::int32_t const> tokens, probe_memo& memo) -> match_result
{ return match_walk(tokens, memo_holds(tokens, memo) ? &memo : nullptr); }

inline auto hiradix_tree::match_walk(std::span<std::int32_t const> tokens, probe_memo* memo) -> match_result
{
  ++clock_;
  match_result r;
  std::int64_t const pages = whole_pages(tokens);
  stats_.queried_tokens += pages * page_token_count();
  std::uint32_t cur = 0;
  std::int64_t p = 0;
  bool device_run = true;
  std::size_t step = 0;  // along the memo's path while its nodes are unchanged (a backup below may change them)
  while (p < pages) {
    std::uint32_t child = npos;
    std::int64_t k = 0;
    if (memo != nullptr && step < memo->read_.size() &&
        nodes_[memo->read_[step].node].stamp == memo->read_[step].stamp) {
      child = memo->read_[step].node;
      k = memo->read_[step++].pages;
    } else if (memo != nullptr && step == memo->read_.size() && memo->miss_node_ == cur &&
               nodes_[cur].link_stamp == memo->miss_link_stamp_) {
      break;  // the lookup that found no child still finds none
    } else {
      memo = nullptr;
      child = find_child(cur, tokens, p);
      if (child == npos) { break; }
      k = common_pages(nodes_[child], tokens, p, pages);
    }
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
    if (config_.backup_policy == write_policy::write_through_selective && m.hits >= config_.selective_hits) {
      backup(n);
    }
    if (config_.file_backup_policy == write_policy::write_through_selective && m.hits >= config_.selective_hits) {
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

inline auto hiradix_tree::probe(std::span<std::int32_t const> tokens) const -> match_result
{ return walk(tokens, nullptr); }

inline auto hiradix_tree::probe(std::span<std::int32_t const> tokens, probe_memo& memo) const -> match_result const&
{
  if (!memo_holds(tokens, memo)) {
    memo.read_.clear();
    memo.miss_node_ = npos;
    memo.result_ = walk(tokens, &memo);
    memo.tree_ = serial_;
    memo.data_ = tokens.data();
    memo.size_ = tokens.size();
  } else {
    ++memo.reuses_;
  }
  return memo.result_;
}

inline auto hiradix_tree::walk(std::span<std::int32_t const> tokens, probe_memo* memo) const -> match_result
{
  match_result r;
  std::int64_t const pages = whole_pages(tokens);
  std::uint32_t cur = 0;
  std::int64_t p = 0;
  bool device_run = true;
  while (p < pages) {
    std::uint32_t const child = find_child(cur, tokens, p);
    if (child == npos) {
      if (memo != nullptr) {
        memo->miss_node_ = cur;
        memo->miss_link_stamp_ = nodes_[cur].link_stamp;
        memo->miss_page_ = p;
      }
      break;
    }
    node_data const& c = nodes_[child];
    std::int64_t const k = common_pages(c, tokens, p, pages);
    if (memo != nullptr) { memo->read_.push_back({child, c.stamp, k}); }
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

// A memo holds while every node whose edge the probe read is unchanged (a node's stamp moves with
// its tokens, transient state, residency and links: unchanged, it is still the child the lookup
// found, with the same edge and answer) and the lookup that found nothing still finds nothing
// (asked again only when a child was linked there since).
inline auto hiradix_tree::memo_holds(std::span<std::int32_t const> tokens, probe_memo& memo) const -> bool
{
  if (memo.tree_ != serial_ || memo.data_ != tokens.data() || memo.size_ != tokens.size()) { return false; }
  for (auto const& x : memo.read_) {
    if (x.node >= nodes_.size() || nodes_[x.node].stamp != x.stamp) { return false; }
  }
  if (memo.miss_node_ != npos) {
    if (memo.miss_node_ >= nodes_.size()) { return false; }
    std::uint64_t const now = nodes_[memo.miss_node_].link_stamp;
    if (now != memo.miss_link_stamp_) {
      if (find_child(memo.miss_node_, tokens, memo.miss_page_) != npos) { return false; }
      memo.miss_link_stamp_ = now;
    }
  }
  return true;
}

inline auto hiradix_tree::path_pages(node_ref node, tier t, bool arriving_too) const -> std::vector<std::int64_t>
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

inline auto hiradix_tree::holds(tier t, std::int64_t page) const noexcept -> bool
{
  std::size_t const u = std::size_t(t);
  return u < 3 && page >= 0 && std::size_t(page) < owner_[u].size() && owner_[u][std::size_t(page)] != 0;
}

inline auto hiradix_tree::path_length(node_ref node) const -> std::int64_t
{
  check(node);
  std::int64_t n = 0;
  for (auto i : path_of(node.index)) {
    n += nodes_[i].pages();
  }
  return n;
}

inline auto hiradix_tree::transient_pages(request_id request) const -> std::int64_t
{
  auto const it = transient_.find(request);
  return it == transient_.end() ? 0 : nodes_[it->second].pages();
}

inline auto hiradix_tree::locks(node_ref node, tier t) const -> std::int64_t
{
  check(node);
  return nodes_[node.index].locks[std::size_t(t)];
}

inline auto hiradix_tree::pages_to_load(node_ref node) const -> std::int64_t
{
  check(node);
  std::int64_t need = 0;
  for (auto i : path_of(node.index)) {
    need += loadable(i) ? nodes_[i].pages() : 0;
  }
  return need;
}

inline auto hiradix_tree::evictable_pages(tier t) const -> std::int64_t
{
  std::int64_t n = 0;
  for (auto const& [key, i] : lru_[std::size_t(t)]) {
    n += nodes_[i].pages();
  }
  return n;
}

inline auto hiradix_tree::stats() const -> hiradix_stats
{
  hiradix_stats s = stats_;
  for (std::size_t t = 0; t < tier_count; ++t) {
    s.resident_bytes[t] = s.resident_pages[t] * config_.page_bytes;
  }
  return s;
}

inline auto hiradix_tree::resident(node_ref node, tier t) const -> bool
{
  check(node);
  return nodes_[node.index].resident[std::size_t(t)];
}

inline auto hiradix_tree::free_slots(tier t) const -> std::int64_t
{
  auto const& s = slots_[std::size_t(t)];
  return s ? s->available() : 0;
}

inline auto hiradix_tree::page_hash(std::int32_t const* page, std::uint64_t seed) const noexcept -> std::uint64_t
{ return chain_key(std::span<std::int32_t const>{page, std::size_t(config_.page_tokens)}, seed); }

inline auto hiradix_tree::find_child(std::uint32_t parent, std::span<std::int32_t const> tokens, std::int64_t p) const
    -> std::uint32_t
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

inline auto hiradix_tree::common_pages(node_data const& c, std::span<std::int32_t const> tokens, std::int64_t p,
                                       std::int64_t pages) const noexcept -> std::int64_t
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

inline auto hiradix_tree::check(node_ref r) const -> void
{
  STRATA_EXPECTS(r.index < nodes_.size() && nodes_[r.index].alive && nodes_[r.index].generation == r.generation,
                 "hiradix_tree: node ", r.index, " (generation ", r.generation, ") does not exist");
}

inline auto hiradix_tree::path_of(std::uint32_t i) const -> std::vector<std::uint32_t>
{
  std::vector<std::uint32_t> path;
  for (; i != 0; i = nodes_[i].parent) {
    path.push_back(i);
  }
  std::reverse(path.begin(), path.end());
  return path;
}

inline auto hiradix_tree::fastest_tier(node_data const& n) noexcept -> std::size_t
{
  std::size_t t = 0;
  while (t + 1 < tier_count && !n.resident[t]) {
    ++t;
  }
  return t;
}

inline auto hiradix_tree::loadable(std::uint32_t i) const noexcept -> bool
{
  node_data const& n = nodes_[i];
  return !n.resident[0] && n.pins[0] == 0 && cached(n);
}

inline auto hiradix_tree::transient_node(request_id request, char const* what) const -> std::uint32_t
{
  auto const it = transient_.find(request);
  STRATA_EXPECTS(it != transient_.end(), "hiradix_tree::", what, ": request ", request.value,
                 " has no transient pages");
  return it->second;
}

inline auto hiradix_tree::check_new_device_pages(std::span<std::int64_t const> pages, char const* what,
                                                 std::span<std::int32_t const> const* insert_tokens) -> void
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

inline auto hiradix_tree::held_device_pages(std::span<std::int32_t const> tokens, std::int64_t pages) const
    -> std::vector<std::int64_t>
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

inline auto hiradix_tree::note_transient(match_result& r, node_data const& c, std::int64_t k) const noexcept -> void
{
  r.transient_tokens = k * page_token_count();
  r.transient = c.state;
  r.transient_owner = c.owner;
  r.delay_hit = r.transient_tokens > 0 && r.transient_tokens >= config_.delay_hit_tokens;
}

inline auto hiradix_tree::note_cached(match_result& r, node_data const& c, std::int64_t k,
                                      bool& device_run) const noexcept -> void
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

}  // namespace strata
