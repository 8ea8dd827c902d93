// SPDX-License-Identifier: Apache-2.0
// The remote tier against real servers: a 6-node Redis Cluster (3 masters, 3 replicas) and one
// server without cluster support, started here from Debian's redis-server on loopback ports
// (tests/support/redis_servers.hpp). Page bytes come from a generator keyed by a hash of the
// prefix's tokens that shares nothing with the store's keys. The rule throughout: a page `get`
// reports intact holds exactly the bytes written for that prefix; everything else is a miss.
//
// STRATA_TEST_QUICK=1 runs fewer pages and rounds (the sanitizer builds).
#include "../support/catch.hpp"
#include "../support/keyed_pages.hpp"
#include "../support/redis_servers.hpp"

#include <strata/tier/redis_store.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

using strata::content_key;
using strata::keyed_page;
using strata::redis_store;
using strata::redis_store_options;
using strata::test::document;
using strata::test::get_checked;
using strata::test::landing;
using strata::test::redis_servers;

namespace {

bool quick() { return std::getenv("STRATA_TEST_QUICK") != nullptr; }

strata::kv_geometry small_geometry() { return {2, 4, 2, 64, 2, 2}; }  // 4 KiB pages

strata::store_namespace space(std::string dtype = "bf16", strata::kv_geometry g = small_geometry(), int rank = 0)
{ return {"test-model", std::move(dtype), "page_first", g, rank, 2}; }

redis_store_options options(std::vector<std::string> nodes, strata::store_namespace ns = space())
{
  redis_store_options o;
  o.nodes = std::move(nodes);
  o.space = std::move(ns);
  return o;
}

/// Writes every page of `d`; all must be stored.
void put(redis_store& s, document const& d)
{
  auto pages = d.pages();
  auto src = d.sources();
  std::unique_ptr<bool[]> ok(new bool[pages.size()]());
  REQUIRE(s.set(pages, src, {ok.get(), pages.size()}) == std::int64_t(pages.size()));
}

redis_servers& shared_cluster()
{
  static redis_servers c = redis_servers::cluster();
  return c;
}

}  // namespace

TEST_CASE("content keys chain over the prefix and namespaces separate what differs", "[cpu][redis]")
{
  std::vector<std::int32_t> a{1, 2, 3, 4, 5, 6, 7, 8}, b{1, 2, 3, 4, 5, 6, 7, 9}, c{9, 2, 3, 4, 5, 6, 7, 8};
  auto ka = strata::chain_content_keys(a, 4), kb = strata::chain_content_keys(b, 4),
       kc = strata::chain_content_keys(c, 4);
  REQUIRE(ka.size() == 2);
  CHECK(ka[0] == kb[0]);     // same first page
  CHECK(!(ka[1] == kb[1]));  // last token differs
  CHECK(!(ka[1] == kc[1]));  // same second page, other first page: another prefix
  CHECK(!(ka[0].hi == ka[0].lo));
  CHECK(strata::chain_content_keys(std::vector<std::int32_t>{1, 2, 3}, 4).empty());

  auto const base = strata::namespace_key(space());
  CHECK(base == strata::namespace_key(space()));
  CHECK(!(base == strata::namespace_key(space("fp16"))));  // same element size, another dtype
  CHECK(!(base == strata::namespace_key(space("bf16", small_geometry(), 1))));
  auto g = small_geometry();
  g.page_tokens = 8;
  CHECK(!(base == strata::namespace_key(space("bf16", g))));
  auto other_model = space();
  other_model.model = "test-model-2";
  CHECK(!(base == strata::namespace_key(other_model)));
  auto other_layout = space();
  other_layout.layout = "layer_first";
  CHECK(!(base == strata::namespace_key(other_layout)));

  auto bad = space();
  bad.tp_rank = 2;
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "tp_rank", strata::namespace_key(bad));
  bad = space("");
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "dtype", strata::namespace_key(bad));
}

