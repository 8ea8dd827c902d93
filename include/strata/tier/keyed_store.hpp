// SPDX-License-Identifier: Apache-2.0
/**
 * @file tier/keyed_store.hpp
 * @brief Stores addressed by content, shared by engine instances: the remote tier (Redis Cluster)
 *        and the engines' plug-in points. A page is named by a 128-bit key chained over its prefix
 *        and a namespace of everything its bytes depend on; its record keeps the key, the namespace,
 *        the page's ids and a checksum, so that a collision, another model's page or a damaged value
 *        is a miss, never wrong bytes.
 *
 * The three operations are the ones every engine's storage hook has: how many leading pages of a
 * prefix exist (`exists`), read these pages into these host addresses (`get`), write these pages
 * from these (`set`). Each is one batch, reports each page on its own, and never throws for a
 * page the store cannot serve.
 */
#pragma once

#include <strata/detail/hash.hpp>
#include <strata/error.hpp>
#include <strata/geometry.hpp>
#include <strata/tier/concepts.hpp>
#include <strata/tier/detail/crc32c.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace strata {

/// @brief A 128-bit content key: a page's ids chained over its prefix (`chain_content_key`).
struct content_key {
  std::uint64_t hi{};
  std::uint64_t lo{};
  friend constexpr bool operator==(content_key const&, content_key const&) = default;
};

/**
 * @brief The content key of one page: two independent 64-bit chains over the page's ids and the
 *        key of the page before it (`{}` for a prompt's first page). Equal keys mean equal prefixes
 *        up to a collision the record's ids catch.
 */
inline content_key chain_content_key(std::span<std::int32_t const> ids, content_key parent) noexcept
{
  std::uint64_t a = detail::mix64(parent.lo + 0x243f6a8885a308d3ull);
  std::uint64_t b = detail::mix64(parent.hi + 0x13198a2e03707344ull);
  for (std::int32_t id : ids) {
    std::uint64_t const v = static_cast<std::uint32_t>(id);
    a = (a ^ v) * 0x100000001b3ull + (a >> 29);
    b = detail::mix64(b ^ (v + 0xa4093822299f31d0ull));
  }
  std::uint64_t const lo = detail::mix64(a ^ ids.size());
  return {detail::mix64(b ^ lo), lo};
}

/// @brief The content keys of every whole page of `ids`, `ids_per_page` ids each (a trailing partial page has none).
inline std::vector<content_key> chain_content_keys(std::span<std::int32_t const> ids, std::int64_t ids_per_page)
{
  std::vector<content_key> keys;
  if (ids_per_page <= 0) { return keys; }
  std::size_t const per = std::size_t(ids_per_page);
  keys.reserve(ids.size() / per);
  content_key parent{};
  for (std::size_t at = 0; at + per <= ids.size(); at += per) {
    parent = chain_content_key(ids.subspan(at, per), parent);
    keys.push_back(parent);
  }
  return keys;
}

/**
 * @brief Everything a page's bytes depend on besides its tokens. Two stores share pages only when
 *        every field is equal: a bf16 and an fp16 model of one shape, or two tensor-parallel
 *        ranks, never read each other's pages.
 */
struct store_namespace {
  std::string model;       ///< model name and revision, e.g. "meta-llama/Llama-3.1-8B"
  std::string dtype;       ///< KV element type, e.g. "bf16" (fp16 and bf16 have the same size)
  std::string layout;      ///< byte order of a record, e.g. "page_first"
  kv_geometry geometry{};  ///< page shape (page tokens, heads, head size, planes, layers)
  int tp_rank = 0;         ///< tensor-parallel rank whose heads the pages hold
  int tp_size = 1;         ///< tensor-parallel ranks
};

/// @brief The record format a keyed store writes; part of every namespace (a new format is a new namespace).
inline constexpr std::uint32_t keyed_record_version = 1;

/**
 * @brief The 128-bit name of a namespace (the record format version included).
 * @throw strata::invalid_argument for an empty model or dtype, an invalid geometry, or a rank
 *        outside `[0, tp_size)`
 */
inline content_key namespace_key(store_namespace const& ns)
{
  STRATA_EXPECTS(!ns.model.empty(), "store_namespace: model must not be empty");
  STRATA_EXPECTS(!ns.dtype.empty(), "store_namespace: dtype must not be empty");
  STRATA_EXPECTS(ns.tp_size >= 1 && ns.tp_rank >= 0 && ns.tp_rank < ns.tp_size, "store_namespace: tp_rank ", ns.tp_rank,
                 " outside [0, tp_size ", ns.tp_size, ")");
  ns.geometry.validate();
  std::vector<std::int32_t> words;
  auto text = [&](std::string const& s) {
    words.push_back(static_cast<std::int32_t>(s.size()));
    for (char c : s) {
      words.push_back(static_cast<unsigned char>(c));
    }
  };
  text(ns.model);
  text(ns.dtype);
  text(ns.layout);
  kv_geometry const& g = ns.geometry;
  for (std::int64_t v : {g.layers, g.page_tokens, g.kv_heads, g.head_dim, g.elem_bytes, g.planes}) {
    words.push_back(static_cast<std::int32_t>(v));
    words.push_back(static_cast<std::int32_t>(v >> 32));
  }
  words.push_back(ns.tp_rank);
  words.push_back(ns.tp_size);
  words.push_back(static_cast<std::int32_t>(keyed_record_version));
  return chain_content_key(words, {0x5354524154414e53ull, 0x4b45594544763031ull});
}

