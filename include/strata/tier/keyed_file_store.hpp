// SPDX-License-Identifier: Apache-2.0
/**
 * @file tier/keyed_file_store.hpp
 * @brief Local drives as a keyed store: pages addressed by content (`content_key`) in a
 *        `file_store` over one directory per drive, least recently used pages replaced when full,
 *        kept across restarts. What the engines' storage hooks (SGLang's HiCache L3) write to when
 *        the cache lives on local NVMe rather than in a shared Redis Cluster.
 *
 * Host-only (Linux/POSIX). Records, striping, checksums and recovery are the file tier's
 * (docs/file_tier.md); the key index, the replacement and the namespace are in docs/engines.md.
 */
#pragma once

#include <strata/error.hpp>
#include <strata/tier/file_store.hpp>
#include <strata/tier/keyed_store.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace strata {

/// @brief Where a `keyed_file_store` keeps its pages and how many.
struct keyed_file_store_options {
  /// The drives and how they are reached: `directory` or `directories` (one per drive), I/O
  /// threads, direct I/O, io_uring, `sync_writes`. Each directory gets a subdirectory per
  /// namespace (`strata-<namespace key>`), so models, dtypes and ranks can share one path.
  /// `tp_rank`, `tp_size`, `tag` and `reopen` are set from `space` (the store always reopens).
  file_store_options files;
  store_namespace space;   ///< what the pages' bytes depend on
  std::int64_t pages = 0;  ///< records the store holds (its capacity on disk: `pages` × record bytes)
};

/// @brief What a `keyed_file_store` did (monotonic).
struct keyed_file_store_stats {
  std::int64_t pages_read = 0;      ///< pages `get` delivered intact
  std::int64_t pages_absent = 0;    ///< pages `get` asked for that the store did not hold
  std::int64_t pages_rejected = 0;  ///< pages held whose record failed its check or had other ids (then forgotten)
  std::int64_t pages_written = 0;   ///< pages `set` stored
  std::int64_t pages_present = 0;   ///< pages `set` found already stored (not written again)
  std::int64_t pages_refused = 0;   ///< pages `set` could not store (no slot free of readers, or a failed write)
  std::int64_t pages_evicted = 0;   ///< pages replaced to make room (least recently used first)
};

/**
 * @brief A `keyed_page_store` on local drives: `capacity()` page records in a `file_store`, found
 *        by content key through an index in memory, rebuilt from the records on open.
 *
 * A record keeps the content key's two halves (as its key and its parent key), the page's ids
 * when every page of the `set` has the same number of them (at most `file_store::max_record_ids`)
 * and a checksum; the namespace is part of the files' configuration hash. `exists` reads only the
 * index (no I/O). `get` pins its slots while it reads (a pinned page is never replaced); a record
 * that fails its check is a miss and is forgotten. `set` skips pages already stored, takes a free
 * slot or replaces the least recently used unpinned page, and makes a page visible only once its
 * record is written. Every call may come from any thread; transfers run on the file store's
 * threads, one queue per drive.
 */
class keyed_file_store {
 public:
  /**
   * @brief Opens (creating where missing) the store's files and recovers their intact records.
   * @throw strata::invalid_argument for an invalid namespace, `pages` < 1, or bad file options
   * @throw strata::file_store_error when the files cannot be created, opened or locked, or hold
   *        another configuration (more pages than `pages`: a store of one file a drive may grow,
   *        never shrink; another file count; another drive order)
   */
  explicit keyed_file_store(keyed_file_store_options options)
      : ns_(namespace_key(options.space)),
        files_(file_store::open(checked_geometry(options), checked_pages(options), file_options(options, ns_)))
  {
    // Two records of one key (two `set`s of it raced: the later one's slot went back to the free
    // list with its record intact): the first is kept, the other's slot is free.
    std::vector<std::int64_t> duplicates;
    for (recovered_record const& r : files_.recovered()) {
      content_key const k{r.parent_key, r.key};
      auto [it, fresh] = index_.try_emplace(k);
      if (!fresh) {
        duplicates.push_back(r.slot);
        continue;
      }
      lru_.push_front(k);
      it->second = entry{r.slot, r.ids, lru_.begin(), 0};
    }
    if (!duplicates.empty()) { files_.slots().release(duplicates); }
  }
  keyed_file_store(keyed_file_store const&) = delete;
  keyed_file_store& operator=(keyed_file_store const&) = delete;

