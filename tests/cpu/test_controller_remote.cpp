// SPDX-License-Identifier: Apache-2.0
// cache_controller over a remote tier in a real Redis Cluster (3 masters, 3 replicas, started here
// from Debian's redis-server): prefixes one controller computed are remote hits for another — in
// another process too — with the same bytes; damaged values, another namespace and an unreachable
// store are misses that are recomputed, never wrong KV. Page bytes come from the content function of
// tests/support/kv_content.hpp, which the controller never sees.
#include "../support/catch.hpp"
#include "../support/costs.hpp"
#include "../support/kv_content.hpp"
#include "../support/pools.hpp"
#include "../support/redis_servers.hpp"

#include <strata/cache/controller.hpp>
#include <strata/cache/remote_tier.hpp>
#include <strata/layout/layer_first.hpp>
#include <strata/tier/redis_store.hpp>

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace strata;
using test::redis_servers;

namespace {

using tokens_t = std::vector<std::int32_t>;
kv_geometry const geo{2, 4, 1, 8, 2, 2};  // 256-byte pages

template <class Layout>
struct remote_policies_over {
  using tiers = tier_stack<device_pool<Layout>, host_pool, remote_tier<redis_store>>;
  using scheduler = strata_scheduler;
  using executor = cpu_executor;
};
static_assert(async_record_store<remote_tier<redis_store>>);
static_assert(prompt_lookup_store<remote_tier<redis_store>>);

redis_servers& cluster()
{
  static redis_servers c = redis_servers::cluster();
  return c;
}

store_namespace space(std::string dtype = "bf16")
{ return {"remote-controller-test", std::move(dtype), "page_first", geo, 0, 1}; }

redis_store_options store_options(std::string dtype = "bf16")
{
  redis_store_options o;
  o.nodes = {cluster().address(0)};
  o.space = space(std::move(dtype));
  return o;
}

/// An engine over a device pool of any layout: a controller over the device, a host tier and the
/// remote tier.
template <class Layout>
struct engine_over {
  using controller = cache_controller<remote_policies_over<Layout>>;
  kv_geometry g;
  Layout pool;
  controller cache;
  engine_over(Layout l, redis_store& store, std::int64_t host_pages = 32,
              prefetch_mode prefetch = prefetch_mode::wait_complete, bool reading_pays = true)
      : g(l.geometry()),
        pool(std::move(l)),
        cache(typename controller::tiers_type{device_pool<Layout>{pool}, host_pool{g, host_pages},
                                              remote_tier<redis_store>{store, g}},
              options(g, prefetch, reading_pays))
  {
  }
  /// `reading_pays`: a remote tier that reads faster than these tiny pages compute; false: the
  /// H200 defaults (10 GB/s, 1 ms a read), for which recomputing them is cheaper.
  static controller_options options(kv_geometry const& g, prefetch_mode prefetch, bool reading_pays)
  {
    controller_options o;
    if (reading_pays) { o.costs = test::reading_pays(g); }
    o.prefetch = prefetch;
    return o;
  }

  /// Waits for every copy in flight (the store's threads included) and settles it.
  void settle()
  {
    for (int round = 0; round < 200 && (cache.pending_submissions() > 0 || round < 2); ++round) {
      cache.executor().synchronize();
      (void)cache.poll();
    }
  }

