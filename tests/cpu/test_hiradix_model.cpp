// SPDX-License-Identifier: Apache-2.0
// Model-based test of hiradix_tree: random operation sequences, each step checked against a plain
// map from cached page prefixes to per-page state, and the tree's own invariants checked after
// every step. STRATA_HIRADIX_SEQUENCES overrides the number of sequences (default 100,000).
#include "../support/catch.hpp"

#include <strata/index/hiradix_tree.hpp>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

using namespace strata;

namespace {

using tokens_t = std::vector<std::int32_t>;

/// What the random sequences exercised, so that a quiet test cannot pass unnoticed.
struct coverage {
  long new_pages = 0, matched_tokens = 0, delay_hits = 0, locks = 0, commits = 0, aborts = 0, evicted = 0,
       demotions = 0, completes = 0, cancels = 0, loads = 0, internal_evictions = 0, remote = 0, records_refused = 0,
       memo_reuses = 0, memo_walks = 0, memo_matches = 0;
};
coverage cover;

struct mpage {
  bool transient = false;
  transient_state state{};
  request_id owner{};
  std::array<bool, tier_count> res{};
  std::array<std::int64_t, 3> id{-1, -1, -1};  // device, host, file (also a pending destination)
  std::int64_t key = -1;                       // remote key, once demoted there
  std::array<int, tier_count> locks{};
  std::array<int, tier_count> pins{};
  std::array<bool, tier_count> drop_pending{};  // demoted out of a tier while another transfer read it
  std::uint64_t last = 0;
  std::int64_t hits = 0;
  [[nodiscard]] bool cached() const { return res[0] || res[1] || res[2] || res[3]; }
  [[nodiscard]] bool pinned() const { return pins[0] + pins[1] + pins[2] + pins[3] > 0; }
  [[nodiscard]] bool locked() const { return locks[0] + locks[1] + locks[2] + locks[3] > 0; }
};

struct mtransfer {
  std::vector<tokens_t> pages;
  tier from, to;
  bool demotion;
};

struct lock_record {
  node_ref node;
  tier t;
  std::vector<tokens_t> pages;
};

/// The reference: a map of cached page prefixes, and the rules of the tree stated per page.
class model_test {
 public:
  model_test(std::uint64_t seed) : rng_{seed}, seed_{seed}
  {
    cfg_.page_tokens = 2;
    cfg_.page_bytes = 64;
    cfg_.capacity = {24, pick({0, 6, 12}), pick({0, 4, 8}), pick({0, 6, 6})};
    cfg_.backup_policy = std::array{write_policy::write_through, write_policy::write_through_selective,
                                    write_policy::write_back}[rng_() % 3];
    // What the record tiers take: everything, or only nodes whose middle lies deep enough; and a
    // bound on what may be on its way into them (0: no bound).
    // Each bound in a quarter of the sequences, so that enough still reaches the remote tier.
    for (std::size_t u : {std::size_t(2), std::size_t(3)}) {
      cfg_.record_breakeven_tokens[u] = std::array{-1e300, -1e300, -1e300, 6.0}[rng_() % 4];
      cfg_.write_backlog_pages[u] = pick({0, 0, 0, 3});
    }
    cfg_.selective_hits = pick({1, 2, 3});
    cfg_.delay_hit_tokens = pick({2, 4});
    tree_.emplace(cfg_);
    for (std::int64_t i = 0; i < cfg_.capacity[0]; ++i) {
      (void)free_device_.insert(i);
    }
  }

  void run(int steps)
  {
    for (step_ = 0; step_ < steps; ++step_) {
      int const op = static_cast<int>(rng_() % 100);
      INFO("seed " << seed_ << ", step " << step_ << ", op " << op);
      if (op < 22) {
        do_insert();
      } else if (op < 44) {
        do_match();
      } else if (op < 50) {
        do_unlock();
      } else if (op < 57) {
        do_mark();
      } else if (op < 60) {
        do_in_flight();
      } else if (op < 66) {
        do_commit();
      } else if (op < 69) {
        do_abort();
      } else if (op < 80) {
        do_evict();
      } else if (op < 90) {
        do_complete();
      } else if (op < 92) {
        do_cancel();
      } else if (op < 97) {
        do_load();
      } else {
        do_bad_input();
      }
      sync();
      verify();
      check_memos();
    }
    for (std::size_t u : {std::size_t(2), std::size_t(3)}) {
      cover.records_refused += tree_->stats().writes_not_worth[u] + tree_->stats().writes_dropped[u];
    }
  }

