// SPDX-License-Identifier: Apache-2.0
// An engine's loop around strata::cache_controller, on the CPU (runs anywhere).
//
// Host memory stands in for the GPU's KV pool, `cpu_executor` moves pages with memcpy, and the
// "model" writes deterministic bytes: page p of a conversation holds words derived from every token
// up to its end, as a real model's KV would. A few shared documents get several questions each, as
// multi-turn conversations (turn k's prompt is the document, the earlier questions and answers, and
// a new question). The engine pool holds about two documents, so prefixes are evicted to the host
// tier and loaded back. Every page a request reads from the cache is checked against the content
// function. The GPU version of this loop is engine_loop.cu; the loop beside a real model's
// layers, measured, is benchmarks/gpu/engine_loop.cu.
//
//   engine_loop [--quick]
#include <strata/cache/controller.hpp>
#include <strata/layout/layer_first.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace strata;
using tokens_t = std::vector<std::int32_t>;
using controller = cache_controller<cpu_policies<layer_first>>;
using clock_type = std::chrono::steady_clock;

/// 4 layers, 16-token pages, 2 KV heads of 32 bf16 elements, K and V: 16 KiB pages.
constexpr kv_geometry geo{4, 16, 2, 32, 2, 2};

std::uint64_t mix(std::uint64_t x)
{
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
/// What page `p` of `tokens` holds depends on every token up to the page's end.
std::uint64_t page_key(tokens_t const& tokens, std::int64_t p)
{
  std::uint64_t h = 0x9e3779b97f4a7c15ull;
  for (std::int64_t i = 0; i < (p + 1) * geo.page_tokens; ++i) {
    h = mix(h ^ std::uint64_t(std::uint32_t(tokens[std::size_t(i)])));
  }
  return h;
}
std::uint64_t word(std::uint64_t key, std::int64_t layer, std::int64_t plane, std::int64_t w)
{ return mix(key + std::uint64_t(((layer * geo.planes + plane) << 20) + w) * 0x9e3779b97f4a7c15ull); }

/// The "model" computes one layer of page `p` of `tokens` into engine page `page`.
void compute_layer(layer_first const& pool, tokens_t const& tokens, std::int64_t p, std::int64_t page,
                   std::int64_t layer)
{
  std::uint64_t const key = page_key(tokens, p);
  for (std::int64_t k = 0; k < geo.planes; ++k) {
    std::byte* b = pool.block(page, layer, k).data;
    for (std::int64_t w = 0; w < geo.block_bytes() / 8; ++w) {
      std::uint64_t const v = word(key, layer, k, w);
      std::memcpy(b + w * 8, &v, 8);
    }
  }
}
bool page_ok(layer_first const& pool, tokens_t const& tokens, std::int64_t p, std::int64_t page)
{
  std::uint64_t const key = page_key(tokens, p);
  for (std::int64_t layer = 0; layer < geo.layers; ++layer) {
    for (std::int64_t k = 0; k < geo.planes; ++k) {
      std::byte const* b = pool.block(page, layer, k).data;
      for (std::int64_t w = 0; w < geo.block_bytes() / 8; ++w) {
        std::uint64_t v;
        std::memcpy(&v, b + w * 8, 8);
        if (v != word(key, layer, k, w)) { return false; }
      }
    }
  }
  return true;
}

struct conversation {
  int document = 0;
  tokens_t history;  // the document, then every question and answer so far
  int turn = 0;      // questions asked
};

struct live_request {
  int conversation = 0;
  int turn = 0;
  tokens_t prompt;
  std::int64_t max_new = 0;
  clock_type::time_point submitted;
  std::array<std::int64_t, tier_count> cached_pages{};
  bool started = false;
  bool prefilled = false;
};

}  // namespace

