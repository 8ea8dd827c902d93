// SPDX-License-Identifier: Apache-2.0
/**
 * @file tier/detail/redis/cluster.hpp
 * @brief A Redis Cluster client over hiredis' synchronous contexts: the slot map (`CLUSTER SLOTS`,
 *        refreshed on redirections and failures), a pool of connections per node, and batches of
 *        commands pipelined per node — every node's requests are sent before any reply is read, so
 *        the nodes work side by side — redirected (`MOVED`, `ASK`) and retried through reconnects
 *        and failovers until each command has its reply or the batch's retry budget is spent. A
 *        server without cluster support is a cluster of one node that owns every slot.
 */
#pragma once

#include <strata/error.hpp>
#include <strata/tier/detail/redis/key_slot.hpp>

#include <hiredis/hiredis.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace strata::detail::redis {

struct reply_deleter {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using reply_ptr = std::unique_ptr<redisReply, reply_deleter>;
struct context_deleter {
  void operator()(redisContext* c) const noexcept { redisFree(c); }
};
using context_ptr = std::unique_ptr<redisContext, context_deleter>;

struct endpoint {
  std::string host;
  int port = 0;
  friend bool operator==(endpoint const&, endpoint const&) = default;
  [[nodiscard]] std::string str() const { return host + ":" + std::to_string(port); }
};

/// @brief `host:port` → endpoint. @throw strata::invalid_argument naming the text
inline endpoint parse_endpoint(std::string_view text)
{
  auto const colon = text.rfind(':');
  int port = 0;
  bool const ok =
      colon != std::string_view::npos && colon > 0 &&
      std::from_chars(text.data() + colon + 1, text.data() + text.size(), port).ptr == text.data() + text.size() &&
      port > 0 && port < 65536;
  STRATA_EXPECTS(ok, "redis: node address \"", text, "\" is not host:port");
  return {std::string(text.substr(0, colon)), port};
}

/// @brief Counters of a client (monotonic, read without locks).
struct cluster_counters {
  std::atomic<std::int64_t> moved{0}, ask{0}, reconnects{0}, refreshes{0}, retries{0}, unanswered{0};
};

struct cluster_settings {
  std::vector<endpoint> seeds;
  std::chrono::milliseconds connect_timeout{250};
  std::chrono::milliseconds command_timeout{2000};
  std::chrono::milliseconds retry_budget{1000};
};

inline timeval to_timeval(std::chrono::milliseconds ms) noexcept
{ return {static_cast<time_t>(ms.count() / 1000), static_cast<suseconds_t>((ms.count() % 1000) * 1000)}; }

class cluster {
 public:
  /// @throw strata::error when no seed answers `CLUSTER SLOTS` (or, without cluster support, `PING`)
  explicit cluster(cluster_settings settings) : settings_(std::move(settings))
  {
    STRATA_EXPECTS(!settings_.seeds.empty(), "redis: no node address given");
    owner_.fill(-1);
    std::string why;
    STRATA_EXPECTS_AS(error, refresh(&why), "redis: no node answered (", why, ")");
  }

  /// @brief Whether the servers have cluster support (false: one server owns every slot).
  [[nodiscard]] bool clustered() const noexcept { return clustered_.load(); }
  [[nodiscard]] cluster_counters const& counters() const noexcept { return counters_; }