  /// Serves one request: loads checked against the content function, the rest computed. Returns
  /// the pages that came cached, by tier, of the start that ran.
  std::array<std::int64_t, tier_count> serve(std::uint64_t id, tokens_t const& t)
  {
    cache.submit({request_id{id}, t, 0, 2, 0.0});
    for (int attempt = 0; attempt < 400; ++attempt) {
      auto h = cache.begin_loads(cache.schedule({4096, 0, 0, 0}));
      if (h.started.empty()) {  // held back: its lookup or prefetch is on the store's threads
        settle();
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        continue;
      }
      if (!wait_layer(h, 0)) {  // a load failed: a clean miss, it waits again
        CHECK(cache.complete(h));
        settle();
        continue;
      }
      auto const table = cache.page_table(request_id{id});
      std::int64_t cached = 0;
      for (auto c : h.started[0].cached_pages) {
        cached += c;
      }
      for (std::int64_t p = 0; p < std::int64_t(t.size()) / g.page_tokens; ++p) {
        INFO("request " << id << " page " << p);
        if (p < cached) {
          REQUIRE(test::kv_page_ok(pool, g, t, p, table[std::size_t(p)]));
        } else {
          test::write_kv_page(pool, g, t, p, table[std::size_t(p)]);
        }
      }
      (void)cache.finish_prefill(request_id{id});
      cache.release(request_id{id});
      settle();
      cache.check_invariants();
      return h.started[0].cached_pages;
    }
    auto const st = cache.stats();
    FAIL("request " << id << " never started: " << st.remote_lookups << " lookups, " << st.remote_lookup_waits
                    << " rounds held for them, " << cache.waiting() << " waiting");
    return {};
  }
};

/// The layer-first engine most cases use, with its own device memory.
struct engine_memory {
  std::vector<std::byte> bytes;
  explicit engine_memory(std::int64_t pages) : bytes(std::size_t(pages * geo.page_bytes())) {}
};
struct engine : engine_memory, engine_over<layer_first> {
  explicit engine(redis_store& store, std::int64_t device_pages = 64, std::int64_t host_pages = 32,
                  prefetch_mode prefetch = prefetch_mode::wait_complete, bool reading_pays = true)
      : engine_memory(device_pages),
        engine_over<layer_first>(layer_first{bytes.data(), geo, device_pages}, store, host_pages, prefetch,
                                 reading_pays)
  {
  }
};

tokens_t document(std::int32_t seed, std::int64_t pages, std::int64_t tail = 3)
{
  tokens_t t(std::size_t(pages * geo.page_tokens + tail));
  for (std::size_t i = 0; i < t.size(); ++i) {
    t[i] = seed * 1000 + std::int32_t(i * 7 % 997);
  }
  return t;
}
tokens_t with_question(tokens_t doc, std::int32_t q)
{
  doc.resize(doc.size() / std::size_t(geo.page_tokens) * std::size_t(geo.page_tokens));
  doc.insert(doc.end(), {q, q + 1, q + 2});
  return doc;
}
std::int64_t total(std::array<std::int64_t, tier_count> const& a) { return a[0] + a[1] + a[2] + a[3]; }

}  // namespace

TEST_CASE("remote: a prefix one controller computed is a remote hit for another, bit-exact", "[cpu][redis][controller]")
{
  redis_store store{store_options()};
  tokens_t const doc = document(1, 12);
  {
    engine a{store};
    CHECK(total(a.serve(1, with_question(doc, 50))) == 0);  // computed, backed up to the host and the remote tier
    CHECK(a.cache.stats().bytes_moved[1][3] == 12 * geo.page_bytes());
  }
  CHECK(store.stats().pages_written == 12);
  engine b{store};  // another instance: an empty index
  CHECK(b.cache.probe(with_question(doc, 60)).tokens == 0);
  auto const cached = b.serve(2, with_question(doc, 60));
  CHECK(total(cached) == 12);
  CHECK(cached[0] == 0);
  CHECK(b.cache.stats().remote_lookups == 1);
  CHECK(b.cache.stats().remote_found_pages == 12);
  CHECK(b.cache.stats().bytes_moved[3][1] + b.cache.stats().bytes_moved[3][0] == 12 * geo.page_bytes());
  // A longer prompt: the pages found, then the rest computed (and written for the next instance).
  tokens_t const longer = document(1, 20);
  engine c{store};
  auto const part = c.serve(3, with_question(longer, 70));
  CHECK(total(part) == 12);
  CHECK(store.stats().pages_written == 12 + 8);
}

TEST_CASE("remote: a prefix computed in one process is a remote hit in another", "[cpu][redis][controller]")
{
  tokens_t const doc = document(2, 9);
  (void)cluster();  // started here, not in the child
  REQUIRE(test::in_child_process([&] {
            redis_store store{store_options()};
            engine a{store};
            a.serve(1, with_question(doc, 11));
            return store.stats().pages_written == 9;
          }) == 0);
  redis_store store{store_options()};
  engine b{store};
  CHECK(total(b.serve(2, with_question(doc, 12))) == 9);
  CHECK(store.stats().pages_read == 9);
}

