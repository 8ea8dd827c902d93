// SPDX-License-Identifier: Apache-2.0
/**
 * @file cache/detail/controller_internals.inl
 * @brief The steps `cache_controller`'s members share: device pages and starting a request,
 *        prefetch, settling submissions (what landed, what failed), transient marks, and giving up
 *        what a request holds. Included by cache/controller.hpp.
 */
#pragma once

namespace strata {

template <cache_policies Policies>
hiradix_config cache_controller<Policies>::index_config() const
{
  hiradix_config c;
  kv_geometry const g = tiers_.geometry();
  c.page_tokens = options_.ids_are_pages ? 1 : g.page_tokens;
  c.tokens_per_id = options_.ids_are_pages ? g.page_tokens : 1;
  c.page_bytes = g.page_bytes();
  for (std::size_t t = 0; t < tier_count; ++t) {
    c.capacity[t] = tiers_.capacity(tier(t));
  }
  c.backup_policy = options_.backup_policy;
  c.file_backup_policy = options_.file_backup_policy;
  c.remote_backup_policy = options_.remote_backup_policy;
  c.selective_hits = options_.selective_hits;
  c.delay_hit_tokens = options_.delay_hit_tokens;
  for (tier t : {tier::file, tier::remote}) {  // a slow tier holds only what is worth reading back
    if (options_.records_by_cost) {
      c.record_breakeven_tokens[std::size_t(t)] = options_.costs.record_breakeven_tokens(t);
    }
    // Pages the tier writes in record_write_backlog_s (0: no bound).
    double const pages =
        std::ceil(options_.record_write_backlog_s * options_.costs.write_bytes_per_s(t) / double(g.page_bytes()));
    c.write_backlog_pages[std::size_t(t)] =
        options_.record_write_backlog_s > 0 ? std::int64_t(std::max(1.0, std::min(pages, 1e15))) : 0;
  }
  return c;
}

template <cache_policies Policies>
auto cache_controller<Policies>::live(request_id id, char const* what) const -> state&
{
  auto const it = requests_.find(id);
  STRATA_EXPECTS(it != requests_.end(), "cache_controller::", what, ": unknown or released request ", id.value);
  return *it->second;
}

template <cache_policies Policies>
double cache_controller<Policies>::now() const
{
  if (options_.clock) { return options_.clock(); }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <cache_policies Policies>
void cache_controller<Policies>::check_stream(stream_type const& stream) const
{
  if constexpr (stream_checked_executor<executor_type>) { executor_.check_stream(stream); }
}

// --- device pages and starting a request ----------------------------------------------------------

template <cache_policies Policies>
std::optional<std::vector<std::int64_t>> cache_controller<Policies>::allocate(std::int64_t n)
{
  auto& slots = tiers_.device().slots();
  if (slots.available() < n) {
    eviction_result r = tree_.evict(tier::device, n - slots.available());
    release_device(r.freed);
    log_.queue(std::move(r.demotions));
  }
  log_.collect(tree_);
  if (slots.available() < n) { return std::nullopt; }
  if (n == 0) { return std::vector<std::int64_t>{}; }
  return slots.allocate(n);
}

template <cache_policies Policies>
void cache_controller<Policies>::release_device(std::span<std::int64_t const> pages)
{
  if (!pages.empty()) { tiers_.device().slots().release(pages); }
}

template <cache_policies Policies>
bool cache_controller<Policies>::start(prefill_item const& it, stream_type stream, load_handle_type& h,
                                       std::vector<copy_order>& loads)
{
  waiting_request& w = waiting_[it.index];
  state& s = *waiting_state_[it.index];
  std::int64_t const to_load = tree_.pages_to_load(it.cached_node);
  std::int64_t const cached = tree_.path_length(it.cached_node);
  std::vector<std::uint64_t> keys;
  if (scheduler_.uses_transient_nodes()) {
    // Another request of this batch (or one started since the plan was made) now computes this
    // prefix: this one waits for it rather than compute it twice.
    match_result const m = tree_.probe(s.tokens);
    if (s.transient_pages == 0 && m.delay_hit && m.transient_owner != w.id) { return false; }
    keys = page_keys(s, cached);
    // A prompt cached whole computes its last page again into a page of its own: the index holds
    // it, so no other request waits for this one to compute it.
    if (!keys.empty() && m.tokens >= s.prompt_tokens) { keys.pop_back(); }
    if (registry_.computed_elsewhere(keys, page_tokens(), options_.delay_hit_tokens)) { return false; }
    mark(w.id, s);
  }
  // Loaded pages, then the pages the chunk computes into (all of the request's without
  // `device_pages_by_chunk`: the whole prompt's, the partial tail and the output).
  std::int64_t const pt = page_tokens();
  std::int64_t const own =
      options_.device_pages_by_chunk
          ? chunk_pages(s.prompt_tokens, s.max_new_tokens, cached, it.cached_tokens + it.chunk_tokens, pt)
          : first_chunk_pages(s.prompt_tokens, s.max_new_tokens, cached, 0, pt);
  auto pages = allocate(to_load + own);
  log_.submit_queued(executor_, tiers_, tree_, stream, /*device_sources=*/true);
  if (!pages) { return false; }
  // Cached pages below its prefix that the plan chose to recompute (`prefill_item::prefix_pages`:
  // reading a slow tier would take longer), counted with the predicted times of both ways.
  std::int64_t recomputed = 0;
  if (it.prefix_pages >= 0) {
    match_result const whole = tree_.probe(s.tokens);
    // Not the last page of a prompt cached whole: that one is computed again by rule, read or not.
    std::int64_t const reach = std::min(whole.tokens, (s.prompt_tokens - 1) / pt * pt) / pt;
    recomputed = std::max<std::int64_t>(0, reach - cached);
    if (recomputed > 0) {
      std::array<std::int64_t, tier_count> below{};
      for (tier t : {tier::file, tier::remote}) {
        below[std::size_t(t)] = whole.fastest_tokens[std::size_t(t)] / page_tokens();
      }
      stats_.recomputed_pages += recomputed;
      stats_.recomputed_read_s += options_.costs.load_s(below);
      stats_.recomputed_compute_s += options_.costs.prefill_s(recomputed * page_tokens(), cached * page_tokens());
    }
  }
  if (scheduler_.uses_transient_nodes()) {
    // Every page it computes, marked or not: the cached pages below its prefix that the plan chose
    // to recompute run on into its marked ones, and a request extending them must see the run
    // whole (two runs each shorter than the delay-hit threshold can make one longer than it).
    registry_.add(w.id, keys);
  }
  started_request st{w.id, {}};
  for (auto& o : tree_.load(it.cached_node, std::span<std::int64_t const>{*pages}.first(std::size_t(to_load)))) {
    std::int64_t const count = std::int64_t(o.from_pages.size());
    st.cached_pages[std::size_t(o.from)] += count;
    h.loaded_pages[std::size_t(o.from)] += count;
    loads.push_back(std::move(o));
  }
  st.cached_pages[0] = cached - to_load;
  for (std::size_t t = 0; t < tier_count; ++t) {
    stats_.hit_tokens[t] += st.cached_pages[t] * page_tokens();
  }
  h.started.push_back(st);
  s.cached_pages = cached;
  s.node = it.cached_node;
  s.locked = true;
  s.at = stage::prefilling;
  s.prefix = tree_.path_pages(it.cached_node, tier::device, /*arriving_too=*/true);
  hold(s, w, std::span<std::int64_t const>{*pages}.subspan(std::size_t(to_load)));
  if (s.transient_pages > 0) { tree_.mark_in_flight(w.id); }
  w.started = true;
  w.cached_tokens = it.cached_tokens;
  w.prefilled_tokens = it.cached_tokens;  // the chunks compute the rest
  w.delay_hit_deferred = false;
  return true;
}

/// The next chunk of a prefill under way takes the pages it computes into (`device_pages_by_chunk`).
/// False without memory.
template <cache_policies Policies>
bool cache_controller<Policies>::extend(prefill_item const& it, stream_type stream)
{
  if (!options_.device_pages_by_chunk) { return true; }
  waiting_request& w = waiting_[it.index];
  state& s = *waiting_state_[it.index];
  std::int64_t const end = std::min(w.prompt_tokens, w.prefilled_tokens + it.chunk_tokens);
  auto pages = allocate(chunk_pages(s.prompt_tokens, s.max_new_tokens, w.table_pages, end, page_tokens()));
  log_.submit_queued(executor_, tiers_, tree_, stream, /*device_sources=*/true);
  if (!pages) { return false; }
  hold(s, w, *pages);
  return true;
}

/// Appends new pages to a request's page table: whole prompt pages it computes first, then the
/// partial tail and the output (`extra`).
template <cache_policies Policies>
void cache_controller<Policies>::hold(state& s, waiting_request& w, std::span<std::int64_t const> pages)
{
  std::size_t const computed = std::size_t(whole_pages(s) - s.cached_pages);
  for (auto p : pages) {
    (s.computed.size() < computed ? s.computed : s.extra).push_back(p);
  }
  w.table_pages = std::int64_t(s.prefix.size() + s.computed.size() + s.extra.size());
}

// --- prefetch ---------------------------------------------------------------------------------------

/// Starts copying the part of a request's cached prefix that lies below the host (file, remote) up
/// to the host tier, per `options_.prefetch`. When the host has no room, the demotions that make it
/// are submitted and the prefetch is tried again (by `poll`) once they have landed, at most three
/// times in all.
template <cache_policies Policies>
void cache_controller<Policies>::prefetch(state& s, stream_type stream)
{
  s.prefetch_retry = false;
  if (options_.prefetch == prefetch_mode::off || !tree_.has_tier(tier::host)) { return; }
  match_result const m = tree_.probe(s.tokens);
  std::int64_t const below = m.fastest_tokens[std::size_t(tier::file)] + m.fastest_tokens[std::size_t(tier::remote)];
  if (below == 0) { return; }
  if (!worth_reading(m, s.prompt_tokens)) {
    stats_.prefetch_not_worth_pages += below / page_tokens();
    return;
  }
  log_.collect(tree_);  // copies queued before: not this prefetch's
  ++s.prefetch_tries;
  std::vector<copy_order> orders = tree_.prefetch(m.node);
  std::int64_t got = 0;
  for (auto const& o : orders) {
    got += std::int64_t(o.to_pages.size()) * page_tokens();
  }
  // Pages another request's prefetch is bringing up now (the index skips nodes pinned by it): this
  // request waits for that copy too, rather than start and read them a second time.
  std::uint64_t shared = 0;
  if (got < below) {
    std::vector<std::int64_t> arriving = tree_.path_pages(m.node, tier::host, /*arriving_too=*/true);
    std::sort(arriving.begin(), arriving.end());
    for (std::size_t i = 0; i < log_.size(); ++i) {
      if (log_[i].kind != copy_kind::background) { continue; }
      for (auto const& o : log_[i].orders) {
        if (o.to != tier::host || (o.from != tier::file && o.from != tier::remote)) { continue; }
        std::int64_t const on_path = std::count_if(o.to_pages.begin(), o.to_pages.end(), [&](std::int64_t p) {
          return std::binary_search(arriving.begin(), arriving.end(), p);
        });
        if (on_path > 0) {
          got += on_path * page_tokens();
          shared = log_[i].id;
        }
      }
    }
  }
  // The demotions that make room on the host, each its own submission (settles when it lands).
  s.prefetch_room = log_.submit_collected(executor_, tiers_, tree_, stream);
  s.prefetch_retry = got < below && !s.prefetch_room.empty() && s.prefetch_tries < 3;
  if (got < below && !s.prefetch_retry) { stats_.prefetch_abandoned_pages += (below - got) / page_tokens(); }
  if (orders.empty() && shared != 0) {
    s.prefetch = shared;
    if (!s.prefetch_at) { s.prefetch_at = now(); }
  }
  if (!orders.empty()) {
    for (auto const& o : orders) {
      stats_.prefetched_pages += std::int64_t(o.to_pages.size());
    }
    s.prefetch = log_.submit(executor_, tiers_, std::move(orders), copy_kind::background, stream);
    if (!s.prefetch_at) { s.prefetch_at = now(); }
    if (executor_.status(log_[log_.size() - 1].handle) != copy_status::pending) {  // copied at once
      (void)settle(log_.size() - 1);
      s.prefetch = 0;
    }
  }
  log_.submit_queued(executor_, tiers_, tree_, stream, /*device_sources=*/false);
}

/// Whether reading the part of `m` that lies below the host is predicted faster than computing it
/// (the cost model; a slow disk can lose to recompute): else it is not prefetched, and the
/// scheduler's `choose_prefix` recomputes it too.
template <cache_policies Policies>
bool cache_controller<Policies>::worth_reading(match_result const& m, std::int64_t prompt_tokens) const
{
  std::array<std::int64_t, tier_count> pages{};
  for (std::size_t t = 2; t < tier_count; ++t) {
    pages[t] = m.fastest_tokens[t] / page_tokens();
  }
  return reading_pays(pages, m.upper_prefix_tokens, m.tokens, prompt_tokens);
}

/// Whether loading `pages` (per tier) is predicted faster than computing the prompt's tokens
/// [upper, end) they hold over the `upper` tokens before them (the prompt's last token is always computed).
template <cache_policies Policies>
bool cache_controller<Policies>::reading_pays(std::array<std::int64_t, tier_count> const& pages, std::int64_t upper,
                                              std::int64_t end, std::int64_t prompt_tokens) const
{
  upper = std::min(upper, prompt_tokens - 1);
  std::int64_t const below = std::min(end, prompt_tokens - 1) - upper;
  return below > 0 && options_.costs.load_s(pages) < options_.costs.prefill_s(below, upper);
}

/// Under `wait_complete` / `timeout`: settles the prefetches that landed, and lists in `shown` the
/// waiting positions not held back by one — nor, in any mode, by a remote lookup not yet answered
/// (the store's own timeouts bound it). True when some request is held back.
template <cache_policies Policies>
bool cache_controller<Policies>::held_for_prefetch(std::vector<std::size_t>& shown)
{
  bool const by_prefetch =
      options_.prefetch == prefetch_mode::wait_complete || options_.prefetch == prefetch_mode::timeout;
  if (!by_prefetch && lookups_pending_ == 0) { return false; }
  double const t = options_.prefetch == prefetch_mode::timeout ? now() : 0;
  bool held = false;
  for (std::size_t i = 0; i < waiting_.size(); ++i) {
    state& s = *waiting_state_[i];
    if (by_prefetch && s.prefetch != 0) {
      auto const at = log_.position(s.prefetch);
      bool const timed_out = options_.prefetch == prefetch_mode::timeout && s.prefetch_at &&
                             t - *s.prefetch_at >= options_.prefetch_timeout_s;
      if (!at || settle(*at)) {
        s.prefetch = 0;  // landed, or failed (its pages are read from below, or recomputed)
      } else if (timed_out) {
        s.prefetch = 0;
        ++stats_.prefetch_timeouts;
      }
    }
    if (s.remote_lookup != 0) {
      held = true;
      ++stats_.remote_lookup_waits;
    } else if (by_prefetch && s.prefetch != 0) {
      held = true;
      ++stats_.prefetch_waits;
    } else {
      shown.push_back(i);
    }
  }
  return held;
}

// --- remote lookups ---------------------------------------------------------------------------------

/// Tells a remote tier over a shared store the request's prompt, and asks it (on the store's
/// threads) which leading pages it holds when this index lacks some of them.
template <cache_policies Policies>
void cache_controller<Policies>::start_lookup(state& s)
{
  if constexpr (tiers_type::has(tier::remote)) {
    auto& remote = tiers_.template get<tier::remote>();
    if constexpr (prompt_lookup_store<std::remove_cvref_t<decltype(remote)>>) {
      if (!tree_.has_tier(tier::remote)) { return; }  // a stack whose remote tier has no capacity
      if (tree_.probe(s.tokens).tokens / page_tokens() >= whole_pages(s)) {
        remote.learn(s.tokens, ids_per_page());  // its pages' keys, for the writes to come
        return;
      }
      s.remote_lookup = remote.submit_lookup(s.tokens, ids_per_page()).id;
      ++lookups_pending_;
      ++stats_.remote_lookups;
    }
  } else {
    (void)s;
  }
}

template <cache_policies Policies>
void cache_controller<Policies>::settle_lookups(stream_type const* stream)
{
  if constexpr (tiers_type::has(tier::remote)) {
    auto& remote = tiers_.template get<tier::remote>();
    if constexpr (prompt_lookup_store<std::remove_cvref_t<decltype(remote)>>) {
      std::erase_if(orphan_lookups_, [&](std::uint64_t t) { return remote.poll_lookup(io_ticket{t}).has_value(); });
      for (std::size_t i = 0; lookups_pending_ > 0 && i < waiting_.size(); ++i) {
        state& s = *waiting_state_[i];
        if (s.remote_lookup == 0) { continue; }
        std::optional<std::int64_t> const found = remote.poll_lookup(io_ticket{s.remote_lookup});
        if (!found) { continue; }
        s.remote_lookup = 0;
        --lookups_pending_;
        if (*found == 0 || s.at != stage::waiting) { continue; }
        // Pages found beyond what the index holds: adopted only if reading them beats computing them
        // (as a file tier's prefix is prefetched only then), else the index never learns of them.
        std::int64_t const pt = page_tokens();
        match_result const m = tree_.probe(s.tokens);
        std::int64_t const extra = *found - m.tokens / pt;
        if (extra <= 0) { continue; }
        std::array<std::int64_t, tier_count> reads{};
        reads[std::size_t(tier::remote)] = extra;
        if (!reading_pays(reads, m.tokens, *found * pt, s.prompt_tokens)) {
          stats_.prefetch_not_worth_pages += extra;
          continue;
        }
        // Its in-queue mark covers the pages it lacked: the pages found replace it, it marks the rest.
        request_id const id = waiting_[i].id;
        if (tree_.transient_pages(id) > 0) { tree_.abort(id); }
        s.transient_pages = 0;
        auto const pages = std::span<std::int32_t const>(s.tokens).first(std::size_t(*found * ids_per_page()));
        stats_.remote_found_pages += tree_.adopt(tier::remote, pages, {}).pages;
        mark(id, s);
        unblock(id);  // requests that waited for its mark mark again
        if (stream && s.prefetch == 0) {
          prefetch(s, *stream);
        } else {
          s.prefetch_retry = true;  // the next poll prefetches them
        }
      }
    }
  } else {
    (void)stream;
  }
}

// --- settling submissions ---------------------------------------------------------------------------

template <cache_policies Policies>
bool cache_controller<Policies>::settle(std::size_t i)
{
  copy_status const st = executor_.status(log_[i].handle);
  if (st == copy_status::pending) { return false; }
  submission const sub = log_.take(i);
  if (st == copy_status::done) {
    landed(sub);
  } else {
    failed_copy(sub);
  }
  return true;
}

/// Every copy of the submission completes in the index; demoted device pages return to the pool.
template <cache_policies Policies>
void cache_controller<Policies>::landed(submission const& sub)
{
  for (auto const& o : sub.orders) {
    release_device(tree_.complete(o.id));
  }
}

/// A submission that will never land. Its copies are cancelled in the index; every live request
/// whose page table holds a page it was filling read garbage: a running one keeps those pages
/// (freed with it) and is marked failed, any other starts over, as does every first chunk that
/// read the failed batch. What a record store failed to read back leaves the index.
template <cache_policies Policies>
void cache_controller<Policies>::failed_copy(submission const& sub)
{
  ++stats_.failed_transfers;
  std::set<std::int64_t> lost;  // device pages the failed copy was filling
  for (auto const& o : sub.orders) {
    release_device(tree_.cancel(o.id));
    if (o.to != tier::device) { continue; }
    lost.insert(o.to_pages.begin(), o.to_pages.end());
  }
  std::vector<request_id> again;
  for (auto& [id, r] : requests_) {
    bool const reads = std::any_of(r->prefix.begin(), r->prefix.end(), [&](auto p) { return lost.count(p) != 0; });
    bool const reader = std::find(sub.readers.begin(), sub.readers.end(), id) != sub.readers.end();
    if (!reads && !reader) { continue; }
    if (r->at != stage::running) {
      again.push_back(id);
      continue;
    }
    r->failed = true;
    for (auto p : r->prefix) {
      if (lost.erase(p) != 0) { r->extra.push_back(p); }
    }
  }
  for (auto p : lost) {
    tiers_.device().slots().release(std::span<std::int64_t const>{&p, 1});
  }
  std::sort(again.begin(), again.end());
  for (auto id : again) {  // locks and marks go first, so that the lost copies can go
    unhold(id, *requests_.at(id));
  }
  // What a record store failed to read back is not trusted again: those copies leave the index
  // (with the prefixes cached only below them), so the requests recompute rather than retry. An
  // executor that names the lost pages loses those pages and what follows them: the intact
  // prefix stays cached, as after a restart. Of another executor's failure every record read
  // goes. (Only reads from a record store: a failed write below it says nothing of the source.)
  std::vector<request_id> unmarked;
  auto const dropped = [&](discard_result const& d) {
    release_device(d.freed_device);
    for (auto n : d.pages) {
      stats_.discarded_pages += n;
    }
    unmarked.insert(unmarked.end(), d.unmarked.begin(), d.unmarked.end());
  };
  std::array<bool, tier_count> whole{};  // record tiers whose every read of the submission goes
  if constexpr (loss_reporting_executor<executor_type>) {
    for (lost_record const& l : executor_.lost(sub.handle)) {
      if (l.from == tier::file) {
        dropped(tree_.discard_from(l.from, l.slot));
      } else {
        whole[std::size_t(l.from)] = true;  // the remote tier's pages are keys, not slots
      }
    }
  } else {
    whole[std::size_t(tier::file)] = whole[std::size_t(tier::remote)] = true;
  }
  for (auto const& o : sub.orders) {
    if (o.from < tier::file || o.to >= tier::file || !whole[std::size_t(o.from)] || !tree_.alive(o.node)) { continue; }
    dropped(tree_.discard(o.node, o.from));
  }
  for (auto id : again) {
    requeue(id);
  }
  for (auto id : unmarked) {  // waiting requests whose marks hung below what went: they mark again
    auto const r = requests_.find(id);
    if (r == requests_.end() || tree_.transient_pages(id) > 0) { continue; }  // gone, or marked again already
    r->second->transient_pages = 0;
    unblock(id);
    mark(id, *r->second);
  }
}

/// A request whose load failed starts over (its pages went back with `unhold`): it waits, and its
/// next start finds only what is really cached.
template <cache_policies Policies>
void cache_controller<Policies>::requeue(request_id id)
{
  auto const it = requests_.find(id);
  if (it == requests_.end()) { return; }
  state& s = *it->second;
  bool const was_waiting = std::find(waiting_state_.begin(), waiting_state_.end(), &s) != waiting_state_.end();
  s.at = stage::waiting;
  unblock(id);
  mark(id, s);
  if (was_waiting) {
    for (auto& w : waiting_) {
      if (w.id == id) { w.started = false, w.prefilled_tokens = 0, w.cached_tokens = 0, w.table_pages = 0; }
    }
  } else {
    waiting_request w;
    w.id = id;
    w.submission = s.submission;
    w.tokens = s.tokens;
    w.prompt_tokens = s.prompt_tokens;
    w.output_tokens = s.max_new_tokens;
    waiting_.insert(waiting_.begin(), w);
    waiting_state_.insert(waiting_state_.begin(), &s);
  }
  ++stats_.requeued;
}

// --- transient marks --------------------------------------------------------------------------------

/// Marks a request's uncached prefix as about to be computed by it (delay hits need marks). When
/// its prefix runs into another request's transient prefix, that request will compute it: this one
/// marks again once that one commits or goes (`unblock`), so that of several requests extending
/// the same prefix one marks — and computes — the extension.
template <cache_policies Policies>
void cache_controller<Policies>::mark(request_id id, state& s)
{
  if (!scheduler_.uses_transient_nodes() || s.transient_pages > 0) { return; }
  match_result const m = tree_.probe(s.tokens);
  if (m.transient_tokens > 0 && m.transient_owner != id) {
    registry_.wait_for_mark(m.transient_owner, id);
    return;
  }
  s.transient_pages = tree_.mark_in_queue(id, s.tokens) / page_tokens();
  if (s.transient_pages > 0 && s.at == stage::prefilling) { tree_.mark_in_flight(id); }
}

/// `owner`'s transient prefix committed or went: the requests that ran into it and have not
/// finished their prefill mark again (one computing already marks what it computes, so that later
/// requests wait for it).
template <cache_policies Policies>
void cache_controller<Policies>::unblock(request_id owner)
{
  for (auto id : registry_.take_waiters(owner)) {
    auto const r = requests_.find(id);
    if (r != requests_.end() && (r->second->at == stage::waiting || r->second->at == stage::prefilling)) {
      mark(id, *r->second);
    }
  }
}

template <cache_policies Policies>
std::vector<std::uint64_t> cache_controller<Policies>::page_keys(state const& s, std::int64_t from) const
{
  std::vector<std::uint64_t> keys = chain_keys(s.tokens, ids_per_page());
  keys.erase(keys.begin(), keys.begin() + std::min<std::ptrdiff_t>(std::ptrdiff_t(from), std::ptrdiff_t(keys.size())));
  return keys;
}

// --- giving up what a request holds -----------------------------------------------------------------

/// Gives up what a request holds: its registered pages, transient prefix, locks, own pages.
template <cache_policies Policies>
void cache_controller<Policies>::unhold(request_id id, state& s)
{
  registry_.remove(id);
  if (tree_.transient_pages(id) > 0) { tree_.abort(id); }
  s.transient_pages = 0;
  if (s.locked) { tree_.unlock(s.node, tier::device); }
  s.locked = false;
  release_device(s.computed);
  release_device(s.extra);
  s.computed.clear();
  s.extra.clear();
  s.prefix.clear();
}

template <cache_policies Policies>
void cache_controller<Policies>::drop(request_id id, state& s)
{
  if (s.remote_lookup != 0) {  // its answer is collected, and forgotten, by a later poll
    orphan_lookups_.push_back(s.remote_lookup);
    --lookups_pending_;
  }
  unhold(id, s);
  unblock(id);
  for (std::size_t i = 0; i < waiting_state_.size(); ++i) {
    if (waiting_state_[i] == &s) {
      waiting_.erase(waiting_.begin() + std::ptrdiff_t(i));
      waiting_state_.erase(waiting_state_.begin() + std::ptrdiff_t(i));
      break;
    }
  }
  log_.forget_reader(id);  // a pending load no longer requeues it
  requests_.erase(id);
  ++stats_.released;
}

}  // namespace strata
