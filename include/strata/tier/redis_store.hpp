// SPDX-License-Identifier: Apache-2.0
/**
 * @file tier/redis_store.hpp
 * @brief The remote tier: pages kept in Redis Cluster (or one Redis / Valkey server), addressed by
 *        content, shared by every engine instance that uses the same namespace.
 *
 * Needs hiredis (Debian: `libhiredis-dev`); link `strata::redis`, which `find_package(strata)`
 * defines when hiredis is found. Not part of `strata.hpp`. The key and value format, the cluster
 * behaviour and the servers' settings are in docs/remote_tier.md.
 */
#pragma once

#include <strata/detail/thread_pool.hpp>
#include <strata/error.hpp>
#include <strata/tier/concepts.hpp>
#include <strata/tier/detail/redis/cluster.hpp>
#include <strata/tier/keyed_store.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace strata {

/// @brief How a `redis_store` reaches its servers and names its pages.
struct redis_store_options {
  /// `host:port` of one or more nodes of the cluster (any of them; the others are found through
  /// `CLUSTER SLOTS`), or of one server without cluster support.
  std::vector<std::string> nodes;
  store_namespace space;              ///< what the pages' bytes depend on (part of every key and every value)
  std::string key_prefix = "strata";  ///< first part of every key (`<prefix>:<namespace>:<page key>`)
  std::chrono::milliseconds connect_timeout{250};   ///< to open one connection
  std::chrono::milliseconds command_timeout{2000};  ///< for one pipelined round's replies on a connection
  /// How long a batch keeps following redirections and reconnecting (a failover: Redis' default
  /// `cluster-node-timeout` is 15 s; the tests use 2 s) before its unanswered pages are misses, a
  /// round of `max_batch_bytes` at a time. For `submit_exists` (a lookup a request is held for) it
  /// counts from the submit: a lookup that waited it out in the queue is answered at once, a miss.
  std::chrono::milliseconds retry_budget{1000};
  std::int64_t max_batch_bytes = std::int64_t{64} << 20;  ///< value bytes in one pipelined round (≥ one page)
  /// Largest value the servers take: their `proto-max-bulk-len` (Redis' default, 512 MiB). A page
  /// whose value (header, ids, payload) is larger is refused at construction, not at every `set`.
  std::int64_t max_value_bytes = std::int64_t{512} << 20;
  /// Threads running `submit_get` / `submit_set` batches. Reads are taken from the queue first, and
  /// an idle thread takes a write while reads run (a network store has no drive to share).
  int io_threads = 2;
};

/// @brief What a `redis_store` did (monotonic).
struct redis_store_stats {
  std::int64_t pages_read = 0;          ///< pages `get` delivered intact
  std::int64_t pages_absent = 0;        ///< pages `get` asked for that the store did not hold
  std::int64_t pages_rejected = 0;      ///< values that did not check: damaged, another namespace, key or ids
  std::int64_t pages_written = 0;       ///< pages `set` stored
  std::int64_t pages_unanswered = 0;    ///< pages of any call that got no reply within the retry budget
  std::int64_t bytes_read = 0;          ///< value bytes received by `get`
  std::int64_t bytes_written = 0;       ///< value bytes sent by `set`
  std::int64_t moved = 0, ask = 0;      ///< cluster redirections followed
  std::int64_t reconnects = 0;          ///< connections dropped after an error
  std::int64_t slot_map_refreshes = 0;  ///< `CLUSTER SLOTS` asked
  std::int64_t batches_failed =
      0;  ///< batches of the store's threads that ended in an exception (no memory): every page failed
};

/**
 * @brief A `keyed_page_store` (asynchronous too) in Redis: one key per page,
 *        `<prefix>:<namespace key>:<content key>` in hex, whose value is the page's record (header,
 *        ids, payload, CRC-32C). Batches are pipelined per node, so that a batch costs one round trip
 *        per `max_batch_bytes`; commands never span slots. Every call may come from any thread.
 *
 * The store never deletes: eviction is the servers' (`maxmemory` with `maxmemory-policy
 * allkeys-lru`), and a page evicted, lost in a failover or damaged is a miss.
 */