/// @brief One page of a batch: its key and, when the caller has them, its ids (kept in the record
///        on `set`, compared on `get`; empty: not kept, not compared).
struct keyed_page {
  content_key key{};
  std::span<std::int32_t const> ids{};
};

/**
 * @brief A store addressed by content.
 *
 * - `exists(keys)`: how many leading pages of `keys` (one prefix, in order) the store holds.
 * - `get(pages, dests, intact)`: reads each page's payload (`page_bytes()` bytes) into `dests[i]`,
 *   sets `intact[i]`; returns the pages that arrived intact. A page missing, damaged, of another
 *   namespace or key, with other ids, or on a server that does not answer in time is not intact,
 *   and its destination holds no bytes the caller may use.
 * - `set(pages, sources, written)`: writes each page from `sources[i]`, sets `written[i]`; returns
 *   the pages written.
 * Every call may come from any thread.
 */
template <class S>
concept keyed_page_store =
    requires(S& s, S const& cs, std::span<content_key const> keys, std::span<keyed_page const> pages,
             std::span<std::byte* const> dests, std::span<std::byte const* const> sources, std::span<bool> flags) {
      { cs.page_bytes() } -> std::same_as<std::int64_t>;
      { s.exists(keys) } -> std::same_as<std::int64_t>;
      { s.get(pages, dests, flags) } -> std::same_as<std::int64_t>;
      { s.set(pages, sources, flags) } -> std::same_as<std::int64_t>;
    };

/**
 * @brief A keyed store whose batches also run on its own threads: `submit_exists(keys)`,
 *        `submit_get(pages, dests)`, `submit_set(pages, sources)` return at once (the spans'
 *        contents — ids included — and buffers stay valid until the ticket completes);
 *        `poll(ticket, flags)` never blocks, `wait(ticket, flags)` does; each fills `flags` (one per
 *        key or page: held, intact, written) and returns the status (`succeeded`: every flag set); a
 *        completed ticket is consumed.
 */
template <class S>
concept async_keyed_page_store =
    keyed_page_store<S> && requires(S& s, std::span<content_key const> keys, std::span<keyed_page const> pages,
                                    std::span<std::byte* const> dests, std::span<std::byte const* const> sources,
                                    io_ticket t, std::span<bool> flags) {
      { s.submit_exists(keys) } -> std::same_as<io_ticket>;
      { s.submit_get(pages, dests) } -> std::same_as<io_ticket>;
      { s.submit_set(pages, sources) } -> std::same_as<io_ticket>;
      { s.poll(t, flags) } -> std::same_as<io_status>;
      { s.wait(t, flags) } -> std::same_as<io_status>;
    };

/// @brief What a keyed store moves, as `measure_keyed_store` found it.
struct keyed_store_rates {
  double read_bytes_per_s = 0;   ///< payload bytes per second of one `get` batch
  double write_bytes_per_s = 0;  ///< payload bytes per second of one `set` batch
  double round_trip_s = 0;       ///< seconds of an `exists` of one key (the median of 5)
};

/**
 * @brief Measures a store with scratch pages: one `set` of `pages` pages of random keys (never a
 *        real prefix's), one `get` of them back, five one-key `exists`. The rates to give the cost
 *        model (`cost_model::set_remote_tier`). The scratch pages stay until the store evicts them.
 * @throw strata::invalid_argument for `pages` < 1; strata::error when a page does not move
 */
template <keyed_page_store S>
keyed_store_rates measure_keyed_store(S& store, std::int64_t pages = 64)
{
  STRATA_EXPECTS(pages >= 1, "measure_keyed_store: pages must be at least 1, got ", pages);
  using clock = std::chrono::steady_clock;
  std::size_t const n = std::size_t(pages), bytes = std::size_t(store.page_bytes());
  std::vector<std::byte> memory(n * bytes);
  std::uint64_t seed = detail::mix64(std::uint64_t(clock::now().time_since_epoch().count()));
  for (std::size_t i = 0; i < memory.size(); i += 64) {
    memory[i] = std::byte(seed >> (i % 56));
  }
  std::vector<keyed_page> batch(n);
  std::vector<content_key> keys(n);
  std::vector<std::byte*> dests(n);
  std::vector<std::byte const*> sources(n);
  for (std::size_t i = 0; i < n; ++i) {
    seed = detail::mix64(seed + i + 1);
    keys[i] = {seed, detail::mix64(seed ^ 0x5ca1ab1eull)};
    batch[i].key = keys[i];
    dests[i] = memory.data() + i * bytes;
    sources[i] = dests[i];
  }
  std::unique_ptr<bool[]> flags(new bool[n]());
  auto seconds = [](clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); };
  keyed_store_rates r;
  auto t0 = clock::now();
  STRATA_EXPECTS_AS(error, store.set(batch, sources, {flags.get(), n}) == pages,
                    "measure_keyed_store: a scratch page was not written");
  r.write_bytes_per_s = double(n * bytes) / seconds(t0);
  t0 = clock::now();
  STRATA_EXPECTS_AS(error, store.get(batch, dests, {flags.get(), n}) == pages,
                    "measure_keyed_store: a scratch page did not come back");
  r.read_bytes_per_s = double(n * bytes) / seconds(t0);
  std::array<double, 5> trips{};
  for (double& trip : trips) {
    t0 = clock::now();
    (void)store.exists(std::span(keys).first(1));
    trip = seconds(t0);
  }
  std::sort(trips.begin(), trips.end());
  r.round_trip_s = trips[2];
  return r;
}

}  // namespace strata

#include <strata/tier/detail/keyed_record.hpp>