 private:
  // -- helpers --
  std::int64_t pick(std::initializer_list<std::int64_t> v) { return *(v.begin() + rng_() % v.size()); }
  tokens_t random_tokens()
  {
    std::size_t const n = rng_() % 14;
    tokens_t t(n);
    for (auto& x : t) {
      x = static_cast<std::int32_t>(rng_() % 3);
    }
    return t;
  }
  std::vector<tokens_t> keys(tokens_t const& t) const
  {
    std::vector<tokens_t> out;
    for (std::size_t p = 2; p <= t.size(); p += 2) {
      out.emplace_back(t.begin(), t.begin() + std::ptrdiff_t(p));
    }
    return out;
  }
  /// Whether a page extends `k` by one page (resident in `resident_in`, if given; not in `except`).
  bool has_extension(tokens_t const& k, std::optional<tier> resident_in = {},
                     std::set<tokens_t> const* except = nullptr) const
  {
    for (auto it = pages_.upper_bound(k); it != pages_.end(); ++it) {
      if (it->first.size() < k.size() || !std::equal(k.begin(), k.end(), it->first.begin())) { break; }
      if (it->first.size() == k.size() + 2 && (!resident_in || it->second.res[std::size_t(*resident_in)]) &&
          (except == nullptr || except->count(it->first) == 0)) {
        return true;
      }
    }
    return false;
  }
  std::optional<std::vector<std::int64_t>> take_device(std::size_t n)
  {
    if (free_device_.size() < n) { return std::nullopt; }
    std::vector<std::int64_t> all(free_device_.begin(), free_device_.end());
    std::shuffle(all.begin(), all.end(), rng_);
    all.resize(n);
    for (auto i : all) {
      free_device_.erase(i);
    }
    return all;
  }
  void give_back(std::vector<std::int64_t> const& ids)
  {
    for (auto i : ids) {
      REQUIRE(free_device_.insert(i).second);
    }
  }
  tokens_t* page_with(tier t, std::int64_t id)
  {
    for (auto& [k, p] : pages_) {
      if ((t == tier::remote ? p.key : p.id[std::size_t(t)]) == id) { return const_cast<tokens_t*>(&k); }
    }
    return nullptr;
  }
  void remove_empty()
  {
    for (bool changed = true; changed;) {
      changed = false;
      for (auto it = pages_.begin(); it != pages_.end();) {
        auto const& p = it->second;
        if (!p.transient && !p.cached() && !p.pinned() && !has_extension(it->first)) {
          it = pages_.erase(it);
          changed = true;
        } else {
          ++it;
        }
      }
    }
  }
  /// Where the node whose last page is `k` goes when it leaves tier `t`.
  std::optional<tier> demotion_target(tokens_t const& k, mpage const& p, tier t) const
  {
    if (t == tier::device) {
      if (cfg_.backup_policy == write_policy::write_back && cfg_.capacity[1] > 0 && !p.res[1]) { return tier::host; }
      if (!p.res[1] && !p.res[2] && !p.res[3] && has_extension(k)) {  // only copy, pages below: any tier below
        for (std::size_t u = 1; u < tier_count; ++u) {
          if (cfg_.capacity[u] > 0) { return tier(u); }
        }
      }
      return std::nullopt;
    }
    for (std::size_t u = std::size_t(t) + 1; u < tier_count; ++u) {
      if (cfg_.capacity[u] == 0) { continue; }
      if (p.res[u]) { return std::nullopt; }
      return tier(u);
    }
    return std::nullopt;
  }
  bool copies_elsewhere(mpage const& p, tier t) const
  {
    for (std::size_t u = 0; u < tier_count; ++u) {
      if (u != std::size_t(t) && p.res[u]) { return true; }
    }
    return false;
  }
  /// The tree's candidate rule, stated for the last page of a node.
  bool candidate(tokens_t const& k, mpage const& p, tier t) const
  {
    std::size_t const u = std::size_t(t);
    if (p.transient || !p.res[u] || p.locks[u] != 0 || p.pinned() || has_extension(k, t)) { return false; }
    return copies_elsewhere(p, t) || demotion_target(k, p, t).has_value() || (!has_extension(k) && !p.locked());
  }
  void apply_drop(tier t, tokens_t const& k)
  {
    mpage& p = pages_.at(k);
    REQUIRE(p.res[std::size_t(t)]);
    p.res[std::size_t(t)] = false;
    if (t == tier::remote) {
      p.key = -1;
    } else {
      p.id[std::size_t(t)] = -1;
    }
  }
  void register_order(copy_order const& o)
  {
    INFO("order " << o.id << " " << to_string(o.from) << "->" << to_string(o.to));
    mtransfer m{{}, o.from, o.to, o.demotion};
    for (std::size_t i = 0; i < o.from_pages.size(); ++i) {
      tokens_t* k = page_with(o.from, o.from_pages[i]);
      REQUIRE(k != nullptr);
      mpage& p = pages_.at(*k);
      REQUIRE(p.res[std::size_t(o.from)]);
      ++p.pins[std::size_t(o.from)];
      ++p.pins[std::size_t(o.to)];
      if (o.to == tier::remote) {
        p.key = o.to_pages[i];
      } else {
        p.id[std::size_t(o.to)] = o.to_pages[i];
      }
      m.pages.push_back(*k);
    }
    REQUIRE(transfers_.emplace(o.id, std::move(m)).second);
  }
  /// Evictions the tree made to find room happened before the copies that needed the room.
  void sync_internal()
  {
    for (auto const& [t, freed] : tree_->take_internal_evictions()) {
      cover.internal_evictions += std::int64_t(freed.size());
      for (auto id : freed) {
        tokens_t* k = page_with(t, id);
        REQUIRE(k != nullptr);
        mpage const& p = pages_.at(*k);
        REQUIRE(p.locks[std::size_t(t)] == 0);
        REQUIRE(!p.pinned());
        apply_drop(t, *k);
      }
    }
  }
  void sync()
  {
    sync_internal();
    for (auto const& o : tree_->take_copies()) {
      register_order(o);
    }
    remove_empty();
  }
  /// Every prefix inserted or matched so far (each in half the steps), probed through a memo kept
  /// across the steps (as a scheduler keeps one per waiting request) and afresh: the same answer,
  /// whatever changed.
  void check_memos()
  {
    memos_.resize(watched_.size());
    for (std::size_t j = 0; j < watched_.size(); ++j) {
      if (rng_() % 2 == 0) { continue; }  // memos are also used after several steps of changes
      match_result const fresh = tree_->probe(watched_[j]);
      std::int64_t const before = memos_[j].reuses();
      match_result const& kept = tree_->probe(watched_[j], memos_[j]);
      ++(memos_[j].reuses() > before ? cover.memo_reuses : cover.memo_walks);
      INFO("seed " << seed_ << " step " << step_ << " prefix " << j);
      require_same_answer(kept, fresh);
      REQUIRE(kept.node == fresh.node);
    }
  }