  /// @brief Bytes of a page's payload (the namespace's `geometry.page_bytes()`).
  [[nodiscard]] std::int64_t page_bytes() const noexcept { return files_.geometry().page_bytes(); }
  /// @brief Pages the store can hold.
  [[nodiscard]] std::int64_t capacity() const noexcept { return files_.capacity(); }
  /// @brief The namespace's 128-bit name.
  [[nodiscard]] content_key space_key() const noexcept { return ns_; }
  /// @brief Pages held now.
  [[nodiscard]] std::int64_t size() const
  {
    std::lock_guard lock{m_};
    return std::int64_t(index_.size());
  }
  /// @brief The file store underneath (its directories, paths, record size, last error).
  [[nodiscard]] file_store const& files() const noexcept { return files_; }
  /// @brief What the store did.
  [[nodiscard]] keyed_file_store_stats stats() const
  {
    std::lock_guard lock{m_};
    return stats_;
  }

  /// @brief How many leading pages of `keys` (one prefix, in order) the store holds (the index
  ///        only: a record may still fail its check on `get`).
  std::int64_t exists(std::span<content_key const> keys)
  {
    std::lock_guard lock{m_};
    std::int64_t n = 0;
    while (std::size_t(n) < keys.size() && index_.contains(keys[std::size_t(n)])) {
      ++n;
    }
    return n;
  }