TEST_CASE("a keyed record checks every byte, the namespace, the key and the ids", "[cpu][redis]")
{
  namespace d = strata::detail;
  std::vector<std::int32_t> ids{5, 6, 7, 8};
  std::vector<std::byte> payload(4096);
  for (std::size_t i = 0; i < payload.size(); ++i) {
    payload[i] = std::byte(i * 7 + 3);
  }
  std::vector<std::byte> value(d::keyed_record_bytes(ids.size(), 4096));
  d::encode_keyed_record_head(value.data(), 1, 2, 3, 4, 1, ids, payload.data(), 4096);
  std::memcpy(value.data() + d::keyed_record_bytes(ids.size(), 0), payload.data(), payload.size());
  using c = d::keyed_record_check;
  CHECK(d::check_keyed_record(value, 1, 2, 3, 4, 1, ids, 4096) == c::ok);
  CHECK(d::check_keyed_record(value, 1, 2, 3, 4, 1, {}, 4096) == c::ok);  // ids not compared
  CHECK(std::memcmp(d::keyed_record_payload(value), payload.data(), payload.size()) == 0);
  CHECK(d::check_keyed_record(value, 1, 9, 3, 4, 1, ids, 4096) == c::other_namespace);
  CHECK(d::check_keyed_record(value, 1, 2, 3, 9, 1, ids, 4096) == c::other_key);
  std::vector<std::int32_t> other{5, 6, 7, 9};
  CHECK(d::check_keyed_record(value, 1, 2, 3, 4, 1, other, 4096) == c::other_ids);
  CHECK(d::check_keyed_record(value, 1, 2, 3, 4, 2, ids, 4096) == c::malformed);  // another format version
  CHECK(d::check_keyed_record(value, 1, 2, 3, 4, 1, ids, 2048) == c::malformed);
  CHECK(d::check_keyed_record(std::span(value).first(value.size() - 1), 1, 2, 3, 4, 1, ids, 4096) == c::malformed);
  for (std::size_t at :
       {std::size_t(0), std::size_t(60), std::size_t(64), std::size_t(70), value.size() / 2, value.size() - 1}) {
    auto bad = value;
    bad[at] ^= std::byte{0x10};
    CHECK(d::check_keyed_record(bad, 1, 2, 3, 4, 1, ids, 4096) != c::ok);
  }
}

TEST_CASE("the client's key slots are the cluster's", "[cpu][redis]")
{
  redis_servers& servers = shared_cluster();
  std::mt19937 rng(7);
  std::vector<std::string> keys{"", "a", "{user1000}.following", "{}x", "foo{}{bar}", "foo{{bar}}zap", "{bar"};
  for (int i = 0; i < 200; ++i) {
    std::string k(std::size_t(rng() % 80), ' ');
    for (char& ch : k) {
      ch = char(32 + rng() % 95);
    }
    keys.push_back(k);
  }
  for (std::string const& k : keys) {
    auto r = servers.command(0, "CLUSTER KEYSLOT %b", k.data(), k.size());
    REQUIRE(r);
    REQUIRE(r->type == REDIS_REPLY_INTEGER);
    INFO("key \"" << k << "\"");
    CHECK(strata::detail::redis::key_slot(k) == r->integer);
  }
}

TEST_CASE("pages round-trip through the cluster and the leading ones are found", "[cpu][redis]")
{
  redis_servers& servers = shared_cluster();
  redis_store s(options({servers.address(0)}));
  CHECK(s.clustered());
  document const d(small_geometry(), quick() ? 64 : 512, 1);
  CHECK(s.exists(d.keys) == 0);
  CHECK(get_checked(s, d) == 0);
  CHECK(s.stats().pages_absent == std::int64_t(d.size()));
  put(s, d);
  CHECK(s.exists(d.keys) == std::int64_t(d.size()));
  CHECK(get_checked(s, d) == std::int64_t(d.size()));
  CHECK(s.stats().pages_read == std::int64_t(d.size()));

  // A prefix: the pages of a longer document beyond what is stored are not found.
  document const longer(small_geometry(), std::int64_t(d.size()) + 5, 1);
  REQUIRE(std::equal(d.keys.begin(), d.keys.end(), longer.keys.begin()));
  CHECK(s.exists(longer.keys) == std::int64_t(d.size()));
  // A hole: the leading count stops there even if later pages exist.
  document const other(small_geometry(), 12, 2);
  redis_store w(options({servers.address(3)}));
  {
    auto pages = other.pages();
    auto src = other.sources();
    pages.erase(pages.begin() + 5);
    src.erase(src.begin() + 5);
    std::unique_ptr<bool[]> ok(new bool[pages.size()]());
    CHECK(w.set(pages, src, {ok.get(), pages.size()}) == 11);
  }
  CHECK(s.exists(other.keys) == 5);
  CHECK(get_checked(s, other) == 11);
  {
    std::unique_ptr<bool[]> have(new bool[12]());
    CHECK(s.contains(other.keys, {have.get(), 12}) == 11);  // every key but the hole
    for (std::size_t p = 0; p < 12; ++p) {
      CHECK(have[p] == (p != 5));
    }
  }

  // Rounds smaller than the batch: the same bytes.
  auto o = options({servers.address(1)});
  o.max_batch_bytes = 3 * small_geometry().page_bytes();
  redis_store small_rounds(o);
  CHECK(get_checked(small_rounds, d) == std::int64_t(d.size()));
}