  /// What a probe and a match (or two probes) must agree on: all but the node (a match splits).
  static void require_same_answer(match_result const& a, match_result const& b)
  {
    REQUIRE(a.tokens == b.tokens);
    REQUIRE(a.tier_tokens == b.tier_tokens);
    REQUIRE(a.fastest_tokens == b.fastest_tokens);
    REQUIRE(a.device_prefix_tokens == b.device_prefix_tokens);
    REQUIRE(a.upper_prefix_tokens == b.upper_prefix_tokens);
    REQUIRE(a.transient_tokens == b.transient_tokens);
    REQUIRE(a.transient == b.transient);
    REQUIRE(a.transient_owner == b.transient_owner);
    REQUIRE(a.delay_hit == b.delay_hit);
  }

  void verify()
  {
    INFO("seed " << seed_ << " step " << step_);
    tree_->check_invariants();
    std::array<std::int64_t, tier_count> resident{};
    for (auto const& [k, p] : pages_) {
      for (std::size_t t = 0; t < tier_count; ++t) {
        resident[t] += p.res[t];
      }
    }
    REQUIRE(tree_->stats().resident_pages == resident);
    REQUIRE(tree_->pending_transfers() == transfers_.size());
    std::size_t transient = 0;
    for (auto const& [k, p] : pages_) {
      transient += p.transient;
    }
    std::size_t expected = 0;
    for (auto const& [r, n] : requests_) {
      expected += std::size_t(tree_->transient_pages(r));
    }
    REQUIRE(transient == expected);
  }

