// SPDX-License-Identifier: Apache-2.0
/**
 * @file cache/remote_tier.hpp
 * @brief A shared keyed store (`redis_store`) as a cache controller's remote tier.
 *
 * The prefix index names a remote page by its 64-bit chain key; a shared store names it by a
 * 128-bit content key every instance computes from the same tokens. `remote_tier` maps one to the
 * other: the controller tells it every submitted prompt (`learn`, `submit_lookup`), its copies read
 * and write pages through it like records of any record tier, and it asks the store which leading
 * pages of a prompt exist, so that pages other instances computed become remote hits here.
 */
#pragma once

#include <strata/error.hpp>
#include <strata/geometry.hpp>
#include <strata/index/page_key.hpp>
#include <strata/tier/concepts.hpp>
#include <strata/tier/keyed_store.hpp>
#include <strata/tier/slot_allocator.hpp>
#include <strata/types.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace strata {

/// @brief How a `remote_tier` sizes what it knows.
struct remote_tier_options {
  /// Remote pages the controller's index may know of at once (its remote capacity): pages it wrote
  /// and pages lookups found. Past it, no more are written or adopted.
  std::int64_t pages = std::int64_t{1} << 22;
  /// Index keys whose content keys it remembers (from the prompts it was told, the oldest
  /// forgotten first): a page whose key it forgot is a miss, and is not written.
  std::int64_t remembered_keys = std::int64_t{1} << 22;
};

/**
 * @brief A remote tier a controller asks about each prompt it is given: `learn(ids, ids_per_page)`
 *        (the content keys of its pages), `submit_lookup(ids, ids_per_page)` (which of its leading
 *        pages the shared store holds, on the store's threads) and `poll_lookup(ticket)` (the count,
 *        once known). A `cache_controller` whose remote tier is one holds each submitted request
 *        back until its lookup answered, then adopts the pages found as remote-resident.
 */
template <class S>
concept prompt_lookup_store = requires(S& s, std::span<std::int32_t const> ids, std::int64_t n, io_ticket t) {
  s.learn(ids, n);
  { s.submit_lookup(ids, n) } -> std::same_as<io_ticket>;
  { s.poll_lookup(t) } -> std::same_as<std::optional<std::int64_t>>;
};

/**
 * @brief The remote tier of a `cache_controller` over an `async_keyed_page_store` (held by
 *        reference: one store may serve several controllers). An `async_record_store` of
 *        `tier::remote` whose "slots" are the index's remote keys. Movable; every call may come
 *        from any thread.
 */
template <async_keyed_page_store Store>
class remote_tier {
 public:
  static constexpr tier kind = tier::remote;
  static constexpr std::int64_t max_record_ids = std::numeric_limits<std::int32_t>::max();

  /**
   * @param store the shared store (outlives the tier)
   * @param geometry the page shape (its `page_bytes()` must be the store's)
   * @throw strata::invalid_argument for another page size or non-positive sizes
   */
  remote_tier(Store& store, kv_geometry const& geometry, remote_tier_options options = {})
      : store_(&store), geometry_((geometry.validate(), geometry)), options_(options), state_(std::make_unique<state>())
  {
    STRATA_EXPECTS(geometry.page_bytes() == store.page_bytes(), "remote_tier: pages of ", geometry.page_bytes(),
                   " bytes, the store's are ", store.page_bytes());
    STRATA_EXPECTS(options.pages > 0 && options.remembered_keys > 0,
                   "remote_tier: pages and remembered_keys must be positive");
  }
  remote_tier(remote_tier&&) noexcept = default;
  remote_tier& operator=(remote_tier&&) = delete;
  remote_tier(remote_tier const&) = delete;
  remote_tier& operator=(remote_tier const&) = delete;
  /// Waits for the store's batches it started (they point into its memory).
  ~remote_tier()
  {
    if (!state_) { return; }
    for (auto& [id, pending] : state_->jobs) {
      try {
        (void)store_->wait(io_ticket{id}, std::span<bool>(pending.flags.get(), pending.batch()));
      } catch (...) {  // consumed by another caller: it has ended, nothing points into this tier
      }
    }
  }