TEST_CASE("a Llama-3.1-8B page round-trips bit-exact", "[cpu][redis]")
{
  redis_servers& servers = shared_cluster();
  auto const g = strata::models::llama31_8b.geometry(16);
  REQUIRE(g.page_bytes() == std::int64_t{2} << 20);
  redis_store s(options({servers.address(0)}, space("bf16", g)));
  document const d(g, quick() ? 4 : 24, 3);
  put(s, d);
  CHECK(get_checked(s, d) == std::int64_t(d.size()));
}

TEST_CASE("another namespace, other ids, a damaged or replaced value are misses", "[cpu][redis]")
{
  redis_servers& servers = shared_cluster();
  redis_store s(options({servers.address(0)}));
  redis_store fp16(options({servers.address(0)}, space("fp16")));
  redis_store rank1(options({servers.address(0)}, space("bf16", small_geometry(), 1)));
  document const d(small_geometry(), 16, 4);
  put(s, d);
  CHECK(fp16.exists(d.keys) == 0);
  CHECK(get_checked(fp16, d) == 0);
  CHECK(get_checked(rank1, d) == 0);

  // Other ids under the right key (a key collision): rejected.
  {
    std::vector<std::int32_t> wrong(d.ids(3).begin(), d.ids(3).end());
    wrong[0] += 1;
    keyed_page const pg{d.keys[3], wrong};
    landing l(1, d.g.page_bytes());
    CHECK(s.get({&pg, 1}, l.ptrs, l.intact()) == 0);
    CHECK(s.stats().pages_rejected == 1);
  }

  // One byte of one value damaged in the store: that page alone is a miss.
  std::string const name5 = s.key_name(d.keys[5]);
  auto const slot = strata::detail::redis::key_slot(name5);
  int owner = -1;
  for (int i : servers.masters()) {
    auto r = servers.command(i, "CLUSTER COUNTKEYSINSLOT %d", slot);
    if (r && r->integer > 0) { owner = i; }
  }
  REQUIRE(owner >= 0);
  auto const at = std::to_string(100 + d.g.page_bytes() / 2);
  REQUIRE(servers.command(owner, "SETRANGE %b %s \x01\x02", name5.data(), name5.size(), at.c_str()));
  CHECK(get_checked(s, d) == 15);

  // A value replaced by another namespace's page under this key (a writer with a broken key scheme).
  put(fp16, d);
  std::string const name7 = s.key_name(d.keys[7]), foreign = fp16.key_name(d.keys[7]);
  int const owner7 = [&] {
    for (int i : servers.masters()) {
      auto r = servers.command(i, "CLUSTER COUNTKEYSINSLOT %d", strata::detail::redis::key_slot(name7));
      if (r && r->integer > 0) { return i; }
    }
    return -1;
  }();
  int const owner_foreign = [&] {
    for (int i : servers.masters()) {
      auto r = servers.command(i, "CLUSTER COUNTKEYSINSLOT %d", strata::detail::redis::key_slot(foreign));
      if (r && r->integer > 0) { return i; }
    }
    return -1;
  }();
  REQUIRE(owner7 >= 0);
  REQUIRE(owner_foreign >= 0);
  auto value = servers.command(owner_foreign, "GET %b", foreign.data(), foreign.size());
  REQUIRE((value && value->type == REDIS_REPLY_STRING));
  REQUIRE(servers.command(owner7, "SET %b %b", name7.data(), name7.size(), value->str, value->len));
  auto const rejected = s.stats().pages_rejected;
  CHECK(get_checked(s, d) == 14);
  CHECK(s.stats().pages_rejected == rejected + 2);
}

TEST_CASE("a server without cluster support is a store of one node", "[cpu][redis]")
{
  redis_servers one = redis_servers::standalone();
  redis_store s(options({one.address(0)}));
  CHECK(!s.clustered());
  document const d(small_geometry(), 100, 5);
  put(s, d);
  CHECK(s.exists(d.keys) == 100);
  CHECK(get_checked(s, d) == 100);
}