  // -- operations --
  void do_insert()
  {
    tokens_t const t = random_tokens();
    auto const ks = keys(t);
    auto dev = take_device(ks.size());
    if (!dev) { return; }
    // Like an engine's page table, the cached prefix may use the pages the tree holds there.
    std::vector<std::int64_t> returned;
    for (std::size_t i = 0; i < ks.size(); ++i) {
      auto it = pages_.find(ks[i]);
      if (it == pages_.end() || it->second.transient || !it->second.cached()) { break; }
      if (it->second.id[0] >= 0 && rng_() % 2 == 0) {
        returned.push_back((*dev)[i]);
        (*dev)[i] = it->second.id[0];
      }
    }
    give_back(returned);
    ++clock_;
    std::int64_t expect_new = 0;
    std::vector<std::int64_t> expect_unused;
    std::size_t walked = 0;
    bool stopped = false;
    for (std::size_t i = 0; i < ks.size(); ++i) {
      auto it = pages_.find(ks[i]);
      if (it == pages_.end()) {
        expect_new += std::int64_t(ks.size() - i);
        walked = ks.size();
        break;
      }
      if (it->second.transient || !it->second.cached()) {
        stopped = true;
        (void)expect_unused.insert(expect_unused.end(), dev->begin() + std::ptrdiff_t(i), dev->end());
        break;
      }
      if (!it->second.res[0] && it->second.pins[0] == 0) {
        ++expect_new;
      } else if (it->second.id[0] != (*dev)[i]) {
        expect_unused.push_back((*dev)[i]);
      }
      walked = i + 1;
    }
    (void)stopped;
    auto const r = tree_->insert(t, *dev);
    cover.new_pages += r.new_pages;
    history_.push_back(t);
    watched_.push_back(t);
    REQUIRE(r.new_pages == expect_new);
    REQUIRE(r.unused_device_pages == expect_unused);
    REQUIRE(tree_->path_length(r.node) == std::int64_t(walked));
    for (std::size_t i = 0; i < walked; ++i) {
      mpage& p = pages_[ks[i]];
      p.last = clock_;
      if (!p.res[0] && p.pins[0] == 0) {
        p.res[0] = true;
        p.id[0] = (*dev)[i];
      }
    }
    give_back(expect_unused);
  }