  /**
   * @brief Runs commands `0..n-1`: `key_of(i)` routes command `i`, `append(i, ctx)` appends it to a
   *        connection (`redisAppendFormattedCommand` / `redisAppendCommandArgv`), `on_reply(i, r)`
   *        gets its final reply — never a redirection or a "try again" — or nullptr when none came
   *        within the retry budget. Replies are valid only during the call. `until`: when the
   *        retries end instead of `retry_budget` from now (a batch that starts past it sends
   *        nothing: every command unanswered).
   */
  template <class KeyOf, class Append, class OnReply>
  void run(std::size_t n, KeyOf&& key_of, Append&& append, OnReply&& on_reply,
           std::optional<std::chrono::steady_clock::time_point> until = std::nullopt)
  {
    struct item {
      std::size_t index;
      int ask = -1;  // node an ASK redirection sent it to
    };
    struct lease {
      int node;
      context_ptr ctx;
      std::vector<item> items;
    };
    std::vector<item> pending(n);
    for (std::size_t i = 0; i < n; ++i) {
      pending[i].index = i;
    }
    auto const deadline = until.value_or(std::chrono::steady_clock::now() + settings_.retry_budget);
    if (until && std::chrono::steady_clock::now() >= deadline) {  // it waited its budget out in a queue
      counters_.unanswered.fetch_add(std::int64_t(n));
      for (std::size_t i = 0; i < n; ++i) {
        on_reply(i, static_cast<redisReply const*>(nullptr));
      }
      return;
    }
    auto backoff = std::chrono::milliseconds(5);
    while (!pending.empty()) {
      std::vector<lease> leases;
      std::vector<item> retry;
      bool refresh_map = false, wait = false;
      {
        std::shared_lock lock{map_mutex_};
        for (item const& it : pending) {
          int const node = it.ask >= 0 ? it.ask : owner_[std::size_t(key_slot(key_of(it.index)))];
          if (node < 0) {  // a slot no node serves (yet)
            retry.push_back(it);
            refresh_map = wait = true;
            continue;
          }
          auto l = std::find_if(leases.begin(), leases.end(), [&](lease const& x) { return x.node == node; });
          if (l == leases.end()) { l = leases.insert(leases.end(), lease{node, nullptr, {}}); }
          l->items.push_back(it);
        }
      }
      for (lease& l : leases) {  // connect and append every node's commands ...
        l.ctx = checkout(l.node);
        if (!l.ctx) {
          retry.insert(retry.end(), l.items.begin(), l.items.end());
          l.items.clear();
          refresh_map = wait = true;
          continue;
        }
        for (item const& it : l.items) {
          if (it.ask >= 0) { redisAppendCommand(l.ctx.get(), "ASKING"); }
          append(it.index, l.ctx.get());
        }
      }
      for (lease& l : leases) {  // ... send them all ...
        int done = 0;
        while (l.ctx && !done) {
          if (redisBufferWrite(l.ctx.get(), &done) != REDIS_OK) { break_lease(l, 0, retry, refresh_map, wait); }
        }
      }
      for (lease& l : leases) {  // ... then read the replies
        for (std::size_t k = 0; l.ctx && k < l.items.size(); ++k) {
          item it = l.items[k];
          reply_ptr r;
          if (it.ask >= 0) {
            r = read(l.ctx.get());
            if (!r) {
              break_lease(l, k, retry, refresh_map, wait);
              break;
            }
          }
          r = read(l.ctx.get());
          if (!r) {
            break_lease(l, k, retry, refresh_map, wait);
            break;
          }
          if (r->type == REDIS_REPLY_ERROR) {
            std::string_view const e(r->str, r->len);
            if (e.starts_with("MOVED ") || e.starts_with("ASK ")) {
              bool const moved = e.starts_with("MOVED ");
              (moved ? counters_.moved : counters_.ask).fetch_add(1);
              int const target = redirect(e, moved);
              if (target < 0) { refresh_map = true; }
              retry.push_back({it.index, moved ? -1 : target});
              continue;
            }
            if (e.starts_with("TRYAGAIN") || e.starts_with("CLUSTERDOWN") || e.starts_with("LOADING") ||
                e.starts_with("MASTERDOWN")) {
              retry.push_back({it.index, -1});
              refresh_map = wait = true;
              continue;
            }
          }
          on_reply(it.index, static_cast<redisReply const*>(r.get()));
        }
        if (l.ctx) { checkin(l.node, std::move(l.ctx)); }
      }
      if (retry.empty()) { break; }
      counters_.retries.fetch_add(std::int64_t(retry.size()));
      auto const now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        counters_.unanswered.fetch_add(std::int64_t(retry.size()));
        for (item const& it : retry) {
          on_reply(it.index, static_cast<redisReply const*>(nullptr));
        }
        break;
      }
      if (wait) {
        std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(backoff, deadline - now));
        backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
      }
      if (refresh_map) { refresh(nullptr); }
      pending = std::move(retry);
    }
  }

 private:
  struct node_entry {
    endpoint at;
    std::mutex mutex;
    std::vector<context_ptr> idle;
  };

  static reply_ptr read(redisContext* c) noexcept
  {
    void* r = nullptr;
    if (redisGetReply(c, &r) != REDIS_OK) { return nullptr; }
    return reply_ptr(static_cast<redisReply*>(r));
  }

  /// A connection failed: what it did not answer from item `k` on is retried after a refresh.
  template <class Lease, class Item>
  void break_lease(Lease& l, std::size_t k, std::vector<Item>& retry, bool& refresh_map, bool& wait)
  {
    retry.insert(retry.end(), l.items.begin() + std::ptrdiff_t(k), l.items.end());
    l.items.resize(k);
    l.ctx.reset();
    drop_idle(l.node);
    counters_.reconnects.fetch_add(1);
    refresh_map = wait = true;
  }

  context_ptr connect(endpoint const& at) const
  {
    context_ptr c(redisConnectWithTimeout(at.host.c_str(), at.port, to_timeval(settings_.connect_timeout)));
    if (!c || c->err) { return nullptr; }
    if (redisSetTimeout(c.get(), to_timeval(settings_.command_timeout)) != REDIS_OK) { return nullptr; }
    redisEnableKeepAlive(c.get());
    c->reader->maxbuf = 0;  // keep the read buffer between large replies
    return c;
  }

  context_ptr checkout(int index)
  {
    node_entry* n;
    {
      std::shared_lock lock{map_mutex_};
      n = &nodes_[std::size_t(index)];
    }
    {
      std::lock_guard lock{n->mutex};
      if (!n->idle.empty()) {
        context_ptr c = std::move(n->idle.back());
        n->idle.pop_back();
        return c;
      }
    }
    return connect(n->at);
  }
  void checkin(int index, context_ptr c)
  {
    if (c->err) { return; }
    node_entry* n;
    {
      std::shared_lock lock{map_mutex_};
      n = &nodes_[std::size_t(index)];
    }
    std::lock_guard lock{n->mutex};
    n->idle.push_back(std::move(c));
  }
  void drop_idle(int index)
  {
    std::vector<context_ptr> dropped;
    node_entry* n;
    {
      std::shared_lock lock{map_mutex_};
      n = &nodes_[std::size_t(index)];
    }
    std::lock_guard lock{n->mutex};
    dropped.swap(n->idle);
  }

  /// The node at `at` (added if new); map_mutex_ held exclusively.
  int intern(endpoint const& at)
  {
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i].at == at) { return int(i); }
    }
    nodes_.emplace_back().at = at;
    return int(nodes_.size() - 1);
  }

  /// `MOVED <slot> <host>:<port>` / `ASK ...`: the target node (-1 if unparsable); MOVED also updates the slot's owner.
  int redirect(std::string_view e, bool moved)
  {
    e.remove_prefix(e.find(' ') + 1);
    auto const space = e.find(' ');
    int slot = -1;
    if (space == std::string_view::npos || std::from_chars(e.data(), e.data() + space, slot).ec != std::errc{} ||
        slot < 0 || slot >= cluster_slots) {
      return -1;
    }
    endpoint at;
    try {
      at = parse_endpoint(e.substr(space + 1));
    } catch (strata::error const&) {
      return -1;
    }
    std::unique_lock lock{map_mutex_};
    int const target = intern(at);
    if (moved) { owner_[std::size_t(slot)] = target; }
    return target;
  }

  /// Reads the slot map from the first node that gives one (known nodes, then the seeds).
  bool refresh(std::string* why)
  {
    counters_.refreshes.fetch_add(1);
    std::vector<endpoint> ask;
    {
      std::shared_lock lock{map_mutex_};
      for (node_entry const& n : nodes_) {
        ask.push_back(n.at);
      }
    }
    for (endpoint const& s : settings_.seeds) {
      if (std::find(ask.begin(), ask.end(), s) == ask.end()) { ask.push_back(s); }
    }
    for (endpoint const& at : ask) {
      context_ptr c = connect(at);
      if (!c) {
        if (why) { *why += at.str() + ": cannot connect; "; }
        continue;
      }
      reply_ptr r(static_cast<redisReply*>(redisCommand(c.get(), "CLUSTER SLOTS")));
      if (!r) {
        if (why) { *why += at.str() + ": no reply; "; }
        continue;
      }
      if (r->type == REDIS_REPLY_ERROR) {
        if (std::string_view(r->str, r->len).find("cluster support disabled") != std::string_view::npos) {
          std::unique_lock lock{map_mutex_};
          owner_.fill(intern(at));
          clustered_ = false;
          return true;
        }
        if (why) { *why += at.str() + ": " + std::string(r->str, r->len) + "; "; }
        continue;
      }
      if (r->type != REDIS_REPLY_ARRAY || r->elements == 0) {
        if (why) { *why += at.str() + ": no slots assigned; "; }
        continue;
      }
      std::unique_lock lock{map_mutex_};
      std::array<int, cluster_slots> owner;
      owner.fill(-1);
      for (std::size_t i = 0; i < r->elements; ++i) {
        redisReply const* range = r->element[i];
        if (range->type != REDIS_REPLY_ARRAY || range->elements < 3 || range->element[2]->type != REDIS_REPLY_ARRAY ||
            range->element[2]->elements < 2) {
          continue;
        }
        redisReply const* master = range->element[2];
        std::string host(master->element[0]->str ? master->element[0]->str : "", master->element[0]->len);
        if (host.empty() || host == "?") { host = at.host; }  // "the node you asked"
        int const id = intern({host, static_cast<int>(master->element[1]->integer)});
        for (long long s = range->element[0]->integer; s <= range->element[1]->integer && s < cluster_slots; ++s) {
          if (s >= 0) { owner[std::size_t(s)] = id; }
        }
      }
      owner_ = owner;
      clustered_ = true;
      return true;
    }
    return false;
  }

  cluster_settings settings_;
  std::shared_mutex map_mutex_;
  std::deque<node_entry> nodes_;  // append-only: indices and addresses stay valid
  std::array<int, cluster_slots> owner_{};
  std::atomic<bool> clustered_{true};
  cluster_counters counters_;
};

}  // namespace strata::detail::redis