TEST_CASE("redirections: a slot moved to another master (MOVED) and one being moved (ASK)", "[cpu][redis]")
{
  redis_servers servers = redis_servers::cluster();
  redis_store s(options({servers.address(0)}));
  document const d(small_geometry(), 8, 6);
  put(s, d);
  auto node_id = [&](int i) {
    auto r = servers.command(i, "CLUSTER MYID");
    REQUIRE((r && r->type == REDIS_REPLY_STRING));
    return std::string(r->str, r->len);
  };
  auto owner_of = [&](std::string const& name) {
    for (int i : servers.masters()) {
      auto r = servers.command(i, "CLUSTER COUNTKEYSINSLOT %d", strata::detail::redis::key_slot(name));
      if (r && r->integer > 0) { return i; }
    }
    return -1;
  };
  auto migrate = [&](int from, int to, std::string const& name, bool finish) {
    int const slot = strata::detail::redis::key_slot(name);
    auto const to_id = node_id(to), from_id = node_id(from);
    REQUIRE(servers.command(to, "CLUSTER SETSLOT %d IMPORTING %s", slot, from_id.c_str())->type == REDIS_REPLY_STATUS);
    REQUIRE(servers.command(from, "CLUSTER SETSLOT %d MIGRATING %s", slot, to_id.c_str())->type == REDIS_REPLY_STATUS);
    auto r = servers.command(from, "MIGRATE 127.0.0.1 %d %b 0 5000", servers.port(to), name.data(), name.size());
    REQUIRE((r && r->type == REDIS_REPLY_STATUS));
    if (finish) {
      for (int i : servers.masters()) {
        servers.command(i, "CLUSTER SETSLOT %d NODE %s", slot, to_id.c_str());
      }
    }
  };
  auto other_master = [&](int m) {
    for (int i : servers.masters()) {
      if (i != m) { return i; }
    }
    return -1;
  };

  std::string const n0 = s.key_name(d.keys[0]);
  int const from0 = owner_of(n0);
  migrate(from0, other_master(from0), n0, true);  // the store's map is stale now
  CHECK(get_checked(s, d) == 8);
  CHECK(s.stats().moved >= 1);

  std::string const n1 = s.key_name(d.keys[1]);
  int const from1 = owner_of(n1);
  migrate(from1, other_master(from1), n1, false);  // mid-migration: the key has left, the slot has not
  CHECK(get_checked(s, d) == 8);
  CHECK(s.stats().ask >= 1);
}