  void do_match()
  {
    // A third of the time, tokens probed through a memo in an earlier step (the memo current or
    // stale): matched along the memo's path. Else half the time a sequence inserted before: most
    // real requests revisit cached prefixes.
    std::optional<std::size_t> via;
    if (!memos_.empty() && rng_() % 3 == 0) { via = rng_() % memos_.size(); }
    tokens_t const t = via                                    ? watched_[*via]
                       : !history_.empty() && rng_() % 2 == 0 ? history_[rng_() % history_.size()]
                                                              : random_tokens();
    if (via) {
      ++cover.memo_matches;
    } else {
      watched_.push_back(t);
    }
    auto const ks = keys(t);
    ++clock_;
    std::int64_t tokens = 0, device_prefix = 0, transient_tokens = 0;
    std::array<std::int64_t, tier_count> tiers{};
    bool device_run = true;
    transient_state state{};
    request_id owner{};
    for (std::size_t i = 0; i < ks.size(); ++i) {
      auto it = pages_.find(ks[i]);
      if (it == pages_.end()) { break; }
      if (it->second.transient) {
        owner = it->second.owner;
        state = it->second.state;
        for (std::size_t j = i; j < ks.size(); ++j) {
          auto jt = pages_.find(ks[j]);
          if (jt == pages_.end() || !jt->second.transient || jt->second.owner != owner) { break; }
          transient_tokens += 2;
        }
        break;
      }
      if (!it->second.cached()) { break; }
      tokens += 2;
      for (std::size_t u = 0; u < tier_count; ++u) {
        tiers[u] += it->second.res[u] ? 2 : 0;
      }
      device_run = device_run && it->second.res[0];
      if (device_run) { device_prefix += 2; }
    }
    match_result const probed = tree_->probe(t);  // what match will say, without its side effects
    auto const r = via ? tree_->match(watched_[*via], memos_[*via]) : tree_->match(t);
    // A backup that match starts may make room in the host tier first; those evictions come
    // before the lock below.
    sync_internal();
    require_same_answer(probed, r);
    cover.matched_tokens += r.tokens;
    cover.delay_hits += r.delay_hit;
    REQUIRE(r.tokens == tokens);
    REQUIRE(r.tier_tokens == tiers);
    REQUIRE(r.device_prefix_tokens == device_prefix);
    std::array<std::int64_t, tier_count> fastest{};
    for (std::size_t i = 0; i < std::size_t(tokens / 2); ++i) {
      mpage const& p = pages_.at(ks[i]);
      std::size_t u = 0;
      while (u + 1 < tier_count && !p.res[u]) {
        ++u;
      }
      fastest[u] += 2;
    }
    REQUIRE(r.fastest_tokens == fastest);
    REQUIRE(r.transient_tokens == transient_tokens);
    if (transient_tokens > 0) {
      REQUIRE(r.transient == state);
      REQUIRE(r.transient_owner == owner);
    }
    REQUIRE(r.delay_hit == (transient_tokens > 0 && transient_tokens >= cfg_.delay_hit_tokens));
    REQUIRE(tree_->path_length(r.node) == tokens / 2);
    std::vector<tokens_t> path(ks.begin(), ks.begin() + std::ptrdiff_t(tokens / 2));
    for (auto const& k : path) {
      pages_[k].last = clock_;
      ++pages_[k].hits;
    }
    // Sometimes hold the prefix: lock it in a random tier.
    if (!path.empty() && rng_() % 3 == 0) {
      tier const lt = tier(rng_() % tier_count);
      tree_->lock(r.node, lt);
      ++cover.locks;
      for (auto const& k : path) {
        ++pages_[k].locks[std::size_t(lt)];
      }
      locks_.push_back({r.node, lt, path});
    }
    last_match_ = {r.node, path};
    if (rng_() % 2 == 0) { do_load(); }  // bring what was found onto the device
  }

  void do_unlock()
  {
    if (locks_.empty()) { return; }
    std::size_t const i = rng_() % locks_.size();
    lock_record const l = locks_[i];
    locks_.erase(locks_.begin() + std::ptrdiff_t(i));
    tree_->unlock(l.node, l.t);
    for (auto const& k : l.pages) {
      --pages_.at(k).locks[std::size_t(l.t)];
    }
  }

  void do_mark()
  {
    tokens_t const t = random_tokens();
    auto const ks = keys(t);
    request_id const r{next_request_++};
    ++clock_;
    std::size_t i = 0;
    bool blocked = false;
    for (; i < ks.size(); ++i) {
      auto it = pages_.find(ks[i]);
      if (it == pages_.end()) { break; }
      if (it->second.transient) {
        blocked = true;
        break;
      }
      if (!it->second.cached()) { break; }
    }
    std::int64_t const expected = blocked || i == ks.size() ? 0 : std::int64_t(ks.size() - i) * 2;
    REQUIRE(tree_->mark_in_queue(r, t) == expected);
    if (expected == 0) { return; }
    for (std::size_t j = i; j < ks.size(); ++j) {
      REQUIRE(pages_.count(ks[j]) == 0);
      mpage& p = pages_[ks[j]];
      p.transient = true;
      p.state = transient_state::in_queue;
      p.owner = r;
      p.last = clock_;
    }
    requests_.emplace(r, std::vector<tokens_t>(ks.begin() + std::ptrdiff_t(i), ks.end()));
  }