  /**
   * @brief Which of `keys` (of any prefixes, in any order) the store holds (`have[i]`, the index
   *        only); returns how many.
   * @throw strata::invalid_argument if the spans' sizes differ
   */
  std::int64_t contains(std::span<content_key const> keys, std::span<bool> have)
  {
    STRATA_EXPECTS(have.size() == keys.size(), "keyed_file_store::contains: ", keys.size(), " keys, ", have.size(),
                   " flags");
    std::lock_guard lock{m_};
    std::int64_t n = 0;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      have[i] = index_.contains(keys[i]);
      n += have[i] ? 1 : 0;
    }
    return n;
  }

  /**
   * @brief Reads pages into host memory (`dests[i]`: `page_bytes()` bytes each) and says which
   *        arrived intact (`intact[i]`); returns how many did. A page with ids that differ from
   *        those it was stored with is not intact.
   * @throw strata::invalid_argument if the spans' sizes differ or a destination is null (nothing read)
   */
  std::int64_t get(std::span<keyed_page const> pages, std::span<std::byte* const> dests, std::span<bool> intact)
  {
    STRATA_EXPECTS(dests.size() == pages.size() && intact.size() == pages.size(),
                   "keyed_file_store::get: ", pages.size(), " pages, ", dests.size(), " destinations, ", intact.size(),
                   " flags");
    for (std::byte* d : dests) {
      STRATA_EXPECTS(d != nullptr, "keyed_file_store::get: a destination is null");
    }
    std::vector<std::size_t> at;  // pages to read, by index into `pages`
    std::vector<std::int64_t> slots;
    std::vector<std::uint64_t> lo;
    std::vector<std::byte*> to;
    std::vector<char> again(pages.size(), 0);  // listed twice (ids checked): shares the first listing's result
    {
      std::lock_guard lock{m_};
      for (std::size_t i = 0; i < pages.size(); ++i) {
        intact[i] = false;
        auto it = index_.find(pages[i].key);
        if (it == index_.end()) {
          ++stats_.pages_absent;
          continue;
        }
        entry& e = it->second;
        if (!pages[i].ids.empty() && !e.ids.empty() &&
            !std::equal(pages[i].ids.begin(), pages[i].ids.end(), e.ids.begin(), e.ids.end())) {
          ++stats_.pages_rejected;
          continue;
        }
        if (std::find(slots.begin(), slots.end(), e.slot) != slots.end()) {  // listed twice: read once
          again[i] = 1;
          continue;
        }
        ++e.readers;
        lru_.splice(lru_.begin(), lru_, e.lru);
        at.push_back(i);
        slots.push_back(e.slot);
        lo.push_back(pages[i].key.lo);
        to.push_back(dests[i]);
      }
    }
    std::unique_ptr<bool[]> ok(new bool[at.size() + 1]());
    if (!at.empty()) {
      try {
        (void)files_.read(slots, to, lo, {ok.get(), at.size()});
      } catch (...) {  // nothing read: unpin, then let the caller hear why
        std::lock_guard lock{m_};
        for (std::size_t j = 0; j < at.size(); ++j) {
          --index_.find(pages[at[j]].key)->second.readers;
        }
        throw;
      }
    }
    std::int64_t got = 0;
    std::lock_guard lock{m_};
    for (std::size_t j = 0; j < at.size(); ++j) {
      auto it = index_.find(pages[at[j]].key);
      --it->second.readers;
      if (ok[j]) {
        intact[at[j]] = true;
        ++got;
      } else {
        ++stats_.pages_rejected;
        if (it->second.readers == 0) { forget(it); }
      }
    }
    // Pages listed twice share their first listing's result.
    for (std::size_t i = 0; i < pages.size(); ++i) {
      if (!again[i]) { continue; }
      for (std::size_t j = 0; j < at.size(); ++j) {
        if (ok[j] && at[j] != i && pages[at[j]].key == pages[i].key) {
          std::memcpy(dests[i], dests[at[j]], std::size_t(page_bytes()));
          intact[i] = true;
          ++got;
          break;
        }
      }
    }
    stats_.pages_read += got;
    return got;
  }

  /**
   * @brief Writes pages from host memory (`sources[i]`: `page_bytes()` bytes each) and says which
   *        are stored (`written[i]`, true too for a page already held); returns how many are.
   * @throw strata::invalid_argument if the spans' sizes differ or a source is null (nothing written)
   */
  std::int64_t set(std::span<keyed_page const> pages, std::span<std::byte const* const> sources,
                   std::span<bool> written)
  {
    STRATA_EXPECTS(sources.size() == pages.size() && written.size() == pages.size(),
                   "keyed_file_store::set: ", pages.size(), " pages, ", sources.size(), " sources, ", written.size(),
                   " flags");
    for (std::byte const* s : sources) {
      STRATA_EXPECTS(s != nullptr, "keyed_file_store::set: a source is null");
    }
    std::vector<std::size_t> at;
    std::vector<std::int64_t> slots;
    {
      std::lock_guard lock{m_};
      for (std::size_t i = 0; i < pages.size(); ++i) {
        written[i] = false;
        auto it = index_.find(pages[i].key);
        if (it != index_.end()) {
          written[i] = true;
          ++stats_.pages_present;
          lru_.splice(lru_.begin(), lru_, it->second.lru);
          continue;
        }
        bool twice = false;
        for (std::size_t j : at) {
          twice = twice || pages[j].key == pages[i].key;
        }
        if (twice) { continue; }
        std::int64_t const s = free_slot();
        if (s < 0) {
          ++stats_.pages_refused;
          continue;
        }
        at.push_back(i);
        slots.push_back(s);
      }
    }
    if (!at.empty()) {
      std::vector<std::byte const*> from(at.size());
      std::vector<std::uint64_t> lo(at.size()), hi(at.size());
      std::vector<std::int32_t> ids;
      bool const keep_ids = uniform_ids(pages, at);
      for (std::size_t j = 0; j < at.size(); ++j) {
        keyed_page const& p = pages[at[j]];
        from[j] = sources[at[j]];
        lo[j] = p.key.lo;
        hi[j] = p.key.hi;
        if (keep_ids) { ids.insert(ids.end(), p.ids.begin(), p.ids.end()); }
      }
      bool ok = false;
      try {
        ok = files_.write(slots, from, lo, hi, ids);
      } catch (...) {  // nothing written: the slots go back, then the caller hears why
        files_.slots().release(slots);
        throw;
      }
      std::lock_guard lock{m_};
      std::vector<std::int64_t> unused;
      for (std::size_t j = 0; j < at.size(); ++j) {
        keyed_page const& p = pages[at[j]];
        if (!ok) {
          ++stats_.pages_refused;
          unused.push_back(slots[j]);
          continue;
        }
        written[at[j]] = true;
        auto [it, fresh] = index_.try_emplace(p.key);
        if (!fresh) {  // another thread stored it meanwhile
          unused.push_back(slots[j]);
          continue;
        }
        ++stats_.pages_written;
        lru_.push_front(p.key);
        it->second = entry{slots[j], {p.ids.begin(), p.ids.end()}, lru_.begin(), 0};
      }
      if (!unused.empty()) { files_.slots().release(unused); }
    }
    std::int64_t n = 0;
    for (std::size_t i = 0; i < pages.size(); ++i) {
      if (!written[i]) {  // a page listed twice: its first listing's result
        for (std::size_t j : at) {
          if (j != i && pages[j].key == pages[i].key) { written[i] = written[j]; }
        }
      }
      n += written[i] ? 1 : 0;
    }
    return n;
  }

 private:
  struct key_hash {
    std::size_t operator()(content_key const& k) const noexcept { return std::size_t(k.lo ^ (k.hi << 1)); }
  };
  struct entry {
    std::int64_t slot = -1;
    std::vector<std::int32_t> ids;
    std::list<content_key>::iterator lru;
    int readers = 0;  // `get`s reading its record now
  };
  using index_map = std::unordered_map<content_key, entry, key_hash>;

  static kv_geometry checked_geometry(keyed_file_store_options const& o)
  {
    o.space.geometry.validate();
    return o.space.geometry;
  }
  static std::int64_t checked_pages(keyed_file_store_options const& o)
  {
    STRATA_EXPECTS(o.pages >= 1, "keyed_file_store: pages must be at least 1, got ", o.pages);
    return o.pages;
  }
  static file_store_options file_options(keyed_file_store_options const& o, content_key ns)
  {
    file_store_options f = o.files;
    char sub[48];
    std::snprintf(sub, sizeof sub, "/strata-%016llx%016llx", static_cast<unsigned long long>(ns.hi),
                  static_cast<unsigned long long>(ns.lo));
    std::vector<std::string> dirs = drive_directories(f, "keyed_file_store");
    for (std::string& d : dirs) {
      d += sub;
    }
    f.directories = std::move(dirs);
    f.directory.clear();
    f.tp_rank = o.space.tp_rank;
    f.tp_size = o.space.tp_size;
    f.tag = o.space.model + "/" + o.space.dtype + "/" + o.space.layout;
    f.reopen = true;
    return f;
  }
  static bool uniform_ids(std::span<keyed_page const> pages, std::vector<std::size_t> const& at)
  {
    std::size_t const n = pages[at.front()].ids.size();
    if (n == 0 || std::int64_t(n) > file_store::max_record_ids) { return false; }
    for (std::size_t j : at) {
      if (pages[j].ids.size() != n) { return false; }
    }
    return true;
  }
  /// A slot for a new record: a free one, else the least recently used unpinned page's (lock held).
  std::int64_t free_slot()
  {
    if (files_.slots().available() > 0) { return files_.slots().allocate(1).front(); }
    for (auto k = lru_.rbegin(); k != lru_.rend(); ++k) {
      auto it = index_.find(*k);
      if (it->second.readers == 0) {
        std::int64_t const s = it->second.slot;
        lru_.erase(it->second.lru);
        index_.erase(it);
        ++stats_.pages_evicted;
        return s;
      }
    }
    return -1;
  }
  /// Drops a page whose record failed (lock held, no reader).
  void forget(index_map::iterator it)
  {
    std::int64_t const s = it->second.slot;
    lru_.erase(it->second.lru);
    index_.erase(it);
    files_.slots().release(std::span(&s, 1));
  }

  content_key ns_;
  file_store files_;
  mutable std::mutex m_;
  index_map index_;
  std::list<content_key> lru_;  // most recently used first
  keyed_file_store_stats stats_;
};

}  // namespace strata