TEST_CASE("remote: a damaged value is a miss from that page on, recomputed, never wrong KV", "[cpu][redis][controller]")
{
  redis_store store{store_options()};
  tokens_t const doc = document(3, 10);
  {
    engine a{store};
    a.serve(1, with_question(doc, 20));
  }
  // Damage page 4's value in the store.
  auto const keys = chain_content_keys(doc, geo.page_tokens);
  std::string const name = store.key_name(keys[4]);
  bool damaged = false;
  for (int i : cluster().masters()) {
    auto r = cluster().command(i, "SETRANGE %b 200 \x55\x55\x55", name.data(), name.size());
    damaged = damaged || (r && r->type == REDIS_REPLY_INTEGER);
  }
  REQUIRE(damaged);
  engine b{store, 64, 32, prefetch_mode::off};  // the load itself reads the remote tier
  auto const first = b.serve(2, with_question(doc, 21));
  CHECK(total(first) <= 4);  // pages 0-3 may come from the remote tier; 4 on are recomputed
  CHECK(store.stats().pages_rejected >= 1);
  CHECK(b.cache.stats().failed_transfers + b.cache.stats().discarded_pages >= 1);
  // Served again: its pages (recomputed) are on the device now.
  auto const again = b.serve(3, with_question(doc, 22));
  CHECK(total(again) == 10);
}

TEST_CASE("remote: another namespace shares nothing; an unreachable store is computed around",
          "[cpu][redis][controller]")
{
  redis_store store{store_options()};
  tokens_t const doc = document(4, 6);
  {
    engine a{store};
    a.serve(1, with_question(doc, 30));
  }
  redis_store fp16{store_options("fp16")};
  engine other{fp16};
  CHECK(total(other.serve(2, with_question(doc, 31))) == 0);
  CHECK(other.cache.stats().remote_found_pages == 0);

  // A store whose only server went away: the lookup answers "nothing" within its retry budget.
  redis_servers one = redis_servers::standalone();
  redis_store_options o = store_options();
  o.nodes = {one.address(0)};
  o.retry_budget = std::chrono::milliseconds(200);
  redis_store lonely{o};
  {
    engine a{lonely};
    a.serve(3, with_question(doc, 32));
  }
  one.kill(0);
  engine b{lonely};
  CHECK(total(b.serve(4, with_question(doc, 33))) == 0);
  CHECK(b.cache.stats().remote_lookups == 1);
  CHECK(b.cache.stats().remote_found_pages == 0);
}

TEST_CASE("remote: a request released while its lookup is out leaves nothing behind", "[cpu][redis][controller]")
{
  redis_store store{store_options()};
  tokens_t const doc = document(5, 8);
  {
    engine a{store};
    a.serve(1, with_question(doc, 40));
  }
  engine b{store};
  b.cache.submit({request_id{7}, with_question(doc, 41), 0, 2, 0.0});
  CHECK(b.cache.stats().remote_lookups == 1);
  b.cache.release(request_id{7});  // before its lookup answered, most likely
  b.settle();
  b.cache.check_invariants();
  CHECK(b.cache.live_requests() == 0);
  CHECK(total(b.serve(8, with_question(doc, 42))) == 8);
}

TEST_CASE("remote: pages round-trip bit-exact whatever the engine's layout", "[cpu][redis][controller]")
{
  // Each layout's engine computes a document; a second engine of the same layout loads it from the
  // remote tier (the store keeps the host tier's page-first records, whatever the device layout).
  kv_geometry const mla_geo{2, 4, 1, 16, 2, 1};
  std::uint64_t seed = 11;
  for (auto kind : test::all_layout_kinds) {
    kv_geometry const g = kind == test::layout_kind::mla ? mla_geo : geo;
    INFO("layout " << test::to_string(kind));
    redis_store_options o = store_options();
    o.space.geometry = g;
    o.space.layout = test::to_string(kind);  // a namespace per layout: each starts empty
    redis_store store{o};
    tokens_t const doc = document(100 + std::int32_t(seed), 7);
    ++seed;
    test::with_pool(kind, g, 48, seed, [&](auto& a) {
      engine_over<std::remove_cvref_t<decltype(a.layout)>> first{a.layout, store};
      CHECK(total(first.serve(1, with_question(doc, 1))) == 0);
    });
    test::with_pool(kind, g, 48, seed + 1000, [&](auto& b) {
      engine_over<std::remove_cvref_t<decltype(b.layout)>> second{b.layout, store};
      auto const cached = second.serve(2, with_question(doc, 2));
      CHECK(total(cached) == 7);
      CHECK(cached[0] == 0);
    });
  }
}