  std::optional<std::pair<request_id, std::vector<tokens_t>>> some_request()
  {
    if (requests_.empty()) { return std::nullopt; }
    auto it = requests_.begin();
    std::advance(it, std::ptrdiff_t(rng_() % requests_.size()));
    return *it;
  }
  void do_in_flight()
  {
    auto const r = some_request();
    if (!r) { return; }
    tree_->mark_in_flight(r->first);
    for (auto const& k : r->second) {
      pages_.at(k).state = transient_state::in_flight;
    }
  }
  void do_commit()
  {
    auto const r = some_request();
    if (!r) { return; }
    auto dev = take_device(r->second.size());
    if (!dev) { return; }
    ++clock_;
    REQUIRE(tree_->transient_pages(r->first) == std::int64_t(r->second.size()));
    tree_->commit(r->first, *dev);
    ++cover.commits;
    for (std::size_t i = 0; i < r->second.size(); ++i) {
      mpage& p = pages_.at(r->second[i]);
      p.transient = false;
      p.state = {};
      p.owner = {};
      p.res[0] = true;
      p.id[0] = (*dev)[i];
      p.last = clock_;
    }
    requests_.erase(r->first);
  }
  void do_abort()
  {
    auto const r = some_request();
    if (!r) { return; }
    tree_->abort(r->first);
    ++cover.aborts;
    for (auto const& k : r->second) {
      pages_.erase(k);
    }
    requests_.erase(r->first);
  }

  void do_evict()
  {
    std::vector<tier> tiers;
    for (std::size_t u = 0; u < tier_count; ++u) {
      if (cfg_.capacity[u] > 0) { tiers.push_back(tier(u)); }
    }
    tier const t = tiers[rng_() % tiers.size()];
    std::int64_t const want = std::int64_t(rng_() % 6);
    // The candidates before, by the model's rule.
    std::map<tokens_t, std::uint64_t> before;
    for (auto const& [k, p] : pages_) {
      if (candidate(k, p, t)) { before.emplace(k, p.last); }
    }
    auto const r = tree_->evict(t, want);
    INFO("evict " << to_string(t) << " " << want << ": " << r.pages << " pages, " << r.freed.size() << " freed, "
                  << r.demotions.size() << " demotions");
    std::set<tokens_t> evicted;
    std::int64_t counted = 0;
    sync_internal();
    for (auto id : r.freed) {
      tokens_t* k = page_with(t, id);
      REQUIRE(k != nullptr);
      mpage const& p = pages_.at(*k);
      REQUIRE((p.locks[std::size_t(t)] == 0 && !p.pinned() && !p.transient));
      if (!copies_elsewhere(p, t)) { REQUIRE(!p.locked()); }
      evicted.insert(*k);
      apply_drop(t, *k);
      ++counted;
    }
    for (auto const& o : r.demotions) {
      REQUIRE(o.demotion);
      REQUIRE(o.from == t);
      tokens_t const& last = *page_with(t, o.from_pages.back());
      auto const target = demotion_target(last, pages_.at(last), t);
      // A node stuck on the device that finds no room in the tier below goes further down.
      bool const further = t == tier::device && target && o.to > *target && !pages_.at(last).res[1] &&
                           !pages_.at(last).res[2] && !pages_.at(last).res[3] && has_extension(last);
      REQUIRE((target == o.to || further));
      register_order(o);
      for (auto const& k : transfers_.at(o.id).pages) {
        (void)evicted.insert(k);
      }
      counted += std::int64_t(o.from_pages.size());
    }
    REQUIRE(counted == r.pages);
    cover.evicted += r.pages;
    cover.demotions += std::int64_t(r.demotions.size());
    cover.remote += t == tier::remote ? r.pages : 0;
    if (t == tier::device) {
      for (auto id : r.freed) {
        REQUIRE(free_device_.insert(id).second);
      }
    }
    sync();
    // Evicted nodes were tier-leaves: nothing else resident in the tier extends an evicted page.
    for (auto const& k : evicted) {
      if (pages_.count(k) == 0) { continue; }
      REQUIRE_FALSE(has_extension(k, t, &evicted));
    }
    // Least recently used first: nothing older than what was evicted stayed a candidate.
    std::uint64_t newest_evicted = 0;
    for (auto const& k : evicted) {
      auto const it = before.find(k);
      if (it != before.end()) { newest_evicted = std::max(newest_evicted, it->second); }
    }
    for (auto const& [k, last] : before) {
      if (evicted.count(k) != 0 || pages_.count(k) == 0) { continue; }
      mpage const& p = pages_.at(k);
      // Skipped: an only copy with nowhere to go; or pinned meanwhile by a demotion the tree ordered
      // in a lower tier to make room.
      bool const skippable = (!copies_elsewhere(p, t) && (has_extension(k) || p.locked())) || p.pinned();
      if (!skippable && last < newest_evicted) {
        std::string d;
        for (auto const& [kk, ll] : before) {
          d += "[";
          for (auto x : kk) {
            d += std::to_string(x);
          }
          d += " last " + std::to_string(ll) + (evicted.count(kk) ? " evicted" : "") + "] ";
        }
        for (auto const& kk : evicted) {
          d += "{";
          for (auto x : kk) {
            d += std::to_string(x);
          }
          d += "}";
        }
        INFO("candidates before: " << d);
        REQUIRE(last >= newest_evicted);
      }
    }
    // A short eviction leaves only candidates whose only copy had nowhere to go.
    if (r.pages < want) {
      for (auto const& [k, p] : pages_) {
        if (candidate(k, p, t)) { REQUIRE((!copies_elsewhere(p, t) && (has_extension(k) || p.locked()))); }
      }
    }
  }

