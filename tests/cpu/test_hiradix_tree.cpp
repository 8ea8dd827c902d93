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
  c.policy = policy;
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
    c.policy = write_policy::write_through;
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
    }                                   // a: device + host
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
  c.policy = write_policy::write_back;
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
  c.policy = write_policy::write_back;
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