  [[nodiscard]] kv_geometry geometry() const noexcept { return geometry_; }
  [[nodiscard]] std::int64_t capacity() const noexcept { return options_.pages; }
  /// @brief Unused: remote pages are named by their keys, not by slots.
  [[nodiscard]] slot_allocator& slots() noexcept { return unused_; }
  [[nodiscard]] Store& store() noexcept { return *store_; }

  /// @brief Remembers the content keys of every whole page of a prompt (`ids_per_page` ids each).
  void learn(std::span<std::int32_t const> ids, std::int64_t ids_per_page)
  {
    auto const index_keys = chain_keys(ids, ids_per_page);
    auto const content = chain_content_keys(ids, ids_per_page);
    std::lock_guard lock{state_->mutex};
    for (std::size_t p = 0; p < index_keys.size(); ++p) {
      remember(remote_slot(index_keys[p]), content[p]);
    }
  }

  /// @brief Learns a prompt and asks the store, on its threads, which of its pages it holds.
  io_ticket submit_lookup(std::span<std::int32_t const> ids, std::int64_t ids_per_page)
  {
    learn(ids, ids_per_page);
    job j;
    j.keys = chain_content_keys(ids, ids_per_page);
    j.count = j.keys.size();
    return start(std::move(j), [&](job& x) { return store_->submit_exists(x.keys); });
  }
  /// @brief The leading pages a lookup found, once it completed (then the ticket is consumed).
  std::optional<std::int64_t> poll_lookup(io_ticket t)
  {
    std::optional<job> j = finish(t, false);
    if (!j) { return std::nullopt; }
    std::int64_t found = 0;
    while (std::size_t(found) < j->keys.size() && j->flags[std::size_t(found)]) {
      ++found;
    }
    return found;
  }

  // --- the record store (slots: the index's remote keys) --------------------------------------------

  bool read(std::span<std::int64_t const> slots, std::span<std::byte* const> records)
  { return read(slots, records, {}); }
  bool read(std::span<std::int64_t const> slots, std::span<std::byte* const> records,
            std::span<std::uint64_t const> expected_keys)
  {
    std::unique_ptr<bool[]> intact(new bool[slots.size()]());
    return read(slots, records, expected_keys, {intact.get(), slots.size()});
  }
  bool read(std::span<std::int64_t const> slots, std::span<std::byte* const> records,
            std::span<std::uint64_t const> expected_keys, std::span<bool> intact)
  {
    job const j = read_job(slots, expected_keys, records);
    std::unique_ptr<bool[]> got(new bool[j.pages.size() + 1]());
    (void)store_->get(j.pages, j.dests, {got.get(), j.pages.size()});
    return spread(j, got.get(), intact);
  }
  bool write(std::span<std::int64_t const> slots, std::span<std::byte const* const> sources)
  { return write(slots, sources, {}, {}, {}); }
  bool write(std::span<std::int64_t const> slots, std::span<std::byte const* const> sources,
             std::span<std::uint64_t const> /*keys: the slots*/, std::span<std::uint64_t const> parent_keys,
             std::span<std::int32_t const> ids)
  {
    job const j = write_job(slots, sources, parent_keys, ids);
    std::unique_ptr<bool[]> ok(new bool[j.pages.size() + 1]());
    (void)store_->set(j.pages, j.sources, {ok.get(), j.pages.size()});
    return spread(j, ok.get(), {});
  }
  io_ticket submit_read(std::span<std::int64_t const> slots, std::span<std::byte* const> records,
                        std::span<std::uint64_t const> expected_keys)
  {
    return start(read_job(slots, expected_keys, records), [&](job& x) { return store_->submit_get(x.pages, x.dests); });
  }
  io_ticket submit_write(std::span<std::int64_t const> slots, std::span<std::byte const* const> sources,
                         std::span<std::uint64_t const> /*keys*/, std::span<std::uint64_t const> parent_keys,
                         std::span<std::int32_t const> ids)
  {
    return start(write_job(slots, sources, parent_keys, ids),
                 [&](job& x) { return store_->submit_set(x.pages, x.sources); });
  }
  io_status poll(io_ticket t, std::span<bool> intact) { return finish_records(t, false, intact); }
  bool wait(io_ticket t, std::span<bool> intact) { return finish_records(t, true, intact) == io_status::succeeded; }