TEST_CASE("a master killed with reads in flight: clean misses, then service after failover", "[cpu][redis][threads]")
{
  redis_servers servers = redis_servers::cluster();
  redis_store s(options({servers.address(0), servers.address(1)}));
  document const d(small_geometry(), quick() ? 96 : 384, 8);
  put(s, d);
  servers.wait_replicated();

  std::atomic<bool> stop{false};
  std::atomic<std::int64_t> rounds{0}, wrong_bytes{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; ++t) {
    readers.emplace_back([&] {
      auto pages = d.pages();
      landing l(pages.size(), d.g.page_bytes());
      while (!stop) {
        std::int64_t const got = s.get(pages, l.ptrs, l.intact());
        for (std::size_t i = 0; i < pages.size(); ++i) {
          if (l.flags[i] && l.bufs[i] != d.bytes[i]) { wrong_bytes.fetch_add(1); }
        }
        (void)got;
        rounds.fetch_add(1);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  int const victim = servers.masters().front();
  servers.kill(victim);

  // Service comes back: every page readable again within the failover time.
  auto const end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::int64_t got = 0;
  while (std::chrono::steady_clock::now() < end && (got = get_checked(s, d)) < std::int64_t(d.size())) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  stop = true;
  for (auto& r : readers) {
    r.join();
  }
  auto const st = s.stats();
  INFO(servers.logs() << "\nrounds " << rounds << ", unanswered pages " << st.pages_unanswered << ", reconnects "
                      << st.reconnects << ", slot map refreshes " << st.slot_map_refreshes);
  CHECK(wrong_bytes == 0);  // no page with wrong bytes was reported intact
  CHECK(got == std::int64_t(d.size()));
  CHECK(rounds > 0);
  CHECK(st.reconnects >= 1);
  CHECK(st.pages_unanswered > 0);  // the outage was seen: its pages were misses
  // Writes work again too.
  document const after(small_geometry(), 32, 9);
  put(s, after);
  CHECK(get_checked(s, after) == 32);
}

TEST_CASE("no server answering: a clear error at construction, misses after", "[cpu][redis]")
{
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "host:port", redis_store(options({"localhost"})));
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "no node", redis_store(options({})));
  auto o = options({"127.0.0.1:1"});
  STRATA_REQUIRE_THROWS(strata::error, "no node answered", redis_store(o));

  redis_servers one = redis_servers::standalone();
  o = options({one.address(0)});
  o.retry_budget = std::chrono::milliseconds(300);
  redis_store s(o);
  document const d(small_geometry(), 10, 10);
  put(s, d);
  one.kill(0);
  auto const t0 = std::chrono::steady_clock::now();
  CHECK(get_checked(s, d) == 0);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK(s.exists(d.keys) == 0);
  CHECK(s.stats().pages_unanswered >= 10);
}

TEST_CASE("bad input changes nothing", "[cpu][redis]")
{
  redis_servers& servers = shared_cluster();
  redis_store s(options({servers.address(0)}));
  document const d(small_geometry(), 4, 11);
  auto pages = d.pages();
  auto src = d.sources();
  std::unique_ptr<bool[]> ok(new bool[4]());
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "3 sources", s.set(pages, std::span(src).first(3), {ok.get(), 4}));
  CHECK(s.exists(d.keys) == 0);
  landing l(3, d.g.page_bytes());
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "3 destinations", s.get(pages, l.ptrs, {ok.get(), 4}));
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "not pending", s.poll(strata::io_ticket{99}, {ok.get(), 4}));
  auto o = options({servers.address(0)});
  o.io_threads = 0;
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "io_threads", redis_store(o));
  o.io_threads = 2;
  o.max_value_bytes = d.g.page_bytes();  // the header and ids do not fit beside the payload
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "max_value_bytes", redis_store(o));
}

TEST_CASE("two threads finishing one ticket: one gets it, the other a clear error", "[cpu][redis][threads]")
{
  redis_servers& servers = shared_cluster();
  redis_store s(options({servers.address(1)}));
  for (int round = 0; round < (quick() ? 5 : 20); ++round) {
    document const d(small_geometry(), 200, std::uint32_t(5000 + round));
    auto pages = d.pages();
    auto src = d.sources();
    auto const t = s.submit_set(pages, src);
    std::atomic<int> got{0}, refused{0};
    auto finish = [&](bool block) {
      std::unique_ptr<bool[]> ok(new bool[pages.size()]());
      try {
        if (block) {
          (void)s.wait(t, {ok.get(), pages.size()});
        } else {
          while (s.poll(t, {ok.get(), pages.size()}) == strata::io_status::pending) {
            std::this_thread::yield();
          }
        }
        got.fetch_add(1);
      } catch (strata::invalid_argument const&) {
        refused.fetch_add(1);
      }
    };
    std::thread waiter([&] { finish(true); });
    finish(false);
    waiter.join();
    CHECK(got == 1);
    CHECK(refused == 1);
  }
}

TEST_CASE("asynchronous batches from several threads", "[cpu][redis][threads]")
{
  redis_servers& servers = shared_cluster();
  redis_store s(options({servers.address(2)}));
  int const threads = 4, docs = quick() ? 3 : 8;
  std::atomic<int> wrong{0}, done{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int k = 0; k < docs; ++k) {
        document const d(small_geometry(), 40, std::uint32_t(1000 + t * 100 + k));
        auto pages = d.pages();
        auto src = d.sources();
        auto w = s.submit_set(pages, src);
        std::unique_ptr<bool[]> ok(new bool[pages.size()]());
        if (s.wait(w, {ok.get(), pages.size()}) != strata::io_status::succeeded) { wrong.fetch_add(1); }
        landing l(pages.size(), d.g.page_bytes());
        auto r = s.submit_get(pages, l.ptrs);
        strata::io_status st;
        while ((st = s.poll(r, l.intact())) == strata::io_status::pending) {
          std::this_thread::yield();
        }
        if (st != strata::io_status::succeeded) { wrong.fetch_add(1); }
        for (std::size_t i = 0; i < pages.size(); ++i) {
          if (!l.flags[i] || l.bufs[i] != d.bytes[i]) { wrong.fetch_add(1); }
        }
        done.fetch_add(1);
      }
    });
  }
  for (auto& t : pool) {
    t.join();
  }
  CHECK(wrong == 0);
  CHECK(done == threads * docs);
}