  void complete_or_cancel(bool complete)
  {
    if (transfers_.empty()) { return; }
    auto it = transfers_.begin();
    std::advance(it, std::ptrdiff_t(rng_() % transfers_.size()));
    transfer_id const id = it->first;
    mtransfer const m = it->second;
    transfers_.erase(it);
    std::vector<std::int64_t> expect_freed;
    std::vector<std::int64_t> returned_destinations;
    for (auto const& k : m.pages) {
      mpage& p = pages_.at(k);
      --p.pins[std::size_t(m.from)];
      --p.pins[std::size_t(m.to)];
      if (complete) {
        p.res[std::size_t(m.to)] = true;
        if (m.demotion && p.locks[std::size_t(m.from)] == 0) { p.drop_pending[std::size_t(m.from)] = true; }
      } else {
        if (m.to == tier::device) { returned_destinations.push_back(p.id[0]); }
        if (m.to == tier::remote) {
          p.key = -1;
        } else {
          p.id[std::size_t(m.to)] = -1;
        }
      }
      // A demoted source goes once no pending transfer reads it any more (the docs' promise: a
      // pending transfer pins its source).
      if (p.drop_pending[std::size_t(m.from)] && p.pins[std::size_t(m.from)] == 0) {
        p.drop_pending[std::size_t(m.from)] = false;
        if (m.from == tier::device) { expect_freed.push_back(p.id[0]); }
        apply_drop(m.from, k);
      }
    }
    std::vector<std::int64_t> freed = complete ? tree_->complete(id) : tree_->cancel(id);
    ++(complete ? cover.completes : cover.cancels);
    std::sort(freed.begin(), freed.end());
    std::sort(expect_freed.begin(), expect_freed.end());
    REQUIRE(freed == expect_freed);
    give_back(freed);
    give_back(returned_destinations);
    remove_empty();
  }
  void do_complete() { complete_or_cancel(true); }
  void do_cancel() { complete_or_cancel(false); }

  void do_load()
  {
    if (!last_match_ || last_match_->second.empty()) { return; }
    auto const& [node, path] = *last_match_;
    bool alive = true;
    for (auto const& k : path) {
      alive = alive && pages_.count(k) != 0 && pages_.at(k).cached();
    }
    if (!alive) { return; }
    std::int64_t expected = 0;
    for (auto const& k : path) {
      mpage const& p = pages_.at(k);
      expected += !p.res[0] && p.pins[0] == 0 && p.cached();
    }
    std::int64_t got = 0;
    try {
      got = tree_->pages_to_load(node);
    } catch (invalid_argument const&) {
      return;  // the node was split away or evicted since; the model has no node identities
    }
    REQUIRE(got == expected);
    auto dev = take_device(std::size_t(expected));
    if (!dev) { return; }
    auto const orders = tree_->load(node, *dev);
    cover.loads += std::int64_t(orders.size());
    std::size_t at = 0;
    for (auto const& o : orders) {
      for (std::size_t i = 0; i < o.from_pages.size(); ++i, ++at) {
        mpage const& p = pages_.at(*page_with(o.from, o.from_pages[i]));
        std::size_t fastest = 1;
        while (!p.res[fastest]) {
          ++fastest;
        }
        REQUIRE(std::size_t(o.from) == fastest);
        REQUIRE(o.to_pages[i] == (*dev)[at]);
      }
      register_order(o);
    }
    REQUIRE(at == dev->size());
  }