 private:
  struct job {
    std::vector<content_key> keys;          // a lookup's
    std::vector<keyed_page> pages;          // a read's or a write's
    std::vector<std::int32_t> ids;          // a write's pages' ids
    std::vector<std::byte*> dests;          // a read's destinations
    std::vector<std::byte const*> sources;  // a write's sources
    std::vector<std::size_t> asked;         // a read's or a write's: positions of `pages` in the caller's batch
    std::unique_ptr<bool[]> flags;          // the store's, one per key or page asked
    std::size_t count = 0;                  // the caller's batch
    [[nodiscard]] std::size_t batch() const noexcept { return keys.empty() ? pages.size() : keys.size(); }
  };
  struct state {
    std::mutex mutex;
    struct known_key {
      content_key key;
      std::uint64_t stamp = 0;
      bool ambiguous = false;  // two prompts' pages share the index key: neither is read nor written
    };
    std::unordered_map<std::int64_t, known_key> content;       // slot -> key
    std::deque<std::pair<std::int64_t, std::uint64_t>> order;  // oldest first
    std::uint64_t stamp = 0;
    std::map<std::uint64_t, job> jobs;  // by ticket
  };

  static std::int64_t remote_slot(std::uint64_t index_key) noexcept { return std::int64_t(index_key >> 1); }

  /// Under the mutex. Past `remembered_keys`, the key learned longest ago is forgotten; the log of
  /// what was learned when is compacted (never forgetting a live key) once it is twice their number.
  /// Two content keys for one index key (pages of two prefixes whose 64-bit chain keys collide,
  /// which the index tells apart by their tokens but the remote tier cannot) make it ambiguous until
  /// forgotten: such a page is a remote miss, never another prefix's bytes.
  void remember(std::int64_t slot, content_key key)
  {
    auto& s = *state_;
    auto [at, fresh] = s.content.try_emplace(slot);
    at->second.ambiguous = !fresh && (at->second.ambiguous || at->second.key != key);
    at->second.key = key;
    at->second.stamp = ++s.stamp;
    s.order.emplace_back(slot, s.stamp);
    auto live = [&](std::pair<std::int64_t, std::uint64_t> const& e) {
      auto const it = s.content.find(e.first);
      return it != s.content.end() && it->second.stamp == e.second;
    };
    while (std::int64_t(s.content.size()) > options_.remembered_keys) {
      auto const front = s.order.front();
      s.order.pop_front();
      if (live(front)) { s.content.erase(front.first); }
    }
    if (s.order.size() > 2 * s.content.size() + 64) {
      std::erase_if(s.order, [&](auto const& e) { return !live(e); });
    }
  }
  /// Under the mutex. The content key of a page the tier was told of; none for another, or for an
  /// ambiguous one.
  std::optional<content_key> known(std::int64_t slot) const
  {
    auto it = state_->content.find(slot);
    if (it == state_->content.end() || it->second.ambiguous) { return std::nullopt; }
    return it->second.key;
  }

  /// The pages of a read whose content keys the tier knows (`asked`: their positions); a page it
  /// does not know (or whose expected key is another slot's) is never asked for: it is a miss.
  job read_job(std::span<std::int64_t const> slots, std::span<std::uint64_t const> expected,
               std::span<std::byte* const> records)
  {
    job j;
    j.count = slots.size();
    std::lock_guard lock{state_->mutex};
    for (std::size_t i = 0; i < slots.size(); ++i) {
      bool const agrees = expected.empty() || remote_slot(expected[i]) == slots[i];
      if (auto const k = known(slots[i]); agrees && k) {
        j.asked.push_back(i);
        j.pages.push_back({*k, {}});
        j.dests.push_back(records[i]);
      }
    }
    return j;
  }

