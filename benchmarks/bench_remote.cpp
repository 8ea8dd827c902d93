// SPDX-License-Identifier: Apache-2.0
// The remote tier against a plain pipelined GET / SET of the same bytes, on the same servers, in
// the same run.
//
// Starts Redis servers on loopback ports (tests/support/redis_servers.hpp): a cluster of 3 masters
// without replicas (STRATA_BENCH_REDIS=standalone: one server). Each iteration moves a batch of
// Llama-3.1-8B pages (/0: 32-token pages, 4 MiB; /1: the same page of one tensor-parallel rank of 8,
// 512 KiB; 256 MiB a batch) through `redis_store` — records with
// header, ids and CRC-32C, checked on the way back and copied to the caller's memory — and then
// the very same values under the same keys, through the same cluster client (its own connections),
// as plain `GET` / `SET` (the two alternate which goes first)
// whose replies are dropped unread by anything but hiredis: `GB/s` is the store's rate,
// `plain_GB/s` the reference's, `vs_plain` their ratio. `exists` asks for a 128K-token prefix
// (4,096 pages of 32 tokens) present in full. Run with --benchmark_repetitions=5 (the default here); read the
// median rows.
#include <strata/geometry.hpp>
#include <strata/tier/redis_store.hpp>

#include "../tests/support/redis_servers.hpp"
#include "bench_main.hpp"

#include <benchmark/benchmark.h>

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

constexpr std::int64_t batch_bytes = std::int64_t{256} << 20;

strata::test::redis_servers& servers()
{
  static strata::test::redis_servers s = [] {
    char const* kind = std::getenv("STRATA_BENCH_REDIS");
    return kind && std::string(kind) == "standalone" ? strata::test::redis_servers::standalone()
                                                     : strata::test::redis_servers::cluster(3, 0);
  }();
  return s;
}

struct setup {
  strata::kv_geometry g;
  std::int64_t batch_pages;
  std::unique_ptr<strata::redis_store> store;
  std::vector<std::int32_t> tokens;
  std::vector<strata::keyed_page> pages;
  std::vector<strata::content_key> keys;
  std::vector<std::vector<std::byte>> src, dst;
  std::vector<std::byte const*> sources;
  std::vector<std::byte*> dests;
  std::vector<std::string> plain_keys;
  std::vector<std::vector<std::byte>> plain_values;  // the records the store writes, byte for byte
  std::unique_ptr<bool[]> flags;
  std::unique_ptr<strata::detail::redis::cluster> plain;

  explicit setup(int tensor_parallel)
      : g(strata::models::llama31_8b.geometry(32, 2, tensor_parallel)), batch_pages(batch_bytes / g.page_bytes())
  {
    strata::redis_store_options o;
    o.nodes = {servers().address(0)};
    o.space = {"bench", "bf16", "page_first", g, 0, int(tensor_parallel)};
    store = std::make_unique<strata::redis_store>(o);
    std::mt19937_64 rng{3};
    tokens.resize(std::size_t(batch_pages * g.page_tokens));
    for (auto& t : tokens) {
      t = std::int32_t(rng() % 128000);
    }
    keys = strata::chain_content_keys(tokens, g.page_tokens);
    for (std::int64_t p = 0; p < batch_pages; ++p) {
      pages.push_back({keys[std::size_t(p)],
                       std::span(tokens).subspan(std::size_t(p * g.page_tokens), std::size_t(g.page_tokens))});
      auto& s = src.emplace_back(std::size_t(g.page_bytes()));
      for (std::size_t i = 0; i < s.size(); i += 8) {
        std::uint64_t const v = rng();
        std::memcpy(s.data() + i, &v, 8);
      }
      sources.push_back(s.data());
      dests.push_back(dst.emplace_back(std::size_t(g.page_bytes())).data());
      // The reference moves the very values the store keeps, under the same keys (same slots).
      plain_keys.push_back(store->key_name(keys[std::size_t(p)]));
      auto& v = plain_values.emplace_back(strata::detail::keyed_record_bytes(std::size_t(g.page_tokens), 0));
      strata::content_key const ns = store->space_key();
      strata::detail::encode_keyed_record_head(v.data(), ns.hi, ns.lo, pages.back().key.hi, pages.back().key.lo,
                                               strata::keyed_record_version, pages.back().ids, s.data(),
                                               g.page_bytes());
      v.insert(v.end(), s.begin(), s.end());
    }
    flags.reset(new bool[std::size_t(batch_pages)]());
    strata::detail::redis::cluster_settings cs;
    cs.seeds = {strata::detail::redis::parse_endpoint(servers().address(0))};
    plain = std::make_unique<strata::detail::redis::cluster>(cs);
    if (store->set(pages, sources, {flags.get(), pages.size()}) != batch_pages) {
      std::fprintf(stderr, "bench_remote: the first set failed\n");
      std::exit(1);
    }
    plain_pass(true);
  }