int main(int argc, char** argv)
{
  bool const quick = argc > 1 && std::string(argv[1]) == "--quick";
  int const documents = 3;
  int const questions = quick ? 2 : 4;
  std::int64_t const doc_tokens = quick ? 512 : 1024;
  std::int64_t const device_pages = 2 * doc_tokens / geo.page_tokens + 16;  // about two documents
  std::int64_t const host_pages = 8 * doc_tokens / geo.page_tokens;

  // The engine's KV pool (host memory standing in for the GPU's) and the controller over it.
  std::vector<std::byte> memory(std::size_t(device_pages * geo.page_bytes()));
  layer_first const pool{memory.data(), geo, device_pages};
  controller cache{pool, host_pages};  // the default two-tier stack: this pool and a host tier

  std::mt19937_64 rng{42};
  std::vector<tokens_t> docs(documents);
  for (auto& d : docs) {
    d.resize(std::size_t(doc_tokens));
    for (auto& t : d) {
      t = std::int32_t(rng() % 30000);
    }
  }
  std::vector<conversation> convs;
  for (int c = 0; c < 2 * documents; ++c) {  // two conversations per document
    convs.push_back({c % documents, docs[std::size_t(c % documents)], 0});
  }

  std::map<std::uint64_t, live_request> live;
  std::vector<bool> busy(convs.size(), false);
  std::uint64_t next_id = 1;
  std::int64_t served = 0, checked = 0, bad = 0;
  std::int64_t const total = std::int64_t(convs.size()) * questions;

  std::printf(
      "engine_loop (CPU): %d documents of %lld tokens, %zu conversations x %d questions, engine pool %lld "
      "pages (%lld tokens), host tier %lld pages\n",
      documents, (long long)doc_tokens, convs.size(), questions, (long long)device_pages,
      (long long)(device_pages * geo.page_tokens), (long long)host_pages);

  for (int step = 0; served < total && step < 100000; ++step) {
    // Arrivals: each idle conversation asks its next question (prompt = history + question).
    for (std::size_t c = 0; c < convs.size(); ++c) {
      if (busy[c] || convs[c].turn >= questions || rng() % 3 != 0) { continue; }
      live_request r;
      r.conversation = int(c);
      r.turn = ++convs[c].turn;
      r.prompt = convs[c].history;
      for (int i = 0; i < 20 + int(rng() % 80); ++i) {
        r.prompt.push_back(std::int32_t(30000 + rng() % 1000));
      }
      r.max_new = std::int64_t(16 + rng() % 48);
      r.submitted = clock_type::now();
      std::uint64_t const id = next_id++;
      cache.submit({request_id{id}, r.prompt, 0, r.max_new, 0.0});
      live.emplace(id, std::move(r));
      busy[c] = true;
    }

    // One batch: the strategy's plan, its loads, then layer by layer the "model".
    batch_plan const plan = cache.schedule({4096, 0, 0, 0});
    auto loads = cache.begin_loads(plan);
    for (auto const& s : loads.started) {
      live_request& r = live.at(s.id.value);
      r.started = true;
      r.cached_pages = s.cached_pages;
    }
    for (std::int64_t layer = 0; layer < geo.layers; ++layer) {
      // A GPU engine waits here for this layer's loads: strata::wait_layer(loads, layer, stream).
      for (auto const& it : loads.ran) {
        live_request const& r = live.at(it.id.value);
        auto const table = cache.page_table(it.id);
        std::int64_t const first = it.context_tokens / geo.page_tokens;
        std::int64_t const end = (it.context_tokens + it.chunk_tokens) / geo.page_tokens;
        for (std::int64_t p = first; p < end; ++p) {
          compute_layer(pool, r.prompt, p, table[std::size_t(p)], layer);
        }
      }
    }
    (void)cache.complete(loads);

    // Requests whose last chunk ran: first token out, prompt into the cache, then "decode".
    for (auto const& it : loads.ran) {
      if (!it.last_chunk) { continue; }
      std::uint64_t const id = it.id.value;
      live_request& r = live.at(id);
      std::int64_t cached = 0;
      for (auto n : r.cached_pages) {
        cached += n;
      }
      auto const table = cache.page_table(it.id);
      for (std::int64_t p = 0; p < cached; ++p) {  // what the cache gave must be what the model computed
        bad += page_ok(pool, r.prompt, p, table[std::size_t(p)]) ? 0 : 1;
        ++checked;
      }
      // Pages the table now shares with another batch's load must have landed before decoding
      // reads them; if that load failed they hold garbage: release and submit the turn again.
      if (!wait_after(cache.finish_prefill(it.id))) {
        cache.release(it.id);
        busy[std::size_t(r.conversation)] = false;
        live.erase(id);
        continue;
      }
      double const ttft_ms = std::chrono::duration<double, std::milli>(clock_type::now() - r.submitted).count();
      std::printf(
          "request %3llu  doc %d turn %d: %5zu prompt tokens, cached pages device %3lld host %3lld, "
          "computed %4lld tokens, TTFT %7.3f ms\n",
          (unsigned long long)id, convs[std::size_t(r.conversation)].document, r.turn, r.prompt.size(),
          (long long)r.cached_pages[0], (long long)r.cached_pages[1],
          (long long)(std::int64_t(r.prompt.size()) - cached * geo.page_tokens), ttft_ms);
      // Decode: the answer's tokens, their pages computed, then released with prompt + answer
      // cached for the next turn.
      tokens_t all = r.prompt;
      for (std::int64_t i = 0; i < r.max_new; ++i) {
        all.push_back(std::int32_t(31000 + (id * 7 + std::uint64_t(i)) % 97));
      }
      auto const full = cache.page_table(it.id);
      for (std::int64_t p = std::int64_t(r.prompt.size()) / geo.page_tokens;
           p < std::int64_t(all.size()) / geo.page_tokens; ++p) {
        for (std::int64_t layer = 0; layer < geo.layers; ++layer) {
          compute_layer(pool, all, p, full[std::size_t(p)], layer);
        }
      }
      cache.release(it.id, all);
      conversation& c = convs[std::size_t(r.conversation)];
      c.history = all;
      busy[std::size_t(r.conversation)] = false;
      live.erase(id);
      ++served;
    }
    (void)cache.poll();  // a GPU engine polls from a helper thread
  }

  cache_stats const s = cache.stats();
  std::printf("hit tokens: device %lld, host %lld; computed %lld\n", (long long)s.hit_tokens[0],
              (long long)s.hit_tokens[1], (long long)s.computed_tokens);
  std::printf("bytes moved: host->device %lld, device->host %lld; evicted pages: device %lld, host %lld\n",
              (long long)s.bytes_moved[1][0], (long long)s.bytes_moved[0][1], (long long)s.evicted_pages[0],
              (long long)s.evicted_pages[1]);
  cache.check_invariants();
  if (served != total || bad != 0 || s.hit_tokens[1] == 0 || checked == 0) {
    std::printf(
        "engine_loop: FAILED (%lld of %lld requests served, %lld of %lld cached pages wrong, %lld host hit "
        "tokens)\n",
        (long long)served, (long long)total, (long long)bad, (long long)checked, (long long)s.hit_tokens[1]);
    return 1;
  }
  std::printf("engine_loop: all %lld requests served, %lld cached pages checked, every KV byte right\n",
              (long long)served, (long long)checked);
  return 0;
}
