// SPDX-License-Identifier: Apache-2.0
// HiRadixTree: deterministic scenarios, bad input, and a model-based random test against a plain
// map of cached page prefixes.
#include "../support/catch.hpp"

#include <strata/index/hiradix_tree.hpp>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

using namespace strata;

namespace {

using tokens_t = std::vector<std::int32_t>;

hiradix_config small_config(write_policy policy = write_policy::write_through_selective)
{
  hiradix_config c;
  c.page_tokens = 4;
  c.page_bytes = 1024;
  c.capacity = {64, 32, 16, 0};
  c.backup_policy = policy;
  c.selective_hits = 2;
  c.delay_hit_tokens = 8;
  return c;
}

tokens_t seq(std::int32_t start, std::int64_t n)
{
  tokens_t t(static_cast<std::size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

std::vector<std::int64_t> ids(std::int64_t first, std::int64_t n)
{
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

/// What must not change when a call is rejected.
struct fingerprint {
  hiradix_stats stats;
  std::size_t nodes;
  std::size_t transfers;
  std::array<std::int64_t, tier_count> evictable;
  bool operator==(fingerprint const& o) const
  {
    return stats.resident_pages == o.stats.resident_pages && stats.matched_tokens == o.stats.matched_tokens &&
           stats.evicted_pages == o.stats.evicted_pages && nodes == o.nodes && transfers == o.transfers &&
           evictable == o.evictable;
  }
};
fingerprint print_of(hiradix_tree const& t)
{
  fingerprint f{t.stats(), t.node_count(), t.pending_transfers(), {}};
  for (std::size_t i = 0; i < tier_count; ++i) {
    f.evictable[i] = t.has_tier(tier(i)) ? t.evictable_pages(tier(i)) : 0;
  }
  return f;
}

}  // namespace

TEST_CASE("match finds the longest cached prefix of whole pages and splits nodes", "[cpu][hiradix]")
{
  hiradix_tree t{small_config()};
  tokens_t const doc = seq(100, 18);  // 4 whole pages + 2 tokens (not cached)
  auto const ins = t.insert(doc, ids(0, 4));
  CHECK(ins.new_pages == 4);
  CHECK(ins.unused_device_pages.empty());
  CHECK(t.path_length(ins.node) == 4);

  auto m = t.match(doc);
  CHECK(m.tokens == 16);
  CHECK(m.tier_tokens[0] == 16);
  CHECK(m.device_prefix_tokens == 16);
  CHECK(t.path_pages(m.node, tier::device) == ids(0, 4));

  tokens_t branch = seq(100, 10);  // 2 whole pages shared, then diverges
  branch.push_back(7);
  branch.push_back(7);
  branch.resize(16, 9);
  m = t.match(branch);
  CHECK(m.tokens == 8);  // the third page differs
  CHECK(t.path_length(m.node) == 2);
  auto const b = t.insert(branch, ids(10, 4));
  CHECK(b.new_pages == 2);
  CHECK(b.unused_device_pages == std::vector<std::int64_t>{10, 11});
  CHECK(t.node_count() == 4);  // root, shared 2 pages, two branches of 2
  t.check_invariants();
  CHECK(t.match(seq(500, 12)).tokens == 0);
  CHECK(t.match(seq(100, 3)).tokens == 0);  // shorter than a page
  auto const s = t.stats();
  CHECK(s.resident_pages[0] == 6);
  CHECK(s.resident_bytes[0] == 6 * 1024);
}

TEST_CASE("insert takes the request's page table: the tree's own pages are kept", "[cpu][hiradix]")
{
  hiradix_tree t{small_config()};
  tokens_t doc = seq(1, 16);
  (void)t.insert(doc, ids(0, 4));
  doc.resize(24, 77);  // two more pages, computed into pages 8 and 9
  auto const r = t.insert(doc, {{0, 1, 2, 3, 8, 9}});
  CHECK(r.new_pages == 2);
  CHECK(r.unused_device_pages.empty());
  auto const dup = t.insert(doc, {{0, 1, 2, 3, 10, 11}});  // pages 10, 11 duplicate 8, 9
  CHECK(dup.new_pages == 0);
  CHECK(dup.unused_device_pages == std::vector<std::int64_t>{10, 11});
  CHECK(t.path_pages(r.node, tier::device) == std::vector<std::int64_t>{0, 1, 2, 3, 8, 9});
  t.check_invariants();
}

TEST_CASE("delay hits: a request arriving while another's prefix is queued, in flight, committed, aborted",
          "[cpu][hiradix]")
{
  tokens_t const shared = seq(1, 40);  // 10 pages
  for (int scenario = 0; scenario < 4; ++scenario) {
    hiradix_tree t{small_config()};
    request_id const r1{1};
    CHECK(t.mark_in_queue(r1, shared) == 40);
    CHECK(t.transient_pages(r1) == 10);
    if (scenario >= 1) { t.mark_in_flight(r1); }
    if (scenario == 2) { t.commit(r1, ids(0, 10)); }
    if (scenario == 3) { t.abort(r1); }
    tokens_t request2 = shared;
    request2.insert(request2.end(), {5, 5, 5, 5});
    auto const m = t.match(request2);
    INFO("scenario " << scenario);
    switch (scenario) {
      case 0:
      case 1:
        CHECK(m.tokens == 0);
        CHECK(m.delay_hit);
        CHECK(m.transient_tokens == 40);
        CHECK(m.transient_owner == r1);
        CHECK(m.transient == (scenario == 0 ? transient_state::in_queue : transient_state::in_flight));
        CHECK(t.mark_in_queue(request_id{2}, request2) == 0);  // request 1 computes the shared prefix
        break;
      case 2:
        CHECK(m.tokens == 40);  // a hit: nothing to recompute
        CHECK_FALSE(m.delay_hit);
        CHECK(t.mark_in_queue(request_id{2}, request2) == 4);  // only its own page
        break;
      case 3:
        CHECK(m.tokens == 0);
        CHECK_FALSE(m.delay_hit);
        CHECK(m.transient_tokens == 0);
        CHECK(t.mark_in_queue(request_id{2}, request2) == 44);  // it computes everything itself
        break;
    }
    t.check_invariants();
    CHECK(t.stats().delay_hits == (scenario < 2 ? 1 : 0));
  }
}

TEST_CASE("a transient match shorter than the threshold is not a delay hit", "[cpu][hiradix]")
{
  hiradix_tree t{small_config()};  // threshold 8 tokens = 2 pages
  t.mark_in_queue(request_id{1}, seq(1, 40));
  tokens_t other = seq(1, 4);
  other.resize(12, 0);
  auto const m = t.match(other);
  CHECK(m.transient_tokens == 4);
  CHECK_FALSE(m.delay_hit);
}

TEST_CASE("write policies: through, selective after k hits, back on eviction", "[cpu][hiradix]")
{
  tokens_t const doc = seq(1, 16);
  {
    hiradix_tree t{small_config(write_policy::write_through)};
    (void)t.insert(doc, ids(0, 4));
    auto const copies = t.take_copies();
    REQUIRE(copies.size() == 1);
    CHECK(copies[0].from == tier::device);
    CHECK(copies[0].to == tier::host);
    CHECK(copies[0].from_pages == ids(0, 4));
    CHECK_FALSE(t.resident(copies[0].node, tier::host));  // not until the copy completes
    CHECK(t.evictable_pages(tier::device) == 0);          // pinned by the copy
    CHECK(t.complete(copies[0].id).empty());
    CHECK(t.resident(copies[0].node, tier::host));
    // Evicting from the device now just drops the device copy.
    auto const e = t.evict(tier::device, 4);
    CHECK(e.freed == ids(0, 4));
    CHECK(e.demotions.empty());
    auto const m = t.match(doc);
    CHECK(m.tokens == 16);
    CHECK(m.tier_tokens[0] == 0);
    CHECK(m.tier_tokens[1] == 16);
    t.check_invariants();
  }
  {
    hiradix_tree t{small_config(write_policy::write_through_selective)};
    (void)t.insert(doc, ids(0, 4));
    CHECK(t.take_copies().empty());
    t.match(doc);
    CHECK(t.take_copies().empty());  // 1 hit
    t.match(doc);
    auto const copies = t.take_copies();  // 2 hits: worth keeping
    REQUIRE(copies.size() == 1);
    CHECK(copies[0].to == tier::host);
    (void)t.cancel(copies[0].id);
    CHECK(t.free_slots(tier::host) == 32);
    t.check_invariants();
  }
  {
    hiradix_tree t{small_config(write_policy::write_back)};
    (void)t.insert(doc, ids(0, 4));
    CHECK(t.take_copies().empty());
    auto const e = t.evict(tier::device, 1);
    CHECK(e.pages == 4);
    CHECK(e.freed.empty());  // not before the copy lands
    REQUIRE(e.demotions.size() == 1);
    CHECK(e.demotions[0].demotion);
    CHECK(t.complete(e.demotions[0].id) == ids(0, 4));  // now the device pages are free
    auto const m = t.match(doc);
    CHECK(m.tier_tokens == std::array<std::int64_t, tier_count>{0, 16, 0, 0});
    t.check_invariants();
  }
}

TEST_CASE("eviction takes least recently used leaves and spares locked, transient and pinned nodes", "[cpu][hiradix]")
{
  hiradix_tree t{small_config(write_policy::write_back)};
  tokens_t const a = seq(1000, 8), b = seq(2000, 8), c = seq(3000, 8);
  (void)t.insert(a, ids(0, 2));
  (void)t.insert(b, ids(2, 2));
  (void)t.insert(c, ids(4, 2));
  t.match(a);  // a is now the most recent; b the least
  auto const mc = t.match(c);
  t.lock(mc.node, tier::device);  // c in use
  auto e = t.evict(tier::device, 2);
  REQUIRE(e.demotions.size() == 1);
  CHECK(e.demotions[0].from_pages == ids(2, 2));  // b
  (void)t.complete(e.demotions[0].id);
  e = t.evict(tier::device, 100);  // a goes; c is locked
  REQUIRE(e.demotions.size() == 1);
  CHECK(e.demotions[0].from_pages == ids(0, 2));
  CHECK(t.evictable_pages(tier::device) == 0);  // a pinned by its copy, c locked
  t.unlock(mc.node, tier::device);
  CHECK(t.evictable_pages(tier::device) == 2);
  t.mark_in_queue(request_id{9}, seq(5000, 8));
  CHECK(t.evictable_pages(tier::device) == 2);  // the transient node is never a candidate
  t.check_invariants();
}

TEST_CASE("loads from lower tiers are ordered and complete onto the device", "[cpu][hiradix]")
{
  hiradix_tree t{small_config(write_policy::write_back)};
  tokens_t const doc = seq(7, 16);
  (void)t.insert(doc, ids(0, 4));
  auto const e = t.evict(tier::device, 4);
  (void)t.complete(e.demotions.at(0).id);
  auto const m = t.match(doc);
  CHECK(t.pages_to_load(m.node) == 4);
  auto const orders = t.load(m.node, ids(20, 4));
  REQUIRE(orders.size() == 1);
  CHECK(orders[0].from == tier::host);
  CHECK(orders[0].to_pages == ids(20, 4));
  CHECK(t.pages_to_load(m.node) == 0);  // on its way
  (void)t.complete(orders[0].id);
  CHECK(t.match(doc).device_prefix_tokens == 16);
  t.check_invariants();
}

TEST_CASE("bad input is rejected and leaves the tree unchanged", "[cpu][hiradix]")
{
  hiradix_tree t{small_config()};
  tokens_t const doc = seq(1, 16);
  auto const ins = t.insert(doc, ids(0, 4));
  t.mark_in_queue(request_id{1}, seq(100, 8));
  auto const before = print_of(t);
  STRATA_REQUIRE_THROWS(invalid_argument, "3 device pages for 4 whole pages", t.insert(seq(50, 16), ids(10, 3)));
  STRATA_REQUIRE_THROWS(invalid_argument, "device page 64 out of range [0, 64)", t.insert(seq(50, 8), {{63, 64}}));
  STRATA_REQUIRE_THROWS(invalid_argument, "device page 12 given twice", t.insert(seq(50, 8), {{12, 12}}));
  STRATA_REQUIRE_THROWS(invalid_argument, "device page 2 is already owned", t.insert(seq(50, 8), {{40, 2}}));
  STRATA_REQUIRE_THROWS(invalid_argument, "device page 1 is already owned", t.insert(doc, {{1, 0, 2, 3}}));
  STRATA_REQUIRE_THROWS(invalid_argument, "request 7 has no transient pages", t.commit(request_id{7}, ids(10, 2)));
  STRATA_REQUIRE_THROWS(invalid_argument, "request 7 has no transient pages", t.abort(request_id{7}));
  STRATA_REQUIRE_THROWS(invalid_argument, "request 7 has no transient pages", t.mark_in_flight(request_id{7}));
  STRATA_REQUIRE_THROWS(invalid_argument, "has 2 transient pages, got 3", t.commit(request_id{1}, ids(10, 3)));
  STRATA_REQUIRE_THROWS(invalid_argument, "already has transient pages", t.mark_in_queue(request_id{1}, seq(9, 8)));
  STRATA_REQUIRE_THROWS(invalid_argument, "is not locked in the host tier", t.unlock(ins.node, tier::host));
  STRATA_REQUIRE_THROWS(invalid_argument, "does not exist", t.lock(node_ref{999, 0}, tier::device));
  STRATA_REQUIRE_THROWS(invalid_argument, "pages must not be negative", t.evict(tier::device, -1));
  STRATA_REQUIRE_THROWS(invalid_argument, "no remote tier", t.evict(tier::remote, 1));
  STRATA_REQUIRE_THROWS(invalid_argument, "unknown transfer 42", t.complete(42));
  STRATA_REQUIRE_THROWS(invalid_argument, "unknown transfer 42", t.cancel(42));
  STRATA_REQUIRE_THROWS(invalid_argument, "0 pages to load, got 1", t.load(ins.node, ids(30, 1)));
  CHECK(print_of(t) == before);
  t.check_invariants();

  STRATA_REQUIRE_THROWS(invalid_argument, "page_tokens must be positive", hiradix_tree({.page_tokens = 0}));
  STRATA_REQUIRE_THROWS(invalid_argument, "device tier needs a positive capacity", hiradix_tree(hiradix_config{}));
  hiradix_config neg = small_config();
  neg.capacity[1] = -1;
  STRATA_REQUIRE_THROWS(invalid_argument, "capacity of the host tier must not be negative", hiradix_tree{neg});
  neg = small_config();
  neg.selective_hits = 0;
  STRATA_REQUIRE_THROWS(invalid_argument, "selective_hits must be positive", hiradix_tree{neg});
  // A node removed by eviction is stale afterwards.
  hiradix_tree u{small_config(write_policy::write_through_selective)};
  auto const r = u.insert(seq(1, 8), ids(0, 2));
  (void)u.evict(tier::device, 2);
  STRATA_REQUIRE_THROWS(invalid_argument, "does not exist", u.lock(r.node, tier::device));
}

namespace {

/// Issue 9, item 12's setup: prefix `a` on the host only, its demotion host -> file and its load
/// host -> device both pending.
struct demotion_and_load {
  hiradix_tree t{[] {
    hiradix_config c;
    c.page_tokens = 1;
    c.capacity = {16, 2, 8, 0};
    c.backup_policy = write_policy::write_through;
    return c;
  }()};
  tokens_t const a{1, 2};
  eviction_result demotion;
  std::vector<copy_order> load;

  demotion_and_load()
  {
    (void)t.insert(a, std::vector<std::int64_t>{0, 1});
    for (auto& o : t.take_copies()) {
      (void)t.complete(o.id);
    }  // a: device + host
    (void)t.evict(tier::device, 2);     // a: host only
    demotion = t.evict(tier::host, 2);  // demotion host -> file, pending
    REQUIRE(demotion.demotions.size() == 1);
    load = t.load(t.match(a).node, std::vector<std::int64_t>{5, 6});  // load host -> device, pending
    REQUIRE(load.size() == 1);
    REQUIRE(load[0].from == tier::host);
  }
};

}  // namespace

TEST_CASE("hiradix_tree: a completed demotion does not free the source a pending load reads", "[cpu][hiradix]")
{
  // Issue 9, item 12: the host slots of `a` were freed while its load from the host was pending,
  // and the next backup was handed the same slots.
  demotion_and_load f;
  hiradix_tree& t = f.t;
  std::vector<std::int64_t> const read = f.load[0].from_pages;
  (void)t.complete(f.demotion.demotions[0].id);  // the host copy must stay while the load reads it
  t.check_invariants();
  CHECK(t.free_slots(tier::host) == 0);
  // A new prefix's backup must not be handed the slots the load reads.
  (void)t.insert(tokens_t{7, 8}, std::vector<std::int64_t>{9, 10});
  for (auto const& o : t.take_copies()) {
    for (auto p : o.to_pages) {
      CHECK(std::find(read.begin(), read.end(), p) == read.end());
    }
  }
  t.check_invariants();
  (void)t.complete(f.load[0].id);  // now the demoted host copy goes
  t.check_invariants();
  auto const m = t.probe(f.a);
  CHECK(m.tokens == 2);
  CHECK(m.tier_tokens[0] == 2);
  CHECK(m.tier_tokens[1] == 0);
  CHECK(m.tier_tokens[2] == 2);
}

TEST_CASE("hiradix_tree: a cancelled load releases a source its completed demotion left", "[cpu][hiradix]")
{
  demotion_and_load f;
  hiradix_tree& t = f.t;
  (void)t.complete(f.demotion.demotions[0].id);
  CHECK(t.free_slots(tier::host) == 0);
  CHECK(t.cancel(f.load[0].id).empty());  // host slots, not device pages, come back
  t.check_invariants();
  CHECK(t.free_slots(tier::host) == 2);
  auto const m = t.probe(f.a);
  CHECK(m.tier_tokens[1] == 0);
  CHECK(m.tier_tokens[2] == 2);
}

TEST_CASE("hiradix_tree: write-back eviction never drops a newer node to keep an older one", "[cpu][hiradix]")
{
  // Issue 9, item 13: evict(device, 2) dropped x (used last) from both tiers and kept y.
  hiradix_config c;
  c.page_tokens = 1;
  c.capacity = {8, 1, 0, 0};
  c.backup_policy = write_policy::write_back;
  hiradix_tree t(c);
  tokens_t const x{1}, y{2};
  (void)t.insert(x, std::vector<std::int64_t>{0});
  auto e = t.evict(tier::device, 1);  // x -> host
  REQUIRE(e.demotions.size() == 1);
  (void)t.complete(e.demotions[0].id);
  (void)t.insert(y, std::vector<std::int64_t>{1});
  (void)t.insert(x, std::vector<std::int64_t>{2});  // x again: device + host, used after y
  auto r = t.evict(tier::device, 2);
  for (auto& o : r.demotions) {
    (void)t.complete(o.id);
  }
  for (auto& o : t.take_copies()) {
    (void)t.complete(o.id);
  }
  (void)t.take_internal_evictions();
  t.check_invariants();
  CHECK(t.peek(x) == 1);
  CHECK(t.peek(y) == 0);
}

TEST_CASE("hiradix_tree: a demotion that completes while its source is locked keeps the source", "[cpu][hiradix]")
{
  // A request locked the pages (it reads them) after the eviction ordered their demotion.
  hiradix_config c;
  c.page_tokens = 1;
  c.capacity = {8, 4, 0, 0};
  c.backup_policy = write_policy::write_back;
  hiradix_tree t(c);
  tokens_t const x{1, 2};
  (void)t.insert(x, std::vector<std::int64_t>{0, 1});
  auto e = t.evict(tier::device, 2);
  REQUIRE(e.demotions.size() == 1);
  auto const m = t.match(x);
  REQUIRE(m.device_prefix_tokens == 2);
  t.lock(m.node, tier::device);
  CHECK(t.complete(e.demotions[0].id).empty());  // no device page is freed under the lock
  t.check_invariants();
  CHECK(t.path_pages(m.node, tier::device) == std::vector<std::int64_t>{0, 1});
  CHECK(t.probe(x).tier_tokens[1] == 2);
  t.unlock(m.node, tier::device);
  t.check_invariants();
}

namespace {
/// A tree with host and file tiers, and `t` cached on the file tier only (inserted, backed up,
/// evicted from the device, demoted from the host).
hiradix_tree file_only(tokens_t const& t, write_policy file_policy = write_policy::write_back)
{
  hiradix_config c = small_config(write_policy::write_through);
  c.file_backup_policy = file_policy;
  hiradix_tree tree{c};
  std::int64_t const pages = std::int64_t(t.size()) / c.page_tokens;
  auto r = tree.insert(t, ids(0, pages));
  REQUIRE(r.unused_device_pages.empty());
  for (auto& o : tree.take_copies()) {
    (void)tree.complete(o.id);
  }
  (void)tree.evict(tier::device, pages);
  for (auto& d : tree.evict(tier::host, 32).demotions) {
    (void)tree.complete(d.id);
  }
  for (auto& o : tree.take_copies()) {
    (void)tree.complete(o.id);
  }
  REQUIRE(tree.probe(t).fastest_tokens[2] == pages * c.page_tokens);
  return tree;
}
}  // namespace

TEST_CASE("hiradix_tree: orders to a record store carry each page's key, its parent's, and its ids", "[cpu][hiradix]")
{
  tokens_t const t = seq(100, 12);  // 3 pages
  hiradix_tree tree{small_config(write_policy::write_through)};
  (void)tree.insert(seq(100, 4), ids(0, 1));  // a node of one page, then a child of two
  auto r = tree.insert(t, ids(0, 3));
  for (auto& o : tree.take_copies()) {  // device -> host: keys, no ids
    REQUIRE(o.keys.size() == o.from_pages.size());
    CHECK(o.ids.empty());
    (void)tree.complete(o.id);
  }
  (void)tree.evict(tier::device, 3);
  std::vector<copy_order> d;
  for (int round = 0; round < 4; ++round) {  // a parent leaves the host once its child has
    for (auto& o : tree.evict(tier::host, 32).demotions) {
      (void)tree.complete(o.id);
      d.push_back(std::move(o));
    }
  }
  REQUIRE(d.size() == 2);
  std::uint64_t parent = 0;
  std::vector<std::int32_t> all;
  std::sort(d.begin(), d.end(), [](auto const& a, auto const& b) { return a.keys.size() < b.keys.size(); });
  for (auto const& o : d) {  // root page first, then its child's two
    CHECK(o.to == tier::file);
    CHECK(o.ids_per_page == 4);
    REQUIRE(o.ids.size() == o.keys.size() * 4);
    CHECK(o.parent_key == parent);
    for (std::size_t k = 0; k < o.keys.size(); ++k) {
      std::span<std::int32_t const> const page{o.ids.data() + k * 4, 4};
      CHECK(tree.page_key(page, parent) == o.keys[k]);  // the chain the records keep
      parent = o.keys[k];
    }
    all.insert(all.end(), o.ids.begin(), o.ids.end());
  }
  CHECK(all == t);
  CHECK_THROWS_AS(tree.page_key(std::span<std::int32_t const>{t.data(), 3}, 0), invalid_argument);
  (void)r;
}

TEST_CASE("hiradix_tree: adopt learns file-tier pages kept across a restart", "[cpu][hiradix]")
{
  hiradix_config c = small_config(write_policy::write_through);
  hiradix_tree tree{c};
  tokens_t const a = seq(0, 16), b = [] {
    tokens_t x = seq(0, 8);
    tokens_t y = seq(900, 8);
    x.insert(x.end(), y.begin(), y.end());
    return x;
  }();
  auto r = tree.adopt(tier::file, a, std::vector<std::int64_t>{3, 4, 5, 6});
  CHECK(r.pages == 4);
  // A second prefix sharing two pages: the shared ones keep their slots (the given 9, 10 stay free).
  r = tree.adopt(tier::file, b, std::vector<std::int64_t>{9, 10, 11, 12});
  CHECK(r.pages == 2);
  tree.check_invariants();
  CHECK(tree.probe(a).fastest_tokens[2] == 16);
  CHECK(tree.probe(b).fastest_tokens[2] == 16);
  CHECK(tree.path_pages(tree.probe(b).node, tier::file) == std::vector<std::int64_t>{3, 4, 11, 12});
  CHECK(tree.free_slots(tier::file) == 16 - 6);
  // The shared pages may name the slots the tree holds for them (as records kept across a
  // restart do); a page it takes may not name a slot in use.
  tokens_t third = seq(0, 8);
  for (std::int32_t i = 0; i < 8; ++i) {
    third.push_back(800 + i);
  }
  CHECK_THROWS_AS(tree.adopt(tier::file, third, std::vector<std::int64_t>{3, 4, 13, 5}), invalid_argument);
  CHECK(tree.free_slots(tier::file) == 16 - 6);
  CHECK(tree.adopt(tier::file, third, std::vector<std::int64_t>{3, 4, 13, 14}).pages == 2);
  CHECK(tree.free_slots(tier::file) == 16 - 8);
  // Bad input changes nothing: a slot in use, repeated, out of range, the wrong count, the device tier.
  CHECK_THROWS_AS(tree.adopt(tier::file, seq(500, 8), std::vector<std::int64_t>{3, 7}), invalid_argument);
  CHECK_THROWS_AS(tree.adopt(tier::file, seq(500, 8), std::vector<std::int64_t>{7, 7}), invalid_argument);
  CHECK_THROWS_AS(tree.adopt(tier::file, seq(500, 8), std::vector<std::int64_t>{7, 16}), invalid_argument);
  CHECK_THROWS_AS(tree.adopt(tier::file, seq(500, 8), std::vector<std::int64_t>{7}), invalid_argument);
  CHECK_THROWS_AS(tree.adopt(tier::device, seq(500, 8), std::vector<std::int64_t>{7, 8}), invalid_argument);
  CHECK(tree.free_slots(tier::file) == 16 - 8);
  CHECK(tree.peek(seq(500, 8)) == 0);
  // The adopted pages load like any other: file -> device, and may be evicted to make room.
  auto loads = tree.load(tree.match(a).node, ids(0, 4));
  REQUIRE(loads.size() == 2);  // a's node was split where b leaves it
  for (auto const& o : loads) {
    CHECK(o.from == tier::file);
    CHECK(o.keys.size() == 2);
    (void)tree.complete(o.id);
  }
  tree.check_invariants();
}

TEST_CASE("hiradix_tree: adopt learns pages a shared remote store holds, up to the remote capacity", "[cpu][hiradix]")
{
  hiradix_config c = small_config(write_policy::write_through);
  c.capacity = {64, 32, 0, 6};
  hiradix_tree tree{c};
  tokens_t const a = seq(0, 16);
  CHECK_THROWS_AS(tree.adopt(tier::remote, a, std::vector<std::int64_t>{1, 2, 3, 4}), invalid_argument);
  CHECK(tree.adopt(tier::remote, a, {}).pages == 4);
  CHECK(tree.probe(a).fastest_tokens[3] == 16);
  // A longer prefix: the 4 shared pages are held already, 2 more fit, the rest does not.
  tokens_t const b = seq(0, 32);
  CHECK(tree.adopt(tier::remote, b, {}).pages == 0);  // 4 new pages past the capacity's 2: none taken
  tokens_t const c2 = seq(0, 24);
  CHECK(tree.adopt(tier::remote, c2, {}).pages == 2);
  CHECK(tree.probe(b).fastest_tokens[3] == 24);
  tree.check_invariants();
  // A transient node stops the walk: nothing hangs below one.
  tokens_t const d = seq(500, 8);
  (void)tree.mark_in_queue(request_id{1}, d);
  CHECK(tree.adopt(tier::remote, d, {}).pages == 0);
  tree.abort(request_id{1});
  // Remote pages load like any other record tier's: remote -> device.
  auto loads = tree.load(tree.match(a).node, ids(0, 4));
  REQUIRE(!loads.empty());
  for (auto const& o : loads) {
    CHECK(o.from == tier::remote);
    (void)tree.complete(o.id);
  }
  tree.check_invariants();
}

TEST_CASE("hiradix_tree: a page landing on the host is copied to the remote tier (write-through)", "[cpu][hiradix]")
{
  hiradix_config c = small_config(write_policy::write_through);
  c.capacity = {64, 32, 0, 64};
  hiradix_tree tree{c};
  tokens_t const t = seq(7, 12);
  (void)tree.insert(t, ids(0, 3));
  std::vector<copy_order> backups = tree.take_copies();
  REQUIRE(backups.size() == 1);
  CHECK(backups[0].to == tier::host);
  CHECK(tree.take_copies().empty());
  (void)tree.complete(backups[0].id);  // on the host: the remote copy follows
  auto remote = tree.take_copies();
  REQUIRE(remote.size() == 1);
  CHECK(remote[0].from == tier::host);
  CHECK(remote[0].to == tier::remote);
  CHECK(remote[0].ids == t);  // the store keeps the pages' ids
  (void)tree.complete(remote[0].id);
  CHECK(tree.probe(t).tier_tokens[3] == 12);
  tree.check_invariants();
  // write_back: nothing goes to the remote tier on landing.
  c.remote_backup_policy = write_policy::write_back;
  hiradix_tree quiet{c};
  (void)quiet.insert(t, ids(0, 3));
  auto b = quiet.take_copies();
  REQUIRE(b.size() == 1);
  (void)quiet.complete(b[0].id);
  CHECK(quiet.take_copies().empty());
}

TEST_CASE("hiradix_tree: prefetch copies a file-only prefix up to the host; loads read the host once it lands",
          "[cpu][hiradix]")
{
  tokens_t const t = seq(40, 12);
  hiradix_tree tree = file_only(t);
  auto pf = tree.prefetch(tree.probe(t).node);
  REQUIRE(pf.size() == 1);
  CHECK(pf[0].from == tier::file);
  CHECK(pf[0].to == tier::host);
  CHECK(pf[0].ids == t);
  CHECK(tree.prefetch(tree.probe(t).node).empty());  // on its way already
  // Before it lands a load still reads the file tier (best effort); after, the host.
  auto early = tree.load(tree.match(t).node, ids(0, 3));
  REQUIRE(early.size() == 1);
  CHECK(early[0].from == tier::file);
  (void)tree.cancel(early[0].id);
  (void)tree.complete(pf[0].id);
  CHECK(tree.probe(t).fastest_tokens[1] == 12);
  auto late = tree.load(tree.match(t).node, ids(0, 3));
  REQUIRE(late.size() == 1);
  CHECK(late[0].from == tier::host);
  (void)tree.complete(late[0].id);
  tree.check_invariants();
  // Nothing to do once the prefix is on the device, or without a host tier.
  CHECK(tree.prefetch(tree.probe(t).node).empty());
}

TEST_CASE("hiradix_tree: prefetch makes room from older host pages only, never from the path itself", "[cpu][hiradix]")
{
  hiradix_config c = small_config(write_policy::write_through);
  c.capacity = {64, 4, 16, 0};  // a host tier of 4 pages
  hiradix_tree tree{c};
  tokens_t const doc = seq(0, 16);  // 4 pages: 2 on the host, 2 below
  (void)tree.insert(doc, ids(0, 4));
  for (auto& o : tree.take_copies()) {
    (void)tree.complete(o.id);
  }
  (void)tree.evict(tier::device, 4);
  (void)tree.match(seq(0, 8));                           // split: [0, 2) and [2, 4)
  for (auto& d : tree.evict(tier::host, 2).demotions) {  // the leaf half goes to the file tier
    (void)tree.complete(d.id);
  }
  tokens_t const other = seq(700, 8);  // 2 more host pages, older than the prefetch
  (void)tree.insert(other, ids(10, 2));
  for (auto& o : tree.take_copies()) {
    (void)tree.complete(o.id);
  }
  (void)tree.evict(tier::device, 64);
  REQUIRE(tree.probe(doc).fastest_tokens[1] == 8);
  REQUIRE(tree.probe(doc).fastest_tokens[2] == 8);
  // The host is full: the first try demotes `other` (older) and gets no room until that lands.
  CHECK(tree.prefetch(tree.probe(doc).node).empty());
  auto room = tree.take_copies();
  REQUIRE(room.size() == 1);
  CHECK(room[0].from == tier::host);
  CHECK(room[0].to == tier::file);
  (void)tree.complete(room[0].id);
  auto pf = tree.prefetch(tree.probe(doc).node);
  REQUIRE(pf.size() == 1);
  CHECK(pf[0].from_pages.size() == 2);
  CHECK(tree.take_copies().empty());
  (void)tree.complete(pf[0].id);
  CHECK(tree.probe(doc).fastest_tokens[1] == 16);  // the path's own host pages stayed
  CHECK(tree.probe(other).fastest_tokens[1] == 0);
  tree.check_invariants();
}

TEST_CASE("hiradix_tree: discard drops a lost copy, and a broken prefix with everything below it", "[cpu][hiradix]")
{
  tokens_t const base = seq(0, 8);
  tokens_t a = base, b = base;
  for (std::int32_t i = 0; i < 4; ++i) {
    a.push_back(100 + i), b.push_back(200 + i);
  }
  hiradix_tree tree = file_only(a);
  (void)tree.adopt(tier::file, b, std::vector<std::int64_t>{13, 14, 15});  // b's leaf, beside a's
  tree.check_invariants();
  REQUIRE(tree.probe(b).fastest_tokens[2] == 12);
  node_ref const shared = tree.probe(base).node;
  // A leaf: only its copy goes.
  auto d = tree.discard(tree.probe(b).node, tier::file);
  CHECK(d.dropped);
  CHECK(d.pages[2] == 1);
  CHECK(tree.probe(b).tokens == 8);
  // Locked: refused, nothing changes.
  node_ref const leaf = tree.match(a).node;
  tree.lock(leaf, tier::device);
  CHECK_FALSE(tree.discard(shared, tier::file).dropped);
  CHECK(tree.probe(a).tokens == 12);
  tree.unlock(leaf, tier::device);
  // The shared prefix's only copy: it goes with a's leaf below it.
  d = tree.discard(shared, tier::file);
  CHECK(d.dropped);
  CHECK(d.pages[2] == 3);
  CHECK(tree.probe(a).tokens == 0);
  CHECK(tree.free_slots(tier::file) == 16);
  tree.check_invariants();
  // A copy with another beside it: only that one goes.
  hiradix_tree t2{small_config(write_policy::write_through)};
  (void)t2.insert(base, ids(0, 2));
  for (auto& o : t2.take_copies()) {
    (void)t2.complete(o.id);
  }
  d = t2.discard(t2.probe(base).node, tier::host);
  CHECK(d.dropped);
  CHECK(t2.probe(base).fastest_tokens[0] == 8);
  CHECK(t2.probe(base).tier_tokens[1] == 0);
  t2.check_invariants();
}

TEST_CASE("hiradix_tree: discard_from keeps the intact prefix of a node and drops the page lost and below",
          "[cpu][hiradix]")
{
  tokens_t const doc = seq(0, 24);  // 6 pages
  tokens_t longer = doc;
  for (std::int32_t i = 0; i < 8; ++i) {
    longer.push_back(500 + i);  // 2 pages below the document
  }
  hiradix_tree tree = file_only(longer);
  REQUIRE(tree.probe(longer).fastest_tokens[2] == 32);
  (void)tree.match(doc);  // the document is a node of 6 pages, the 2 pages a child
  node_ref const n = tree.probe(doc).node;
  auto const pages = tree.path_pages(n, tier::file);
  REQUIRE(pages.size() == 6);
  auto const free_before = tree.free_slots(tier::file);
  // Page 2 of the document is lost: pages 2..5 go, and the child that hangs below them.
  auto d = tree.discard_from(tier::file, pages[2]);
  CHECK(d.dropped);
  CHECK(d.pages[2] == 4 + 2);
  CHECK(tree.free_slots(tier::file) == free_before + 6);
  CHECK(tree.probe(longer).tokens == 8);  // the two pages before it stay cached, in the file tier
  CHECK(tree.probe(longer).fastest_tokens[2] == 8);
  CHECK(tree.path_pages(tree.probe(doc).node, tier::file) == std::vector<std::int64_t>{pages[0], pages[1]});
  tree.check_invariants();
  // A page no node holds any more: nothing changes.
  auto const again = tree.discard_from(tier::file, pages[3]);
  CHECK(again.dropped);
  CHECK(again.pages[2] == 0);
  CHECK(tree.probe(longer).tokens == 8);
  // The first page: the whole prefix goes.
  d = tree.discard_from(tier::file, pages[0]);
  CHECK(d.pages[2] == 2);
  CHECK(tree.probe(longer).tokens == 0);
  CHECK(tree.free_slots(tier::file) == free_before + 8);
  tree.check_invariants();
  CHECK_THROWS_AS(tree.discard_from(tier::device, 0), strata::invalid_argument);
  CHECK_THROWS_AS(tree.discard_from(tier::file, 16), strata::invalid_argument);
  CHECK_THROWS_AS(tree.discard_from(tier::file, -1), strata::invalid_argument);
  // A copy with another beside it: only the lost part of that copy goes.
  hiradix_tree t2{small_config(write_policy::write_through)};
  (void)t2.insert(seq(0, 12), ids(0, 3));
  for (auto& o : t2.take_copies()) {
    (void)t2.complete(o.id);
  }
  auto const host = t2.path_pages(t2.probe(seq(0, 12)).node, tier::host);
  REQUIRE(host.size() == 3);
  d = t2.discard_from(tier::host, host[1]);
  CHECK(d.dropped);
  CHECK(d.pages[1] == 2);
  CHECK(d.freed_device.empty());
  CHECK(t2.probe(seq(0, 12)).fastest_tokens[0] == 12);
  CHECK(t2.probe(seq(0, 12)).tier_tokens[1] == 4);
  t2.check_invariants();
}

TEST_CASE("hiradix_tree: the file write policy copies host pages to the file tier", "[cpu][hiradix]")
{
  for (write_policy p :
       {write_policy::write_back, write_policy::write_through, write_policy::write_through_selective}) {
    INFO("file policy " << int(p));
    hiradix_config c = small_config(write_policy::write_through);
    c.file_backup_policy = p;
    hiradix_tree tree{c};
    tokens_t const t = seq(0, 8);
    (void)tree.insert(t, ids(0, 2));
    auto up = tree.take_copies();
    REQUIRE(up.size() == 1);
    (void)tree.complete(up[0].id);  // on the host now
    auto down = tree.take_copies();
    CHECK(down.size() == (p == write_policy::write_through ? 1u : 0u));
    if (p == write_policy::write_through_selective) {
      (void)tree.match(t);
      CHECK(tree.take_copies().empty());
      (void)tree.match(t);  // the second hit
      down = tree.take_copies();
      CHECK(down.size() == 1);
    }
    for (auto& o : down) {
      CHECK(o.from == tier::host);
      CHECK(o.to == tier::file);
      CHECK(o.ids == t);
      (void)tree.complete(o.id);
      CHECK(tree.probe(t).tier_tokens[2] == 8);
    }
    tree.check_invariants();
  }
}

TEST_CASE("hiradix_tree: a node larger than the host tier is backed up to the file tier", "[cpu][hiradix]")
{
  hiradix_config c = small_config(write_policy::write_through);
  c.capacity = {8, 1, 8, 0};
  hiradix_tree tree{c};
  auto const r = tree.insert(seq(0, 8), ids(0, 2));  // 2 pages, the host holds 1
  auto const copies = tree.take_copies();
  REQUIRE(copies.size() == 1);
  CHECK(copies[0].from == tier::device);
  CHECK(copies[0].to == tier::file);
  CHECK(!copies[0].demotion);
  (void)tree.complete(copies[0].id);
  CHECK(tree.resident(r.node, tier::device));
  CHECK(tree.resident(r.node, tier::file));
  tree.check_invariants();
}

namespace {
/// Completes every order of `orders` in `t`; returns the device pages freed.
std::vector<std::int64_t> complete_all(hiradix_tree& t, std::vector<copy_order> const& orders)
{
  std::vector<std::int64_t> freed;
  for (auto const& o : orders) {
    auto f = t.complete(o.id);
    freed.insert(freed.end(), f.begin(), f.end());
  }
  return freed;
}
}  // namespace

TEST_CASE("hiradix_tree: a node whose only copy is on the device is demoted, whatever the policy", "[cpu][hiradix]")
{
  // Under write-through a parent whose backup found no room (the file tier's write backlog was
  // full) stays on the device only; once its child has gone below the host, the parent may not be
  // dropped (a node hangs below it): it must be demoted — past the host if the host has no room —
  // or its device pages stay pinned for good.
  hiradix_config c = small_config(write_policy::write_through);
  c.capacity = {8, 1, 8, 0};
  c.write_backlog_pages[2] = 2;
  hiradix_tree tree{c};
  auto run = [&](std::vector<copy_order> const& v) { (void)complete_all(tree, v); };
  tokens_t const x = seq(100, 8), a = seq(0, 8), ab = seq(0, 12);  // x, a: 2 pages, b: 1
  (void)tree.insert(x, ids(4, 2));
  auto const x_backup = tree.take_copies();  // to the file tier (larger than the host), in flight
  REQUIRE(x_backup.size() == 1);
  (void)tree.insert(a, ids(0, 2));
  CHECK(tree.take_copies().empty());  // the file tier's backlog is full: a's backup is dropped
  CHECK(tree.stats().writes_dropped[2] == 2);
  run(x_backup);
  (void)tree.insert(ab, ids(0, 3));
  run(tree.take_copies());                     // b's backup
  run(tree.evict(tier::device, 1).demotions);  // x (it has a file copy)
  run(tree.evict(tier::device, 1).demotions);  // b (it has a host copy)
  run(tree.evict(tier::host, 1).demotions);    // b: on the file tier only now
  REQUIRE(tree.probe(ab).fastest_tokens[0] == 8);
  REQUIRE(tree.probe(ab).fastest_tokens[2] == 4);
  auto r = tree.evict(tier::device, 2);
  CHECK(r.pages == 2);
  REQUIRE(r.demotions.size() == 1);
  CHECK(r.demotions[0].to == tier::file);
  run(r.demotions);
  CHECK(tree.stats().resident_pages[0] == 0);
  CHECK(tree.probe(ab).fastest_tokens[2] == 12);
  tree.check_invariants();
}

TEST_CASE("hiradix_tree: a node a record tier takes brings the ancestors it lacks", "[cpu][hiradix]")
{
  // a's middle lies 4 tokens into the prompt: not worth the file (breakeven 6) nor the remote tier
  // (breakeven 20). b below it is worth the file tier, c below b the remote tier: each is found
  // only through a path from the root, so the ancestors go with it.
  hiradix_config c = small_config(write_policy::write_through);
  c.capacity = {16, 16, 16, 1 << 20};
  c.file_backup_policy = write_policy::write_through;
  c.remote_backup_policy = write_policy::write_through;
  c.record_breakeven_tokens[2] = 6;
  c.record_breakeven_tokens[3] = 20;
  hiradix_tree tree{c};
  auto run = [&] {
    for (int round = 0; round < 4; ++round) {
      (void)complete_all(tree, tree.take_copies());
    }
  };
  tokens_t const a = seq(0, 8), ab = seq(0, 16), abc = seq(0, 32);
  (void)tree.insert(a, ids(0, 2));
  run();
  CHECK(tree.stats().writes_not_worth[2] == 2);
  CHECK(tree.stats().writes_not_worth[3] == 2);
  CHECK(tree.stats().resident_pages[2] == 0);
  (void)tree.insert(ab, ids(0, 4));
  run();
  CHECK(tree.stats().resident_pages[2] == 4);  // b and a
  CHECK(tree.stats().resident_pages[3] == 0);  // b's middle (12) is short of the remote tier's 20
  (void)tree.insert(abc, ids(0, 8));
  run();
  CHECK(tree.stats().resident_pages[2] == 8);
  CHECK(tree.stats().resident_pages[3] == 8);  // c, then b and a
  tree.check_invariants();
}

TEST_CASE("hiradix_tree: a record tier takes only what a read would pay for; the rest goes with its parent",
          "[cpu][hiradix]")
{
  // a's middle lies 4 tokens into the prompt, b's 10: past a breakeven of 6 tokens only b is worth
  // the file tier. When a (its only copy on the device, too large for the host) must leave, b is
  // cached nowhere else: both go at once rather than pin a's device pages for good.
  hiradix_config c = small_config(write_policy::write_through);
  c.capacity = {8, 1, 8, 0};
  c.record_breakeven_tokens[2] = 6;
  hiradix_tree tree{c};
  auto run = [&](std::vector<copy_order> const& v) { (void)complete_all(tree, v); };
  tokens_t const a = seq(0, 8), ab = seq(0, 12);
  (void)tree.insert(a, ids(0, 2));
  CHECK(tree.take_copies().empty());  // not worth the file tier, too large for the host
  CHECK(tree.stats().writes_not_worth[2] == 2);
  (void)tree.insert(ab, ids(0, 3));
  run(tree.take_copies());                     // b's backup to the host
  run(tree.evict(tier::device, 1).demotions);  // b leaves the device
  auto const down = tree.evict(tier::host, 1);
  REQUIRE(down.demotions.size() == 1);  // b is worth the file tier
  CHECK(down.demotions[0].to == tier::file);
  run(down.demotions);
  REQUIRE(tree.probe(ab).fastest_tokens[2] == 4);
  auto const r = tree.evict(tier::device, 2);
  CHECK(r.pages == 2);
  CHECK(r.demotions.empty());
  CHECK(r.freed == std::vector<std::int64_t>{0, 1});
  CHECK(tree.probe(ab).tokens == 0);
  CHECK(tree.stats().resident_pages[2] == 0);
  CHECK(tree.free_slots(tier::file) == 8);
  tree.check_invariants();
}

TEST_CASE("hiradix_tree: evict skips the node it tried even when making room moved the LRU set", "[cpu][hiradix]")
{
  // Issue 23, item 0 (a). Write-back, a full host tier over a 2-page file tier. X (2 pages) and
  // P (2 pages) are on the device only, each over a 1-page child that is on the host only (Xc,
  // Pc, the latter with a load pending). Making host room for P drops Xc (no room below), which
  // makes X a device candidate again, at the front of the set; the skip branch then erased the
  // front (X) instead of P: X kept its candidate flag outside the set, and evict freed nothing.
  hiradix_config c;
  c.page_tokens = 1;
  c.capacity = {16, 4, 2, 0};
  c.backup_policy = write_policy::write_back;
  hiradix_tree t{c};
  tokens_t const y{10, 11}, x{20, 21}, xc{20, 21, 22}, p{30, 31}, pc{30, 31, 32};
  (void)t.insert(y, ids(0, 2));
  (void)t.insert(xc, ids(2, 3));
  (void)t.match(x);                                           // splits X | Xc
  (void)complete_all(t, t.evict(tier::device, 3).demotions);  // Y and Xc to the host
  (void)t.insert(pc, ids(5, 3));
  (void)t.match(p);  // splits P | Pc
  auto const xn = t.probe(x).node;
  t.lock(xn, tier::device);  // Pc leaves the device, not X
  (void)complete_all(t, t.evict(tier::device, 1).demotions);
  t.unlock(xn, tier::device);
  REQUIRE(t.free_slots(tier::host) == 0);
  auto const pcn = t.probe(pc).node;
  REQUIRE(t.pages_to_load(pcn) == 1);
  auto const load = t.load(pcn, std::vector<std::int64_t>{8});  // pending: Pc pinned
  REQUIRE(load.size() == 1);
  REQUIRE(t.probe(p).device_prefix_tokens == 2);
  t.check_invariants();

  // X's host room needs Y demoted to the file tier (not landed yet); P's drops Xc, and X, now a
  // leaf of the whole tree with no room below, goes: its 2 pages are what the call frees.
  auto const r = t.evict(tier::device, 4);
  t.check_invariants();
  CHECK(r.pages == 2);
  CHECK(r.freed == std::vector<std::int64_t>{2, 3});
  CHECK(r.demotions.empty());
  CHECK(t.probe(x).tokens == 0);
  CHECK(t.probe(p).device_prefix_tokens == 2);
  CHECK(t.evictable_pages(tier::device) == 2);  // P is a candidate again
  (void)complete_all(t, t.take_copies());       // Y to the file tier
  (void)complete_all(t, load);
  t.check_invariants();
}

TEST_CASE("hiradix_tree: evict returns when making room empties the tier's candidate set", "[cpu][hiradix]")
{
  // Issue 23, item 0 (b). Write-through, a 1-page host. P (2 pages) never found host room; its
  // child C did. With P locked in the host tier, evicting C from the device leaves P the only
  // device candidate; making host room for P drops C, which unlinks it from P: P is no longer
  // evictable and leaves the set, which the skip branch then erased from while empty (the loop
  // never returned).
  hiradix_config c;
  c.page_tokens = 1;
  c.capacity = {8, 1, 0, 0};
  c.backup_policy = write_policy::write_through;
  hiradix_tree t{c};
  tokens_t const p{1, 2}, pc{1, 2, 3};
  auto const pi = t.insert(p, ids(0, 2));
  CHECK(t.take_copies().empty());  // no room for P's 2 pages
  (void)t.insert(pc, ids(0, 3));
  auto const backups = t.take_copies();
  REQUIRE(backups.size() == 1);  // C's
  (void)complete_all(t, backups);
  t.lock(pi.node, tier::host);
  auto const r = t.evict(tier::device, 4);
  t.check_invariants();
  CHECK(r.pages == 1);  // C's device page; P stays (its only copy, locked below)
  CHECK(t.probe(p).device_prefix_tokens == 2);
  t.unlock(pi.node, tier::host);
  t.check_invariants();
}

TEST_CASE("hiradix_tree: a copy locked in its tier survives a demotion that landed under a load", "[cpu][hiradix]")
{
  // Issue 23, item 0: a demotion that lands while a load still reads its source defers the
  // source's drop; a lock taken meanwhile must keep the copy (the demotion became a backup), as
  // `lock` promises: the drop used to check only pins, and the slot went to the next prefix.
  hiradix_config c;
  c.page_tokens = 2;
  c.capacity = {4, 4, 4, 0};
  c.backup_policy = write_policy::write_back;
  hiradix_tree t{c};
  tokens_t const n{1, 2}, other{3, 4};
  auto const a = t.adopt(tier::host, n, std::vector<std::int64_t>{0});
  auto const d = t.evict(tier::host, 1);
  REQUIRE(d.demotions.size() == 1);  // host -> file
  auto const l = t.load(a.node, std::vector<std::int64_t>{0});
  REQUIRE(l.size() == 1);
  REQUIRE(l[0].from == tier::host);
  CHECK(t.complete(d.demotions[0].id).empty());
  t.lock(a.node, tier::host);
  CHECK(t.complete(l[0].id).empty());
  t.check_invariants();
  CHECK(t.locks(a.node, tier::host) == 1);
  CHECK(t.resident(a.node, tier::host));
  CHECK(t.path_pages(a.node, tier::host) == std::vector<std::int64_t>{0});
  auto const b = t.adopt(tier::host, other, std::vector<std::int64_t>{1});
  CHECK(b.pages == 1);
  STRATA_REQUIRE_THROWS(invalid_argument, "slot 0 of the host tier is allocated",
                        t.adopt(tier::host, tokens_t{5, 6}, std::vector<std::int64_t>{0}));
  t.unlock(a.node, tier::host);
  t.check_invariants();
}
