// SPDX-License-Identifier: Apache-2.0
/**
 * @file cache/detail/controller.inl
 * @brief Member definitions of `cache_controller` (cache/controller.hpp, which includes this file):
 *        construction, the engine loop and the state queries. The steps they share are in
 *        controller_internals.inl.
 */
#pragma once

namespace strata {

template <cache_policies Policies>
cache_controller<Policies>::cache_controller(tiers_type tiers, controller_options options, scheduler_type scheduler,
                                             executor_type executor)
    : tiers_{std::move(tiers)},
      options_{checked_options(std::move(options), tiers_)},
      scheduler_{std::move(scheduler)},
      executor_{std::move(executor)},
      recovered_{(detail::check_record_ids(tiers_, ids_per_page()), tiers_)},
      tree_{index_config(), tiers_.slots()}
{
  detail::restore_counts const r = detail::restore(tree_, recovered_.take(), ids_per_page());
  recovered_.done();
  stats_.restored_pages = r.restored;
  stats_.restore_dropped = r.dropped;
}

template <cache_policies Policies>
controller_options cache_controller<Policies>::checked_options(controller_options o, tiers_type const& tiers)
{
  if (o.costs.page_bytes() == 0) { o.costs = h200::costs_for(tiers.geometry()).with_rates_set_on(o.costs); }
  STRATA_EXPECTS(o.costs.page_tokens() == tiers.geometry().page_tokens,
                 "cache_controller: the cost model's pages hold ", o.costs.page_tokens(), " tokens, the tiers' ",
                 tiers.geometry().page_tokens);
  STRATA_EXPECTS(o.prefetch_timeout_s >= 0 && o.prefetch_timeout_s < 1e9,
                 "cache_controller: prefetch_timeout_s must be in [0, 1e9) seconds, got ", o.prefetch_timeout_s);
  STRATA_EXPECTS(o.record_write_backlog_s >= 0 && o.record_write_backlog_s < 1e9,
                 "cache_controller: record_write_backlog_s must be in [0, 1e9) seconds, got ",
                 o.record_write_backlog_s);
  return o;
}

template <cache_policies Policies>
void cache_controller<Policies>::submit(cache_request const& r, stream_type stream)
{
  std::lock_guard lock{m_};
  check_stream(stream);
  bool const by_page = options_.ids_are_pages;
  std::int64_t const ids = std::int64_t(r.tokens.size());
  std::int64_t const prompt = r.prompt_tokens > 0 ? r.prompt_tokens : (by_page ? 0 : ids);
  STRATA_EXPECTS(requests_.count(r.id) == 0, "cache_controller::submit: request ", r.id.value, " is already live");
  // With one id per page a prompt shorter than a page has no id at all: it is computed, never cached.
  STRATA_EXPECTS((ids > 0 || by_page) && prompt > 0, "cache_controller::submit: request ", r.id.value,
                 " has no tokens (page-id mode needs prompt_tokens)");
  STRATA_EXPECTS(r.max_new_tokens >= 1, "cache_controller::submit: request ", r.id.value,
                 " must generate at least one token, got ", r.max_new_tokens);
  STRATA_EXPECTS(r.prompt_tokens >= 0, "cache_controller::submit: request ", r.id.value,
                 ": prompt_tokens must not be negative (0: the token ids' count), got ", r.prompt_tokens);
  STRATA_EXPECTS(std::isfinite(r.arrival_s) && r.arrival_s >= 0, "cache_controller::submit: request ", r.id.value,
                 ": arrival_s must be finite and not negative, got ", r.arrival_s);
  std::int64_t const whole = by_page ? ids : ids / page_tokens();
  STRATA_EXPECTS(whole <= prompt / page_tokens() && (by_page || prompt == ids), "cache_controller::submit: request ",
                 r.id.value, " has ", prompt, " prompt tokens for ", ids, by_page ? " page ids" : " token ids");
  // Its first chunk holds a page for every prompt and output token: a request that cannot fit the
  // whole pool would wait for ever.
  std::int64_t const pt = page_tokens();
  std::int64_t const prompt_pages = pages_for(prompt, pt), output_pages = pages_for(r.max_new_tokens, pt);
  std::int64_t const pool = tiers_.capacity(tier::device);
  STRATA_EXPECTS(prompt_pages <= pool && output_pages <= pool - prompt_pages, "cache_controller::submit: request ",
                 r.id.value, " needs ", prompt_pages, " + ", output_pages, " device pages (", prompt_pages, " for its ",
                 prompt, "-token prompt, ", output_pages, " for ", r.max_new_tokens,
                 " new tokens), more than the device pool's ", pool);
  auto s = std::make_unique<state>();
  s->tokens.assign(r.tokens.begin(), r.tokens.end());
  s->prompt_tokens = prompt;
  s->max_new_tokens = r.max_new_tokens;
  s->submission = ++submissions_;
  mark(r.id, *s);
  waiting_request w;
  w.id = r.id;
  w.submission = s->submission;
  w.arrival_s = r.arrival_s;
  w.tokens = s->tokens;
  w.prompt_tokens = prompt;
  w.output_tokens = r.max_new_tokens;
  waiting_.push_back(w);
  waiting_state_.push_back(s.get());
  state& st = *s;
  requests_.emplace(r.id, std::move(s));
  ++stats_.submitted;
  try {  // best effort: the request is in, whatever becomes of its lookup and prefetch
    start_lookup(st);
    prefetch(st, stream);
  } catch (std::exception const&) {
    st.prefetch_retry = false;
  }
}

template <cache_policies Policies>
batch_plan cache_controller<Policies>::schedule(schedule_budget const& budget)
{
  std::lock_guard lock{m_};
  STRATA_EXPECTS(budget.tokens > 0, "cache_controller::schedule: token budget must be positive, got ", budget.tokens);
  STRATA_EXPECTS(
      budget.running_sequences >= 0 && budget.running_context_tokens >= 0 && budget.running_max_remaining >= 0,
      "cache_controller::schedule: running figures must not be negative");
  batch_plan plan;
  plan.round = ++round_;
  planned_.clear();
  if (waiting_.empty()) { return plan; }
  // Requests whose prefetch holds them back (wait_complete, timeout) are left out of the view; the
  // plan's positions are the view's (begin_loads finds its requests by id).
  std::vector<std::size_t> shown;
  std::vector<waiting_request> visible;
  settle_lookups(nullptr);
  bool const hiding = held_for_prefetch(shown);
  if (hiding) {
    if (shown.empty()) { return plan; }
    for (auto i : shown) {
      visible.push_back(waiting_[i]);
    }
  }
  scheduler_view v;
  v.waiting = hiding ? std::span<waiting_request const>{visible} : std::span<waiting_request const>{waiting_};
  v.tree = &tree_;
  v.costs = &options_.costs;
  v.page_tokens = page_tokens();
  v.token_budget = budget.tokens;
  v.device_pages_available = device_pages_available_locked();
  v.pages_by_chunk = options_.device_pages_by_chunk;
  if (v.pages_by_chunk) {  // the whole page tables of the prefills under way are theirs
    std::int64_t reserved = 0;
    for (auto const& w : waiting_) {
      reserved += w.started ? table_pages(w.prompt_tokens, w.output_tokens, page_tokens()) : 0;
    }
    v.device_pages_unreserved = tiers_.capacity(tier::device) - reserved;
  }
  v.running_sequences = budget.running_sequences;
  v.running_context_tokens = budget.running_context_tokens;
  v.running_max_remaining = budget.running_max_remaining;
  plan = plan_batch(scheduler_, v, tree_);
  plan.round = round_;
  for (auto const& it : plan.prefills) {
    planned_.emplace_back(it.id, waiting_state_[hiding ? shown[it.index] : it.index]->submission);
  }
  for (auto const& d : plan.deferred) {
    waiting_request& w = waiting_[hiding ? shown[d.index] : d.index];
    ++w.deferrals;
    w.delay_hit_deferred = d.reason == deferral_reason::delay_hit;
    ++stats_.deferrals[std::size_t(d.reason)];
  }
  return plan;
}

template <cache_policies Policies>
auto cache_controller<Policies>::begin_loads(batch_plan const& plan, stream_type stream) -> load_handle_type
{
  std::lock_guard lock{m_};
  check_stream(stream);
  STRATA_EXPECTS(plan.round == round_ && plan.round != begun_, "cache_controller::begin_loads: plan of round ",
                 plan.round, " is not the last one scheduled (", round_, ") or was begun already");
  begun_ = plan.round;
  load_handle_type h;
  h.round = plan.round;
  // The plan's requests in the waiting list, found by id: a call from another thread since
  // `schedule` (a `poll` that sent a failed load's requests back to wait, a `release`) may have
  // moved them, and requests a prefetch held back were not in the strategy's view. Items whose
  // request is gone, was released and submitted again (its plan was sized for another prompt), or
  // was sent back to wait with a later chunk planned, are dropped.
  std::vector<prefill_item> items;
  for (prefill_item it : plan.prefills) {
    if (it.index >= waiting_.size() || waiting_[it.index].id != it.id) {
      auto const f = std::find_if(waiting_.begin(), waiting_.end(), [&](auto const& w) { return w.id == it.id; });
      if (f == waiting_.end()) { continue; }
      it.index = std::size_t(f - waiting_.begin());
    }
    auto const p = std::find_if(planned_.begin(), planned_.end(), [&](auto const& q) { return q.first == it.id; });
    if (p == planned_.end() || p->second != waiting_state_[it.index]->submission) { continue; }
    if (it.first_chunk == waiting_[it.index].started) { continue; }
    items.push_back(it);
  }
  // Hold every cached prefix of the batch first, so that one request's allocation cannot evict
  // another's. A first chunk whose cached node is gone (a strategy that sized it from a probe and
  // its match found less) is skipped: it is sized again next round.
  for (auto const& it : items) {
    if (it.first_chunk && tree_.alive(it.cached_node)) { tree_.lock(it.cached_node, tier::device); }
  }
  std::vector<copy_order> loads;
  // Chunks of prefills under way take their pages first: pages go to them before new requests.
  std::vector<char> extended(items.size(), 0);
  for (std::size_t i = 0; i < items.size(); ++i) {
    extended[i] = !items[i].first_chunk && extend(items[i], stream);
  }
  for (std::size_t i = 0; i < items.size(); ++i) {
    prefill_item const& it = items[i];
    if (!it.first_chunk) {
      (extended[i] ? h.ran : h.skipped).push_back(it);
      continue;
    }
    if (!tree_.alive(it.cached_node)) {
      h.skipped.push_back(it);
      continue;
    }
    if (!start(it, stream, h, loads)) {
      tree_.unlock(it.cached_node, tier::device);
      h.skipped.push_back(it);
      continue;
    }
    h.ran.push_back(it);
  }
  std::vector<std::size_t> done;
  for (auto const& it : h.ran) {
    waiting_request& w = waiting_[it.index];
    w.prefilled_tokens += it.chunk_tokens;
    stats_.computed_tokens += it.chunk_tokens;
    if (w.prefilled_tokens >= w.prompt_tokens) { done.push_back(it.index); }
  }
  std::sort(done.begin(), done.end(), std::greater<>());
  for (auto i : done) {
    waiting_state_[i]->at = stage::prefilled;
    waiting_.erase(waiting_.begin() + std::ptrdiff_t(i));
    waiting_state_.erase(waiting_state_.begin() + std::ptrdiff_t(i));
  }
  // Pages this batch reads that an earlier batch's loads are still filling: the engine waits for
  // those loads too.
  std::vector<std::int64_t> read;
  for (auto const& st : h.started) {
    auto const& prefix = requests_.at(st.id)->prefix;
    read.insert(read.end(), prefix.begin(), prefix.end());
  }
  h.after = log_.loads_filling(read);
  if (!loads.empty()) {
    std::vector<request_id> readers;
    for (auto const& st : h.started) {
      readers.push_back(st.id);
    }
    h.submission = log_.submit(executor_, tiers_, std::move(loads), copy_kind::load, stream, std::move(readers));
    h.transfer = log_[log_.size() - 1].handle;
  }
  return h;
}

template <cache_policies Policies>
bool cache_controller<Policies>::complete(load_handle_type const& h)
{
  std::lock_guard lock{m_};
  if (!h.transfer) { return true; }
  if (auto const at = log_.position(h.submission)) { return settle(*at); }
  return true;  // settled already (by `poll`)
}

template <cache_policies Policies>
std::size_t cache_controller<Policies>::poll(stream_type stream)
{
  std::lock_guard lock{m_};
  check_stream(stream);
  for (std::size_t i = 0; i < log_.size();) {
    if (!settle(i)) { ++i; }
  }
  log_.submit_queued(executor_, tiers_, tree_, stream, /*device_sources=*/false);
  for (std::size_t i = 0; i < log_.size();) {  // what an executor copied at once
    if (!settle(i)) { ++i; }
  }
  settle_lookups(&stream);
  for (auto* s : waiting_state_) {  // prefetches that found the host full, once room was made
    if (s->prefetch != 0 && !log_.pending(s->prefetch)) { s->prefetch = 0; }
    bool const room_landed = std::none_of(s->prefetch_room.begin(), s->prefetch_room.end(),
                                          [&](std::uint64_t id) { return log_.pending(id); });
    if (s->prefetch_retry && s->prefetch == 0 && room_landed && s->at == stage::waiting) { prefetch(*s, stream); }
  }
  return log_.size();
}

template <cache_policies Policies>
std::vector<std::int64_t> cache_controller<Policies>::page_table(request_id id) const
{
  std::lock_guard lock{m_};
  state const& s = live(id, "page_table");
  STRATA_EXPECTS(s.at != stage::waiting, "cache_controller::page_table: request ", id.value, " has not started");
  std::vector<std::int64_t> t = s.prefix;
  t.insert(t.end(), s.computed.begin(), s.computed.end());
  t.insert(t.end(), s.extra.begin(), s.extra.end());
  return t;
}

template <cache_policies Policies>
auto cache_controller<Policies>::finish_prefill(request_id id, stream_type stream) -> prefill_result_type
{
  std::lock_guard lock{m_};
  check_stream(stream);
  state& s = live(id, "finish_prefill");
  STRATA_EXPECTS(s.at == stage::prefilled, "cache_controller::finish_prefill: request ", id.value,
                 s.at == stage::running ? " finished its prefill already" : " has prompt chunks left to run");
  prefill_result_type out;
  std::int64_t const n = whole_pages(s);
  std::vector<std::int64_t> table = tree_.path_pages(s.node, tier::device, /*arriving_too=*/true);
  table.insert(table.end(), s.computed.begin(), s.computed.end());
  if (s.transient_pages > 0) {
    (void)tree_.commit(id, std::span<std::int64_t const>{s.computed}.last(std::size_t(s.transient_pages)));
  }
  insert_result const r = tree_.insert(s.tokens, table);
  // Unused pages inside the cached path duplicate another request's: freed now, the request reads
  // the index's. Past it (another request computes that prefix) the request keeps its own.
  std::int64_t const path = tree_.path_length(r.node);
  std::int64_t const duplicates = std::int64_t(r.unused_device_pages.size()) - (n - path);
  if (duplicates > 0) {
    auto const held = tree_.path_pages(r.node, tier::device);
    for (std::size_t p = std::size_t(s.cached_pages); p < held.size(); ++p) {
      if (held[p] != table[p]) { out.duplicate_positions.push_back(std::int64_t(p)); }
    }
  }
  std::int64_t const dup = std::max<std::int64_t>(0, duplicates);
  release_device({r.unused_device_pages.begin(), r.unused_device_pages.begin() + dup});
  std::vector<std::int64_t> kept(r.unused_device_pages.begin() + dup, r.unused_device_pages.end());
  kept.insert(kept.end(), s.extra.begin(), s.extra.end());
  s.extra = std::move(kept);
  s.computed.clear();
  tree_.lock(r.node, tier::device);
  tree_.unlock(s.node, tier::device);
  s.node = r.node;
  s.prefix = tree_.path_pages(r.node, tier::device, /*arriving_too=*/true);
  out.after = log_.loads_filling(s.prefix);
  s.at = stage::running;
  registry_.remove(id);
  unblock(id);
  log_.submit_queued(executor_, tiers_, tree_, stream, /*device_sources=*/true);
  return out;
}

template <cache_policies Policies>
void cache_controller<Policies>::release(request_id id, std::span<std::int32_t const> cache_tokens, stream_type stream)
{
  std::lock_guard lock{m_};
  check_stream(stream);
  state& s = live(id, "release");
  if (!cache_tokens.empty()) {
    STRATA_EXPECTS(s.at == stage::running, "cache_controller::release: request ", id.value,
                   " can cache its tokens only after finish_prefill");
    std::span<std::int32_t const> const prompt = s.tokens;
    STRATA_EXPECTS(
        cache_tokens.size() >= prompt.size() && std::equal(prompt.begin(), prompt.end(), cache_tokens.begin()),
        "cache_controller::release: request ", id.value, "'s cache_tokens do not extend its prompt");
    std::vector<std::int64_t> table = tree_.path_pages(s.node, tier::device, /*arriving_too=*/true);
    std::size_t const pages = cache_tokens.size() / std::size_t(ids_per_page());
    std::size_t const need = pages > table.size() ? pages - table.size() : 0;
    STRATA_EXPECTS(need <= s.extra.size(), "cache_controller::release: request ", id.value, " caches ", pages,
                   " whole pages but its page table holds ", table.size() + s.extra.size());
    table.insert(table.end(), s.extra.begin(), s.extra.begin() + std::ptrdiff_t(need));
    table.resize(pages);
    insert_result const r = tree_.insert(cache_tokens.first(pages * std::size_t(ids_per_page())), table);
    s.extra.erase(s.extra.begin(), s.extra.begin() + std::ptrdiff_t(need));
    s.extra.insert(s.extra.end(), r.unused_device_pages.begin(), r.unused_device_pages.end());
    log_.submit_queued(executor_, tiers_, tree_, stream, /*device_sources=*/true);
  }
  drop(id, s);
}

template <cache_policies Policies>
std::int64_t cache_controller<Policies>::evict(tier t, std::int64_t pages, stream_type stream)
{
  std::lock_guard lock{m_};
  check_stream(stream);
  eviction_result r = tree_.evict(t, pages);
  if (t == tier::device) { release_device(r.freed); }
  log_.queue(std::move(r.demotions));
  log_.submit_queued(executor_, tiers_, tree_, stream, /*device_sources=*/true);
  return r.pages;
}

template <cache_policies Policies>
match_result cache_controller<Policies>::probe(std::span<std::int32_t const> tokens) const
{
  std::lock_guard lock{m_};
  return tree_.probe(tokens);
}

template <cache_policies Policies>
std::int64_t cache_controller<Policies>::device_pages_available() const
{
  std::lock_guard lock{m_};
  return device_pages_available_locked();
}

template <cache_policies Policies>
std::size_t cache_controller<Policies>::waiting() const
{
  std::lock_guard lock{m_};
  return waiting_.size();
}

template <cache_policies Policies>
bool cache_controller<Policies>::failed(request_id id) const
{
  std::lock_guard lock{m_};
  state const& s = live(id, "failed");
  if (s.failed) { return true; }
  // A load filling the prefix of a running request (`prefill_result::after`) that failed and was
  // not settled yet (`complete`/`poll` will mark the request): failed already.
  if (s.at != stage::running) { return false; }
  auto const filling = log_.loads_filling(s.prefix);
  return std::any_of(filling.begin(), filling.end(),
                     [&](auto const& h) { return executor_.status(h) == copy_status::failed; });
}

template <cache_policies Policies>
bool cache_controller<Policies>::prefilled(request_id id) const
{
  std::lock_guard lock{m_};
  return live(id, "prefilled").at == stage::prefilled;
}

template <cache_policies Policies>
std::size_t cache_controller<Policies>::live_requests() const
{
  std::lock_guard lock{m_};
  return requests_.size();
}

template <cache_policies Policies>
std::size_t cache_controller<Policies>::pending_submissions() const
{
  std::lock_guard lock{m_};
  return log_.size();
}

template <cache_policies Policies>
cache_stats cache_controller<Policies>::stats() const
{
  std::lock_guard lock{m_};
  cache_stats s = stats_;
  s.bytes_moved = log_.bytes_moved();
  hiradix_stats const t = tree_.stats();
  s.evicted_pages = t.evicted_pages;
  s.writes_not_worth = t.writes_not_worth;
  s.writes_dropped = t.writes_dropped;
  return s;
}

template <cache_policies Policies>
hiradix_stats cache_controller<Policies>::index_stats() const
{
  std::lock_guard lock{m_};
  return tree_.stats();
}

template <cache_policies Policies>
void cache_controller<Policies>::check_invariants() const
{
  std::lock_guard lock{m_};
  tree_.check_invariants();
  auto const& slots = tiers_.device().slots();
  std::vector<std::uint8_t> use(std::size_t(slots.capacity()), 0);
  auto claim = [&](std::int64_t p, char const* who) {
    STRATA_EXPECTS_AS(error, p >= 0 && p < slots.capacity() && slots.is_allocated(p),
                      "cache_controller invariant: ", who, " holds device page ", p, ", which is free");
    STRATA_EXPECTS_AS(error, use[std::size_t(p)]++ == 0, "cache_controller invariant: device page ", p,
                      " is held twice (", who, ")");
  };
  for (auto const& [id, s] : requests_) {
    for (auto p : s->computed) {
      claim(p, "a request's computed pages");
    }
    for (auto p : s->extra) {
      claim(p, "a request's own pages");
    }
  }
  for (std::int64_t p = 0; p < slots.capacity(); ++p) {
    if (tree_.holds(tier::device, p)) { claim(p, "the index"); }
  }
  for (std::int64_t p = 0; p < slots.capacity(); ++p) {
    STRATA_EXPECTS_AS(error, !slots.is_allocated(p) || use[std::size_t(p)] == 1,
                      "cache_controller invariant: device page ", p, " is allocated but nobody holds it (a leak)");
  }
}

}  // namespace strata