  void do_bad_input()
  {
    auto const before = tree_->stats();
    auto const nodes = tree_->node_count();
    int const which = static_cast<int>(rng_() % 5);
    bool thrown = false;
    try {
      switch (which) {
        case 0:
          tree_->commit(request_id{next_request_ + 1000}, std::vector<std::int64_t>{});
          break;
        case 1:
          tree_->unlock(tree_->root(), tier::device);
          tree_->unlock(node_ref{0, 1}, tier::device);
          break;
        case 2:
          (void)tree_->insert(tokens_t{1, 1}, std::vector<std::int64_t>{cfg_.capacity[0]});
          break;
        case 3:
          (void)tree_->complete(transfer_id{1'000'000'000});
          break;
        default:
          (void)tree_->evict(tier::device, -1);
          break;
      }
    } catch (invalid_argument const&) {
      thrown = true;
    }
    if (which != 1) { REQUIRE(thrown); }  // unlocking the root is a no-op; the stale ref then throws
    REQUIRE(tree_->node_count() == nodes);
    REQUIRE(tree_->stats().resident_pages == before.resident_pages);
  }

  std::mt19937_64 rng_;
  std::uint64_t seed_;
  int step_{};
  hiradix_config cfg_;
  std::optional<hiradix_tree> tree_;
  std::map<tokens_t, mpage> pages_;
  std::map<transfer_id, mtransfer> transfers_;
  std::map<request_id, std::vector<tokens_t>> requests_;
  std::vector<lock_record> locks_;
  std::set<std::int64_t> free_device_;
  std::optional<std::pair<node_ref, std::vector<tokens_t>>> last_match_;
  std::uint64_t clock_{};
  std::uint64_t next_request_{1};
  std::vector<tokens_t> history_;
  std::deque<tokens_t> watched_;  // a deque: the tokens stay where a memo saw them
  std::vector<probe_memo> memos_;
};

}  // namespace

TEST_CASE("hiradix_tree agrees with a reference model on random operation sequences", "[cpu][hiradix][model]")
{
  long sequences = 100000;
  if (char const* env = std::getenv("STRATA_HIRADIX_SEQUENCES")) { sequences = std::atol(env); }
  long first = 0;
  if (char const* env = std::getenv("STRATA_HIRADIX_FIRST")) { first = std::atol(env); }
  for (long s = first; s < first + sequences; ++s) {
    model_test m{static_cast<std::uint64_t>(s) * 7919u + 17u};
    m.run(24);
  }
  INFO("new pages " << cover.new_pages << ", matched tokens " << cover.matched_tokens << ", delay hits "
                    << cover.delay_hits << ", locks " << cover.locks << ", commits " << cover.commits << ", aborts "
                    << cover.aborts << ", evicted pages " << cover.evicted << ", demotions " << cover.demotions
                    << ", completed " << cover.completes << ", cancelled " << cover.cancels << ", loads " << cover.loads
                    << ", internal evictions " << cover.internal_evictions << ", remote evictions " << cover.remote
                    << ", record copies refused " << cover.records_refused << ", probes answered by a memo "
                    << cover.memo_reuses << ", walked " << cover.memo_walks << ", matched along a memo "
                    << cover.memo_matches);
  if (sequences >= 10000) {  // every kind of step happened many times
    for (long c :
         {cover.new_pages, cover.matched_tokens, cover.delay_hits, cover.locks, cover.commits, cover.aborts,
          cover.evicted, cover.demotions, cover.completes, cover.cancels, cover.loads, cover.internal_evictions,
          cover.remote, cover.records_refused, cover.memo_reuses, cover.memo_walks, cover.memo_matches}) {
      CHECK(c > sequences / 200);
    }
  }
}