  /// The reference: plain SET / GET of the store's values under its keys, pipelined per node in
  /// rounds of the store's `max_batch_bytes` (64 MiB: one huge pipeline is slower).
  void plain_pass(bool write)
  {
    std::int64_t ok = 0;
    std::size_t const per = std::size_t(std::max<std::int64_t>(1, (std::int64_t{64} << 20) / g.page_bytes()));
    for (std::size_t first = 0; first < plain_keys.size(); first += per) {
      std::size_t const n = std::min(per, plain_keys.size() - first);
      plain->run(
          n, [&](std::size_t i) { return std::string_view(plain_keys[first + i]); },
          [&](std::size_t i, redisContext* c) {
            auto const& k = plain_keys[first + i];
            if (write) {
              auto const& v = plain_values[first + i];
              redisAppendCommand(c, "SET %b %b", k.data(), k.size(), v.data(), v.size());
            } else {
              redisAppendCommand(c, "GET %b", k.data(), k.size());
            }
          },
          [&](std::size_t, redisReply const* r) {
            ok += r && r->type != REDIS_REPLY_ERROR && r->type != REDIS_REPLY_NIL;
          });
    }
    if (ok != std::int64_t(plain_keys.size())) {
      std::fprintf(stderr, "bench_remote: the plain pass failed\n");
      std::exit(1);
    }
  }
};

setup& shared(int which)
{
  static setup full{1}, shard{8};
  return which == 0 ? full : shard;
}

void run(benchmark::State& state, bool write)
{
  setup& s = shared(int(state.range(0)));
  double store_s = 0, plain_s = 0;
  bool store_first = true;
  for (auto _ : state) {
    std::int64_t n = 0;
    auto store_pass = [&] {
      auto const t0 = clock_type::now();
      n = write ? s.store->set(s.pages, s.sources, {s.flags.get(), s.pages.size()})
                : s.store->get(s.pages, s.dests, {s.flags.get(), s.pages.size()});
      store_s += std::chrono::duration<double>(clock_type::now() - t0).count();
    };
    auto plain_pass = [&] {
      auto const t0 = clock_type::now();
      s.plain_pass(write);
      plain_s += std::chrono::duration<double>(clock_type::now() - t0).count();
    };
    if (store_first) {
      store_pass();
      plain_pass();
    } else {
      plain_pass();
      store_pass();
    }
    store_first = !store_first;
    if (n != s.batch_pages) {
      state.SkipWithError("a page did not move");
      return;
    }
  }
  double const bytes = double(s.batch_pages * s.g.page_bytes()) * double(state.iterations());
  state.counters["GB/s"] = bytes / store_s / 1e9;
  state.counters["plain_GB/s"] = bytes / plain_s / 1e9;
  state.counters["vs_plain"] = plain_s / store_s;
}

void BM_get(benchmark::State& state) { run(state, false); }
void BM_set(benchmark::State& state) { run(state, true); }