  /// The pages of a write: each one's content key (remembered, or chained from its parent's), its
  /// ids. A page whose key cannot be known (its parent's forgotten) is not written.
  job write_job(std::span<std::int64_t const> slots, std::span<std::byte const* const> sources,
                std::span<std::uint64_t const> parent_keys, std::span<std::int32_t const> ids)
  {
    job j;
    j.count = slots.size();
    std::size_t const per = slots.empty() ? 0 : ids.size() / slots.size();
    j.ids.assign(ids.begin(), ids.end());
    std::lock_guard lock{state_->mutex};
    for (std::size_t i = 0; i < slots.size(); ++i) {
      std::optional<content_key> k = known(slots[i]);
      auto const page_ids = std::span<std::int32_t const>(j.ids).subspan(i * per, per);
      if (!k && per > 0 && i < parent_keys.size()) {
        std::optional<content_key> const parent =
            parent_keys[i] == 0 ? std::optional<content_key>{content_key{}} : known(remote_slot(parent_keys[i]));
        if (parent) {
          remember(slots[i], chain_content_key(page_ids, *parent));
          k = known(slots[i]);  // none if the slot is ambiguous
        }
      }
      if (!k) { continue; }
      j.asked.push_back(i);
      j.pages.push_back({*k, page_ids});
      j.sources.push_back(sources[i]);
    }
    return j;
  }

  /// The caller's flags from the store's (`asked` positions; every other page failed); `out` may be
  /// empty (a write's caller asks only whether all went). True when every page went.
  static bool spread(job const& j, bool const* store_flags, std::span<bool> out)
  {
    std::fill(out.begin(), out.end(), false);
    for (std::size_t k = 0; k < j.asked.size() && !out.empty(); ++k) {
      out[j.asked[k]] = store_flags[k];
    }
    return j.asked.size() == j.count &&
           std::all_of(store_flags, store_flags + j.asked.size(), [](bool f) { return f; });
  }

  template <class Submit>
  io_ticket start(job&& j, Submit&& submit)
  {
    std::size_t const n = j.keys.empty() ? j.pages.size() : j.keys.size();  // the store's batch
    j.flags.reset(new bool[n + 1]());
    io_ticket const t = submit(j);  // throws: nothing kept
    // Moving a vector keeps its buffer: the spans the store holds stay valid in the map.
    try {
      std::lock_guard lock{state_->mutex};
      state_->jobs.emplace(t.id, std::move(j));
    } catch (...) {  // no memory for the entry: the batch must end before its buffers go
      (void)store_->wait(t, std::span<bool>(j.flags.get(), n));
      throw;
    }
    return t;
  }

  /// Polls or waits for a ticket; once complete, hands over its job and forgets it.
  /// @throw strata::invalid_argument for a ticket not pending here, or `flags` neither empty nor one
  ///        per page (nothing consumed)
  std::optional<job> finish(io_ticket t, bool block, std::size_t flags = 0)
  {
    bool* raw;
    std::size_t n;
    {
      std::lock_guard lock{state_->mutex};
      auto it = state_->jobs.find(t.id);
      STRATA_EXPECTS(it != state_->jobs.end(), "remote_tier: ticket ", t.id, " is not pending here");
      STRATA_EXPECTS(flags == 0 || flags == it->second.count, "remote_tier: ticket ", t.id, " has ", it->second.count,
                     " pages, got ", flags, " flags");
      raw = it->second.flags.get();
      n = it->second.batch();
    }
    std::span<bool> const out(raw, n);
    if ((block ? store_->wait(t, out) : store_->poll(t, out)) == io_status::pending) { return std::nullopt; }
    std::lock_guard lock{state_->mutex};
    auto it = state_->jobs.find(t.id);
    STRATA_EXPECTS(it != state_->jobs.end(), "remote_tier: ticket ", t.id, " was consumed by another caller");
    job j = std::move(it->second);
    state_->jobs.erase(it);
    return j;
  }
  io_status finish_records(io_ticket t, bool block, std::span<bool> intact)
  {
    std::optional<job> j = finish(t, block, intact.size());
    if (!j) { return io_status::pending; }
    return spread(*j, j->flags.get(), intact) ? io_status::succeeded : io_status::failed;
  }

  Store* store_;
  kv_geometry geometry_;
  remote_tier_options options_;
  std::unique_ptr<state> state_;
  slot_allocator unused_{1};
};

}  // namespace strata