class redis_store {
 public:
  /**
   * @param options nodes, namespace, timeouts, batch size, I/O threads
   * @throw strata::invalid_argument for no node, an address that is not host:port, an invalid
   *        namespace, a non-positive timeout, batch size or thread count
   * @throw strata::error when no node answers within `connect_timeout`
   */
  explicit redis_store(redis_store_options options)
      : options_(std::move(options)),
        ns_(namespace_key(options_.space)),
        page_bytes_(options_.space.geometry.page_bytes()),
        cluster_(settings(options_)),
        pool_(std::make_unique<detail::thread_pool>(options_.io_threads, detail::thread_pool::others_wait::no))
  {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(ns_.hi),
                  static_cast<unsigned long long>(ns_.lo));
    key_head_ = options_.key_prefix + ":" + buf + ":";
  }
  redis_store(redis_store const&) = delete;
  redis_store& operator=(redis_store const&) = delete;
  ~redis_store() { pool_.reset(); }  // runs the batches submitted, then joins

  /// @brief Bytes of a page's payload (the namespace's `geometry.page_bytes()`).
  [[nodiscard]] std::int64_t page_bytes() const noexcept { return page_bytes_; }
  /// @brief The namespace's 128-bit name.
  [[nodiscard]] content_key space_key() const noexcept { return ns_; }
  /// @brief Whether the servers are a cluster (false: one server without cluster support).
  [[nodiscard]] bool clustered() const noexcept { return cluster_.clustered(); }
  /// @brief The Redis key of a page.
  [[nodiscard]] std::string key_name(content_key k) const
  {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(k.hi),
                  static_cast<unsigned long long>(k.lo));
    return key_head_ + buf;
  }

  /// @brief How many leading pages of `keys` (one prefix, in order) the store holds: one pipelined
  ///        `EXISTS` per page, one round trip per node. A value may still fail its check on `get`.
  std::int64_t exists(std::span<content_key const> keys)
  {
    std::unique_ptr<bool[]> have(new bool[keys.size()]());
    held(keys, {have.get(), keys.size()});
    std::int64_t n = 0;
    while (std::size_t(n) < keys.size() && have[std::size_t(n)]) {
      ++n;
    }
    return n;
  }

  /**
   * @brief Which of `keys` (of any prefixes, in any order) the store holds (`have[i]`); returns
   *        how many: one pipelined `EXISTS` per key, one round trip per node.
   * @throw strata::invalid_argument if the spans' sizes differ
   */
  std::int64_t contains(std::span<content_key const> keys, std::span<bool> have)
  {
    STRATA_EXPECTS(have.size() == keys.size(), "redis_store::contains: ", keys.size(), " keys, ", have.size(),
                   " flags");
    held(keys, have);
    return std::int64_t(std::count(have.begin(), have.end(), true));
  }

  /**
   * @brief Reads pages into host memory (`dests[i]`: `page_bytes()` bytes each) and says which
   *        arrived intact (`intact[i]`); returns how many did.
   * @throw strata::invalid_argument if the spans' sizes differ (nothing read)
   */
  std::int64_t get(std::span<keyed_page const> pages, std::span<std::byte* const> dests, std::span<bool> intact)
  {
    STRATA_EXPECTS(dests.size() == pages.size() && intact.size() == pages.size(), "redis_store::get: ", pages.size(),
                   " pages, ", dests.size(), " destinations, ", intact.size(), " flags");
    std::int64_t got = 0;
    for_rounds(pages, [&](std::size_t first, std::size_t count) {
      std::vector<std::string> names = key_names(pages.subspan(first, count));
      cluster_.run(
          count, [&](std::size_t i) { return std::string_view(names[i]); },
          [&](std::size_t i, redisContext* c) {
            char const* argv[] = {"GET", names[i].data()};
            std::size_t const len[] = {3, names[i].size()};
            redisAppendCommandArgv(c, 2, argv, len);
          },
          [&](std::size_t i, redisReply const* r) {
            std::size_t const p = first + i;
            intact[p] = r && accept(pages[p], r, dests[p]);
            got += intact[p] ? 1 : 0;
          });
    });
    return got;
  }

  /**
   * @brief Writes pages from host memory (`sources[i]`: `page_bytes()` bytes each), with their ids
   *        when given; sets `written[i]`; returns how many were stored.
   * @throw strata::invalid_argument if the spans' sizes differ (nothing written)
   */
  std::int64_t set(std::span<keyed_page const> pages, std::span<std::byte const* const> sources,
                   std::span<bool> written)
  {
    STRATA_EXPECTS(sources.size() == pages.size() && written.size() == pages.size(), "redis_store::set: ", pages.size(),
                   " pages, ", sources.size(), " sources, ", written.size(), " flags");
    std::int64_t stored = 0;
    for_rounds(pages, [&](std::size_t first, std::size_t count) {
      std::vector<std::string> names = key_names(pages.subspan(first, count));
      std::vector<std::vector<std::byte>> heads(count);
      for (std::size_t i = 0; i < count; ++i) {
        keyed_page const& pg = pages[first + i];
        heads[i].resize(detail::keyed_record_bytes(pg.ids.size(), 0));
        detail::encode_keyed_record_head(heads[i].data(), ns_.hi, ns_.lo, pg.key.hi, pg.key.lo, keyed_record_version,
                                         pg.ids, sources[first + i], page_bytes_);
      }
      cluster_.run(
          count, [&](std::size_t i) { return std::string_view(names[i]); },
          [&](std::size_t i, redisContext* c) { append_set(c, names[i], heads[i], sources[first + i]); },
          [&](std::size_t i, redisReply const* r) {
            std::size_t const p = first + i;
            written[p] = r && r->type == REDIS_REPLY_STATUS;
            stored += written[p] ? 1 : 0;
            if (written[p]) {
              written_.fetch_add(1);
              bytes_written_.fetch_add(std::int64_t(heads[i].size()) + page_bytes_);
            }
          });
    });
    return stored;
  }

  /// @brief `exists` on the store's threads, before every queued `submit_set`: `flags[i]` says whether
  ///        the store holds `keys[i]` (the keys stay valid until the ticket completes).
  io_ticket submit_exists(std::span<content_key const> keys)
  {
    auto const until = std::chrono::steady_clock::now() + options_.retry_budget;  // from the submit
    return submit(true, keys.size(), [this, keys, until](std::span<bool> flags) { held(keys, flags, until); });
  }
  /// @brief `get` on the store's threads, before every queued `submit_set`; see `async_keyed_page_store`.
  io_ticket submit_get(std::span<keyed_page const> pages, std::span<std::byte* const> dests)
  {
    STRATA_EXPECTS(dests.size() == pages.size(), "redis_store::submit_get: ", pages.size(), " pages, ", dests.size(),
                   " destinations");
    return submit(true, pages.size(), [this, pages, dests](std::span<bool> flags) { get(pages, dests, flags); });
  }
  /// @brief `set` on the store's threads; see `async_keyed_page_store`.
  io_ticket submit_set(std::span<keyed_page const> pages, std::span<std::byte const* const> sources)
  {
    STRATA_EXPECTS(sources.size() == pages.size(), "redis_store::submit_set: ", pages.size(), " pages, ",
                   sources.size(), " sources");
    return submit(false, pages.size(), [this, pages, sources](std::span<bool> flags) { set(pages, sources, flags); });
  }
  /// @brief The ticket's state without waiting; once complete, fills `flags` (one per page) and forgets the ticket.
  /// @throw strata::invalid_argument for a ticket not pending here, or `flags` of the wrong size (nothing consumed)
  io_status poll(io_ticket t, std::span<bool> flags) { return finish(t, flags, false); }
  /// @brief As `poll`, waiting for the ticket to complete.
  io_status wait(io_ticket t, std::span<bool> flags) { return finish(t, flags, true); }

  [[nodiscard]] redis_store_stats stats() const noexcept
  {
    auto const& c = cluster_.counters();
    return {read_.load(),        absent_.load(),      rejected_.load(),      written_.load(),
            c.unanswered.load(), bytes_read_.load(),  bytes_written_.load(), c.moved.load(),
            c.ask.load(),        c.reconnects.load(), c.refreshes.load(),    failed_batches_.load()};
  }

 private:
  struct job {
    std::unique_ptr<bool[]> flags;  // written by the worker; read once `done` (both under jobs_mutex_ then)
    std::size_t count = 0;
    bool done = false;
  };

  static detail::redis::cluster_settings settings(redis_store_options const& o)
  {
    STRATA_EXPECTS(!o.nodes.empty(), "redis_store: no node address given");
    STRATA_EXPECTS(o.connect_timeout.count() > 0 && o.command_timeout.count() > 0 && o.retry_budget.count() >= 0,
                   "redis_store: timeouts must be positive");
    STRATA_EXPECTS(o.max_batch_bytes > 0, "redis_store: max_batch_bytes must be positive, got ", o.max_batch_bytes);
    STRATA_EXPECTS(o.io_threads >= 1, "redis_store: io_threads must be at least 1, got ", o.io_threads);
    std::int64_t const payload = o.space.geometry.page_bytes();
    std::size_t const value = detail::keyed_record_bytes(std::size_t(o.space.geometry.page_tokens), payload);
    STRATA_EXPECTS(o.max_value_bytes > 0 && value <= std::uint64_t(o.max_value_bytes),
                   "redis_store: a page's value is ", value, " bytes, more than max_value_bytes (", o.max_value_bytes,
                   ", the servers' proto-max-bulk-len): use smaller pages or raise both");
    detail::redis::cluster_settings s;
    for (std::string const& n : o.nodes) {
      s.seeds.push_back(detail::redis::parse_endpoint(n));
    }
    s.connect_timeout = o.connect_timeout;
    s.command_timeout = o.command_timeout;
    s.retry_budget = o.retry_budget;
    return s;
  }

  /// `have[i]`: whether the store holds `keys[i]` (one pipelined `EXISTS` per key); `until`: when
  /// its retries end (none: `retry_budget` from now).
  void held(std::span<content_key const> keys, std::span<bool> have,
            std::optional<std::chrono::steady_clock::time_point> until = std::nullopt)
  {
    std::vector<std::string> names = key_names(keys);
    cluster_.run(
        keys.size(), [&](std::size_t i) { return std::string_view(names[i]); },
        [&](std::size_t i, redisContext* c) {
          char const* argv[] = {"EXISTS", names[i].data()};
          std::size_t const len[] = {6, names[i].size()};
          redisAppendCommandArgv(c, 2, argv, len);
        },
        [&](std::size_t i, redisReply const* r) { have[i] = r && r->type == REDIS_REPLY_INTEGER && r->integer == 1; },
        until);
  }

  template <class Page>
  std::vector<std::string> key_names(std::span<Page const> pages) const
  {
    std::vector<std::string> names;
    names.reserve(pages.size());
    for (Page const& p : pages) {
      if constexpr (std::is_same_v<Page, keyed_page>) {
        names.push_back(key_name(p.key));
      } else {
        names.push_back(key_name(p));
      }
    }
    return names;
  }

  /// Splits a batch into rounds of at most `max_batch_bytes` of values (one page at least).
  template <class F>
  void for_rounds(std::span<keyed_page const> pages, F&& round) const
  {
    std::size_t const per = std::size_t(std::max<std::int64_t>(1, options_.max_batch_bytes / page_bytes_));
    for (std::size_t first = 0; first < pages.size(); first += per) {
      round(first, std::min(per, pages.size() - first));
    }
  }

  /// `SET key value`, the value's head (header, ids) and payload appended without joining them first.
  void append_set(redisContext* c, std::string const& name, std::vector<std::byte> const& head,
                  std::byte const* payload) const
  {
    std::size_t const value = head.size() + std::size_t(page_bytes_);
    std::string cmd =
        "*3\r\n$3\r\nSET\r\n$" + std::to_string(name.size()) + "\r\n" + name + "\r\n$" + std::to_string(value) + "\r\n";
    cmd.append(reinterpret_cast<char const*>(head.data()), head.size());
    // hiredis appends formatted bytes as they are: the payload and the terminator follow the head.
    redisAppendFormattedCommand(c, cmd.data(), cmd.size());
    redisAppendFormattedCommand(c, reinterpret_cast<char const*>(payload), std::size_t(page_bytes_));
    redisAppendFormattedCommand(c, "\r\n", 2);
  }

  /// Checks a GET reply and copies its payload; counts what it saw.
  bool accept(keyed_page const& page, redisReply const* r, std::byte* dest)
  {
    if (r->type == REDIS_REPLY_NIL) {
      absent_.fetch_add(1);
      return false;
    }
    if (r->type != REDIS_REPLY_STRING) {
      rejected_.fetch_add(1);
      return false;
    }
    std::span<std::byte const> const value(reinterpret_cast<std::byte const*>(r->str), r->len);
    bytes_read_.fetch_add(std::int64_t(r->len));
    if (detail::check_keyed_record(value, ns_.hi, ns_.lo, page.key.hi, page.key.lo, keyed_record_version, page.ids,
                                   page_bytes_) != detail::keyed_record_check::ok) {
      rejected_.fetch_add(1);
      return false;
    }
    std::memcpy(dest, detail::keyed_record_payload(value), std::size_t(page_bytes_));
    read_.fetch_add(1);
    return true;
  }

  template <class F>
  io_ticket submit(bool urgent, std::size_t pages, F work)
  {
    auto j = std::make_shared<job>();
    j->flags.reset(new bool[pages + 1]());
    j->count = pages;
    io_ticket t;
    {
      std::lock_guard lock{jobs_mutex_};
      t.id = ++next_ticket_;
      jobs_.emplace(t.id, j);
    }
    try {
      pool_->post(urgent, [this, j, work = std::move(work)](int) {
        try {
          work(std::span<bool>(j->flags.get(), j->count));
        } catch (...) {  // no memory for a round's names or buffers: every page of the batch failed
          std::fill_n(j->flags.get(), j->count, false);
          failed_batches_.fetch_add(1);
        }
        std::lock_guard lock{jobs_mutex_};
        j->done = true;
        jobs_done_.notify_all();
      });
    } catch (...) {
      std::lock_guard lock{jobs_mutex_};
      jobs_.erase(t.id);
      throw;
    }
    return t;
  }

  io_status finish(io_ticket t, std::span<bool> flags, bool block)
  {
    std::unique_lock lock{jobs_mutex_};
    auto it = jobs_.find(t.id);
    STRATA_EXPECTS(it != jobs_.end(), "redis_store: ticket ", t.id, " is not pending here");
    std::shared_ptr<job> j = it->second;
    STRATA_EXPECTS(flags.size() == j->count, "redis_store: ticket ", t.id, " has ", j->count, " pages, got ",
                   flags.size(), " flags");
    if (block) {
      jobs_done_.wait(lock, [&] { return j->done; });
      it = jobs_.find(t.id);  // another thread may have taken the ticket meanwhile
      STRATA_EXPECTS(it != jobs_.end(), "redis_store: ticket ", t.id, " was consumed by another caller");
    } else if (!j->done) {
      return io_status::pending;
    }
    bool all = true;
    for (std::size_t i = 0; i < flags.size(); ++i) {
      flags[i] = j->flags[i];
      all = all && flags[i];
    }
    jobs_.erase(it);
    return all ? io_status::succeeded : io_status::failed;
  }

  redis_store_options options_;
  content_key ns_;
  std::int64_t page_bytes_;
  std::string key_head_;
  detail::redis::cluster cluster_;
  std::atomic<std::int64_t> read_{0}, absent_{0}, rejected_{0}, written_{0}, bytes_read_{0}, bytes_written_{0},
      failed_batches_{0};
  std::mutex jobs_mutex_;
  std::condition_variable jobs_done_;
  std::map<std::uint64_t, std::shared_ptr<job>> jobs_;
  std::uint64_t next_ticket_ = 0;
  std::unique_ptr<detail::thread_pool> pool_;  // last: joined first
};

static_assert(async_keyed_page_store<redis_store>);

}  // namespace strata