TEST_CASE("remote: pages cheaper to recompute than to read are not adopted", "[cpu][redis][controller]")
{
  redis_store store{store_options()};
  tokens_t const doc = document(6, 10);
  {
    engine a{store};
    a.serve(1, with_question(doc, 50));
  }
  REQUIRE(store.exists(chain_content_keys(doc, geo.page_tokens)) == 10);
  engine b{store, 64, 32, prefetch_mode::wait_complete, /*reading_pays=*/false};
  CHECK(total(b.serve(2, with_question(doc, 51))) == 0);  // 1 ms a read against a tiny model's prefill
  CHECK(b.cache.stats().remote_lookups == 1);
  CHECK(b.cache.stats().remote_found_pages == 0);
  CHECK(b.cache.stats().prefetch_not_worth_pages == 10);
  CHECK(b.cache.probe(with_question(doc, 52)).tokens == 10 * geo.page_tokens);  // computed here, so held here now
}

TEST_CASE("remote: a master killed while a controller reads from the cluster: misses, never wrong KV",
          "[cpu][redis][controller]")
{
  redis_servers servers = redis_servers::cluster();
  redis_store_options o = store_options();
  o.nodes = {servers.address(0), servers.address(1)};
  redis_store store{o};
  std::vector<tokens_t> docs;
  for (std::int32_t d = 0; d < 4; ++d) {
    docs.push_back(document(200 + d, 12));
  }
  {
    engine a{store, 128, 64};
    for (std::size_t d = 0; d < docs.size(); ++d) {
      a.serve(1 + d, with_question(docs[d], 1));
    }
  }
  servers.wait_replicated();
  engine b{store, 128, 64, prefetch_mode::off};  // the loads themselves read the cluster
  // Submitted together: their lookups and loads are in flight when a master dies.
  for (std::size_t d = 0; d < docs.size(); ++d) {
    b.cache.submit({request_id{10 + d}, with_question(docs[d], 2), 0, 2, 0.0});
  }
  servers.kill(servers.masters().front());
  std::int64_t served = 0;
  for (int attempt = 0; attempt < 2000 && b.cache.live_requests() > 0; ++attempt) {
    auto h = b.cache.begin_loads(b.cache.schedule({4096, 0, 0, 0}));
    if (h.started.empty()) {
      b.settle();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    if (!wait_layer(h, 0)) {  // a load failed: clean misses, the requests wait again
      CHECK(b.cache.complete(h));
      b.settle();
      continue;
    }
    for (auto const& st : h.started) {
      std::size_t const d = st.id.value - 10;
      tokens_t const t = with_question(docs[d], 2);
      auto const table = b.cache.page_table(st.id);
      std::int64_t cached = 0;
      for (auto c : st.cached_pages) {
        cached += c;
      }
      for (std::int64_t p = 0; p < std::int64_t(t.size()) / geo.page_tokens; ++p) {
        INFO("request " << st.id.value << " page " << p);
        if (p < cached) {
          REQUIRE(test::kv_page_ok(b.pool, geo, t, p, table[std::size_t(p)]));  // never wrong KV
        } else {
          test::write_kv_page(b.pool, geo, t, p, table[std::size_t(p)]);
        }
      }
    }
    CHECK(b.cache.complete(h));
    for (auto const& it : h.ran) {
      if (!it.last_chunk) { continue; }
      (void)b.cache.finish_prefill(it.id);
      b.cache.release(it.id);
      ++served;
    }
    b.settle();
  }
  CHECK(served == std::int64_t(docs.size()));
  b.cache.check_invariants();
  // After the failover, another instance finds the replicated pages again.
  servers.wait_until_ok();
  engine c{store};
  std::int64_t found = 0;
  for (int round = 0; round < 20 && found < 12; ++round) {
    found = total(c.serve(100 + std::uint64_t(round), with_question(docs[0], 3 + round)));
  }
  CHECK(found == 12);
}

TEST_CASE("remote_tier: a page it was not told of is never read or written", "[cpu][redis][controller]")
{
  redis_store store{store_options()};
  remote_tier_options o;
  o.remembered_keys = 64;
  remote_tier<redis_store> remote{store, geo, o};
  auto slots_of = [](tokens_t const& t) {
    std::vector<std::int64_t> s;
    for (auto k : chain_keys(t, geo.page_tokens)) {
      s.push_back(std::int64_t(k >> 1));  // the index's remote keys
    }
    return s;
  };
  std::vector<std::byte> page(std::size_t(geo.page_bytes()), std::byte{3}), back(page.size());
  std::byte const* src[] = {page.data()};
  std::byte* dst[] = {back.data()};
  bool ok[1] = {};
  // A prompt told once stays remembered while others come back over and over (the keys learned fit).
  std::vector<tokens_t> prompts;
  for (std::int32_t p = 0; p < 8; ++p) {
    prompts.push_back(document(300 + p, 4, 0));
  }
  remote.learn(prompts[0], geo.page_tokens);
  for (int round = 0; round < 200; ++round) {
    for (std::size_t p = 1; p < prompts.size(); ++p) {
      remote.learn(prompts[p], geo.page_tokens);
    }
  }
  auto const first = slots_of(prompts[0]);
  auto const keys = chain_keys(prompts[0], geo.page_tokens);
  for (std::size_t p = 0; p < first.size(); ++p) {
    std::span<std::int32_t const> const ids(prompts[0].data() + p * std::size_t(geo.page_tokens),
                                            std::size_t(geo.page_tokens));
    std::uint64_t const parent = p == 0 ? 0 : keys[p - 1];
    CHECK(remote.write({&first[p], 1}, src, {&keys[p], 1}, {&parent, 1}, ids));
    CHECK(remote.read({&first[p], 1}, dst, {&keys[p], 1}, ok));
    CHECK(back == page);
  }
  // A page of a prompt it was never told of, whose parent it does not know either: not written,
  // and reading it asks the store nothing.
  tokens_t const stranger = document(999, 2, 0);
  auto const s2 = slots_of(stranger);
  auto const k2 = chain_keys(stranger, geo.page_tokens);
  std::span<std::int32_t const> const ids2(stranger.data() + geo.page_tokens, std::size_t(geo.page_tokens));
  auto const before = store.stats();
  CHECK(!remote.write({&s2[1], 1}, src, {&k2[1], 1}, {&k2[0], 1}, ids2));
  CHECK(!remote.read({&s2[1], 1}, dst, {&k2[1], 1}, ok));
  CHECK(!ok[0]);
  CHECK(store.stats().pages_written == before.pages_written);
  CHECK(store.stats().pages_absent + store.stats().pages_read == before.pages_absent + before.pages_read);
  // Past remembered_keys, the oldest are forgotten (a miss, never another page's bytes).
  for (std::int32_t p = 0; p < 40; ++p) {
    remote.learn(document(500 + p, 4, 0), geo.page_tokens);
  }
  CHECK(!remote.read({&first[0], 1}, dst, {&keys[0], 1}, ok));
}

namespace {

/// The inverse of `detail::mix64` (xor-shifts by 33 undo themselves; odd multipliers invert mod 2^64).
std::uint64_t unmix64(std::uint64_t h)
{
  auto inverse = [](std::uint64_t a) {
    std::uint64_t x = a;  // Newton's iteration: each step doubles the bits right
    for (int i = 0; i < 6; ++i) {
      x *= 2 - a * x;
    }
    return x;
  };
  h ^= h >> 33;
  h *= inverse(0xc4ceb9fe1a85ec53ull);
  h ^= h >> 33;
  h *= inverse(0xff51afd7ed558ccdull);
  h ^= h >> 33;
  return h;
}

/// A first page of other ids whose 64-bit chain key is `target`'s (the key is not cryptographic:
/// its last two ids can be solved for), with non-negative ids.
tokens_t colliding_page(tokens_t const& target, std::int32_t seed)
{
  REQUIRE(geo.page_tokens % 2 == 0);
  std::uint64_t const want = chain_keys(target, geo.page_tokens)[0];
  for (std::int32_t attempt = 0;; ++attempt) {
    tokens_t b(std::size_t(geo.page_tokens));
    for (std::size_t i = 0; i + 2 < b.size(); ++i) {
      b[i] = 7'000'000 + seed * 1000 + attempt * 10 + std::int32_t(i);
    }
    std::uint64_t h = detail::mix64(0x9e3779b97f4a7c15ull);  // chain_key's state for a first page
    for (std::size_t i = 0; i + 2 < b.size(); i += 2) {
      std::uint64_t w;
      std::memcpy(&w, b.data() + i, sizeof w);
      h = (h ^ w) * 0x100000001b3ull + (h >> 29);
    }
    std::uint64_t const inv_p = [] {
      std::uint64_t a = 0x100000001b3ull, x = a;
      for (int i = 0; i < 6; ++i) {
        x *= 2 - a * x;
      }
      return x;
    }();
    std::uint64_t const w = h ^ ((unmix64(want) - (h >> 29)) * inv_p);
    std::memcpy(b.data() + b.size() - 2, &w, sizeof w);
    if (b[b.size() - 2] >= 0 && b[b.size() - 1] >= 0) {
      REQUIRE(chain_keys(b, geo.page_tokens)[0] == want);
      return b;
    }
  }
}

}  // namespace

TEST_CASE("remote_tier: two prefixes whose index keys collide never read each other's pages",
          "[cpu][redis][controller]")
{
  redis_store store{store_options()};
  tokens_t const a = document(4242, 1, 0);
  tokens_t const b = colliding_page(a, 1);
  REQUIRE(a != b);
  std::int64_t const slot = std::int64_t(chain_keys(a, geo.page_tokens)[0] >> 1);
  std::uint64_t const key = chain_keys(a, geo.page_tokens)[0];
  // Both pages are in the shared store under their own content keys (another instance wrote B's).
  std::vector<std::byte> page_a(std::size_t(geo.page_bytes()), std::byte{0xa}),
      page_b(std::size_t(geo.page_bytes()), std::byte{0xb}), back(page_a.size());
  for (auto const& [t, bytes] : {std::pair{&a, &page_a}, std::pair{&b, &page_b}}) {
    keyed_page const pg{chain_content_keys(*t, geo.page_tokens)[0], *t};
    std::byte const* src[] = {bytes->data()};
    bool ok[1] = {};
    REQUIRE(store.set({&pg, 1}, src, ok) == 1);
  }
  std::byte* dst[] = {back.data()};
  bool ok[1] = {};
  {  // told of A alone: A's node reads A's page
    remote_tier<redis_store> remote{store, geo};
    remote.learn(a, geo.page_tokens);
    CHECK(remote.read({&slot, 1}, dst, {&key, 1}, ok));
    CHECK(back == page_a);
  }
  for (bool a_first : {true, false}) {
    // Told of both (in either order): the index key is ambiguous, a miss, and nothing is written.
    remote_tier<redis_store> remote{store, geo};
    remote.learn(a_first ? a : b, geo.page_tokens);
    remote.learn(a_first ? b : a, geo.page_tokens);
    std::fill(back.begin(), back.end(), std::byte{0});
    CHECK(!remote.read({&slot, 1}, dst, {&key, 1}, ok));
    CHECK(!ok[0]);
    std::uint64_t const parent = 0;
    std::byte const* src[] = {page_a.data()};
    auto const before = store.stats().pages_written;
    CHECK(!remote.write({&slot, 1}, src, {&key, 1}, {&parent, 1}, a));
    CHECK(store.stats().pages_written == before);
  }
}

TEST_CASE("remote: random engine loops, two engines in turn, every page right and no failed copy",
          "[cpu][redis][controller]")
{
  redis_store store{store_options()};
  std::mt19937 rng(5);
  std::vector<tokens_t> docs;
  for (std::int32_t d = 0; d < 4; ++d) {
    docs.push_back(document(400 + d, 6 + std::int64_t(rng() % 8), 0));
  }
  auto run = [&](engine& e, std::uint64_t first_id) {
    for (std::uint64_t r = 0; r < 30; ++r) {
      tokens_t t = docs[rng() % docs.size()];
      for (std::int64_t q = 0, n = 5 + std::int64_t(rng() % 40); q < n; ++q) {
        t.push_back(30000 + std::int32_t(rng() % 500));
      }
      (void)e.serve(first_id + r, t);
      if (r % 5 == 4) { (void)e.cache.evict(tier::device, std::int64_t(rng() % 6)); }
    }
    e.settle();
    return e.cache.stats();
  };

  {
    engine a{store, 28, 12};
    auto const s = run(a, 1);
    INFO("first: failed transfers " << s.failed_transfers << ", discarded " << s.discarded_pages);
    CHECK(s.failed_transfers == 0);
  }
  engine b{store, 28, 12};
  auto const s = run(b, 1000);
  auto const st = store.stats();
  INFO("second: failed transfers " << s.failed_transfers << ", discarded " << s.discarded_pages << ", found "
                                   << s.remote_found_pages << "; store: absent " << st.pages_absent << ", rejected "
                                   << st.pages_rejected << ", unanswered " << st.pages_unanswered << ", written "
                                   << st.pages_written << ", read " << st.pages_read);
  CHECK(s.remote_found_pages > 0);
  CHECK(s.failed_transfers == 0);
}