void BM_exists_128k(benchmark::State& state)
{
  setup& s = shared(0);
  static std::vector<strata::content_key> const prefix = [&] {
    std::vector<std::int32_t> ids(std::size_t{128} << 10);  // 128K tokens
    std::mt19937 rng{5};
    for (auto& t : ids) {
      t = std::int32_t(rng() % 128000);
    }
    auto keys = strata::chain_content_keys(ids, 32);
    // Tiny values under the store's key names: `exists` looks at keys only.
    strata::detail::redis::cluster_settings cs;
    cs.seeds = {strata::detail::redis::parse_endpoint(servers().address(0))};
    strata::detail::redis::cluster c(cs);
    std::vector<std::string> names;
    for (auto const& k : keys) {
      names.push_back(s.store->key_name(k));
    }
    c.run(
        names.size(), [&](std::size_t i) { return std::string_view(names[i]); },
        [&](std::size_t i, redisContext* ctx) {
          redisAppendCommand(ctx, "SET %b x", names[i].data(), names[i].size());
        },
        [](std::size_t, redisReply const*) {});
    return keys;
  }();
  for (auto _ : state) {
    if (s.store->exists(prefix) != 4096) {
      state.SkipWithError("prefix not found");
      return;
    }
  }
  state.counters["pages"] = 4096;
}

/// hiredis' reply path (its read buffer, then a reply object: two copies) against reading the same
/// replies straight from the socket into the destination, from one server without cluster support.
void BM_reply_copies(benchmark::State& state)
{
  static strata::test::redis_servers one = strata::test::redis_servers::standalone();
  setup& s = shared(0);
  std::unique_ptr<redisContext, void (*)(redisContext*)> c(redisConnect("127.0.0.1", one.port(0)), redisFree);
  c->reader->maxbuf = 0;
  std::size_t const bytes = s.plain_values[0].size();
  std::vector<std::byte> value(bytes, std::byte{9});
  for (std::size_t i = 0; i < s.plain_keys.size(); ++i) {
    freeReplyObject(
        redisCommand(c.get(), "SET %b %b", s.plain_keys[i].data(), s.plain_keys[i].size(), value.data(), bytes));
  }
  std::vector<std::vector<std::byte>> land(s.plain_keys.size(), std::vector<std::byte>(bytes));
  auto send = [&] {
    for (auto const& k : s.plain_keys) {
      redisAppendCommand(c.get(), "GET %b", k.data(), k.size());
    }
    int done = 0;
    while (!done) {
      redisBufferWrite(c.get(), &done);
    }
  };
  auto read_exact = [&](void* to, std::size_t n) {
    auto* p = static_cast<char*>(to);
    while (n > 0) {
      ssize_t const r = ::read(c->fd, p, n);
      if (r <= 0) { std::exit(1); }
      p += r;
      n -= std::size_t(r);
    }
  };
  double hiredis_s = 0, raw_s = 0;
  for (auto _ : state) {
    auto const t0 = clock_type::now();
    send();
    for (std::size_t i = 0; i < s.plain_keys.size(); ++i) {
      void* r = nullptr;
      redisGetReply(c.get(), &r);
      auto* rr = static_cast<redisReply*>(r);
      std::memcpy(land[i].data(), rr->str, rr->len);  // to the destination, as a store must
      freeReplyObject(r);
    }
    auto const t1 = clock_type::now();
    send();
    for (std::size_t i = 0; i < s.plain_keys.size(); ++i) {
      char head[32];  // "$<len>\r\n": peeked, then consumed exactly
      ssize_t const got = ::recv(c->fd, head, sizeof head, MSG_PEEK | MSG_WAITALL);
      std::size_t const end = std::string_view(head, std::size_t(std::max<ssize_t>(got, 0))).find("\r\n");
      if (got <= 0 || end == std::string_view::npos) { std::exit(1); }
      read_exact(head, end + 2);
      read_exact(land[i].data(), bytes);
      read_exact(head, 2);
    }
    auto const t2 = clock_type::now();
    hiredis_s += std::chrono::duration<double>(t1 - t0).count();
    raw_s += std::chrono::duration<double>(t2 - t1).count();
  }
  double const total = double(bytes * s.plain_keys.size()) * double(state.iterations());
  state.counters["hiredis_GB/s"] = total / hiredis_s / 1e9;
  state.counters["raw_GB/s"] = total / raw_s / 1e9;
  state.counters["copies_share"] = 1.0 - raw_s / hiredis_s;
}

BENCHMARK(BM_get)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(4);
BENCHMARK(BM_set)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(4);
BENCHMARK(BM_exists_128k)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(10);
BENCHMARK(BM_reply_copies)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(4);

}  // namespace

int main(int argc, char** argv)
{
  strata::bench::run_benchmarks(argc, argv);
  return 0;
}