TEST_CASE("a page written by one process is found by another", "[cpu][redis]")
{
  redis_servers& servers = shared_cluster();
  document const d(small_geometry(), 50, 12);
  REQUIRE(strata::test::in_child_process([&] {
            redis_store w(options({servers.address(4)}));
            auto pages = d.pages();
            auto src = d.sources();
            std::unique_ptr<bool[]> ok(new bool[pages.size()]());
            return w.set(pages, src, {ok.get(), pages.size()}) == std::int64_t(pages.size());
          }) == 0);
  redis_store r(options({servers.address(1)}));
  CHECK(r.exists(d.keys) == 50);
  CHECK(get_checked(r, d) == 50);
}

TEST_CASE("a paused server: its pages are misses within the timeouts, then served again", "[cpu][redis]")
{
  redis_servers one = redis_servers::standalone();
  auto o = options({one.address(0)});
  o.command_timeout = std::chrono::milliseconds(200);
  o.retry_budget = std::chrono::milliseconds(300);
  redis_store s(o);
  auto o1 = o;
  o1.io_threads = 1;
  redis_store q(o1);  // made while the server answers
  document const d(small_geometry(), 24, 13);
  put(s, d);
  one.pause(0);  // kill -STOP: connections stay open, nothing answers
  auto const t0 = std::chrono::steady_clock::now();
  CHECK(get_checked(s, d) == 0);
  auto const waited = std::chrono::steady_clock::now() - t0;
  CHECK(waited < std::chrono::seconds(3));  // a timeout and the retry budget, not for ever
  CHECK(s.exists(d.keys) == 0);
  CHECK(s.stats().pages_unanswered >= 24);
  {
    // Lookups queued behind one another (one I/O thread): the budget counts from each submit, so
    // the queue is answered within about one budget and a round, not one budget per lookup (12
    // lookups took at least 12 x 300 ms before).
    std::vector<strata::io_ticket> tickets;
    auto const t1 = std::chrono::steady_clock::now();
    for (int k = 0; k < 12; ++k) {
      tickets.push_back(q.submit_exists(d.keys));
    }
    std::unique_ptr<bool[]> have(new bool[d.keys.size()]());
    int answered_none = 0;
    for (auto t : tickets) {
      (void)q.wait(t, {have.get(), d.keys.size()});
      answered_none += std::none_of(have.get(), have.get() + d.keys.size(), [](bool h) { return h; }) ? 1 : 0;
    }
    CHECK(std::chrono::steady_clock::now() - t1 < std::chrono::milliseconds(2500));
    CHECK(answered_none == 12);
    CHECK(q.stats().pages_unanswered == 12 * std::int64_t(d.keys.size()));
  }
  one.resume(0);
  std::int64_t got = 0;
  for (int round = 0; round < 50 && got < 24; ++round) {
    got = get_checked(s, d);
  }
  CHECK(got == 24);
}

TEST_CASE("a full store: writes fail cleanly, reads keep serving", "[cpu][redis]")
{
  redis_servers one = redis_servers::standalone();
  redis_store s(options({one.address(0)}));
  document const first(small_geometry(), 16, 14);
  put(s, first);
  // No room left and no eviction: every write is refused (OOM), reads go on.
  auto used = one.command(0, "INFO memory");
  REQUIRE((used && used->type == REDIS_REPLY_STRING));
  std::string const text(used->str, used->len);
  long long const bytes = std::atoll(text.c_str() + text.find("used_memory:") + 12);
  REQUIRE(one.command(0, "CONFIG SET maxmemory-policy noeviction"));
  REQUIRE(one.command(0, "CONFIG SET maxmemory %lld", bytes + 1024)->type == REDIS_REPLY_STATUS);
  document const more(small_geometry(), 64, 15);
  auto pages = more.pages();
  auto src = more.sources();
  std::unique_ptr<bool[]> ok(new bool[pages.size()]());
  std::int64_t const written = s.set(pages, src, {ok.get(), pages.size()});
  CHECK(written < std::int64_t(pages.size()));
  CHECK(s.stats().pages_written == 16 + written);
  CHECK(get_checked(s, first) == 16);      // what was stored still reads back
  CHECK(get_checked(s, more) == written);  // and only what was written of the rest
}
