// SPDX-License-Identifier: Apache-2.0
/**
 * @file cache/detail/restore.hpp
 * @brief Restart: the records a restorable store (the file tier) kept across a restart become
 *        prefixes of a new index.
 */
#pragma once

#include <strata/error.hpp>
#include <strata/index/hiradix_tree.hpp>
#include <strata/index/page_key.hpp>
#include <strata/tier/concepts.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace strata::detail {

/// @brief A record a store kept across a restart, as the index needs it.
struct kept_record {
  std::int64_t slot;
  std::uint64_t key, parent_key;
  std::vector<std::int32_t> ids;
};

/**
 * @brief Checks that a page's ids fit the records of the stack's file tier, before anything changes.
 * @throw strata::invalid_argument when a page of `ids_per_page` ids does not fit a record's header
 */
template <class Tiers>
void check_record_ids(Tiers const& tiers, std::int64_t ids_per_page)
{
  (void)tiers;
  if constexpr (Tiers::has(tier::file)) {
    using store_type = std::remove_cvref_t<decltype(tiers.template get<tier::file>())>;
    if constexpr (keyed_record_store<store_type>) {
      STRATA_EXPECTS(ids_per_page <= store_type::max_record_ids, "cache_controller: a page of ", ids_per_page,
                     " ids does not fit a file-tier record's header (at most ", store_type::max_record_ids, ")");
    }
  }
}

/**
 * @brief The records the stack's file tier kept across a restart (a `restorable_store`), taken out
 *        of its allocator so that the index — which must be its allocators' only user — can claim
 *        the ones it places. Records the store no longer holds as recovered (a store reused by a
 *        second controller has moved on since) are left. Until `done()`, the destructor claims
 *        back every slot it released that nobody claimed since: a controller whose construction
 *        fails leaves the store as it found it.
 */
class recovered_records {
 public:
  recovered_records() = default;
  template <class Tiers>
  explicit recovered_records(Tiers& tiers)
  {
    if constexpr (Tiers::has(tier::file)) {
      auto& store = tiers.template get<tier::file>();
      if constexpr (restorable_store<std::remove_cvref_t<decltype(store)>>) {
        for (auto const& r : store.recovered()) {
          if (!store.slots().is_allocated(r.slot) || store.key(r.slot) != std::optional<std::uint64_t>{r.key}) {
            continue;
          }
          records_.push_back({r.slot, r.key, r.parent_key, {r.ids.begin(), r.ids.end()}});
          released_.push_back(r.slot);
        }
        if (!released_.empty()) {
          store.slots().release(released_);
          slots_ = &store.slots();
        }
      }
    }
  }
  recovered_records(recovered_records const&) = delete;
  recovered_records& operator=(recovered_records const&) = delete;
  ~recovered_records()
  {
    if (slots_ == nullptr) { return; }
    for (auto s : released_) {
      if (!slots_->is_allocated(s)) { slots_->claim(std::span<std::int64_t const>{&s, 1}); }
    }
  }
  /// @brief The records, handed out once.
  [[nodiscard]] std::vector<kept_record> take() { return std::exchange(records_, {}); }
  /// @brief The index has adopted what it could place: the slots it left are free for good.
  void done() noexcept { slots_ = nullptr; }

 private:
  std::vector<kept_record> records_;
  std::vector<std::int64_t> released_;
  slot_allocator* slots_ = nullptr;
};

/// @brief What `restore` placed.
struct restore_counts {
  std::int64_t restored = 0;  ///< pages the index adopted
  std::int64_t dropped = 0;   ///< records it could not place (their slots stay free)
};

/**
 * @brief The index learns the prefixes whose pages the file tier kept: records chain to their
 *        prefix through their parent keys; every chain from a first page is adopted, leaf by leaf.
 *        Records that chain to no first page, hold another page size, fail their key check, or
 *        repeat a key, are left.
 * @param ids_per_page ids of one page (the index's `page_tokens`)
 */
inline restore_counts restore(hiradix_tree& tree, std::vector<kept_record> records, std::int64_t ids_per_page)
{
  restore_counts counts;
  if (records.empty()) { return counts; }
  std::unordered_map<std::uint64_t, std::size_t> by_key;
  std::unordered_map<std::uint64_t, std::vector<std::size_t>> children;  // parent key -> records
  for (std::size_t i = 0; i < records.size(); ++i) {
    kept_record const& r = records[i];
    if (std::int64_t(r.ids.size()) != ids_per_page || chain_key(r.ids, r.parent_key) != r.key ||
        !by_key.emplace(r.key, i).second) {
      continue;
    }
    children[r.parent_key].push_back(i);
  }
  std::vector<std::int32_t> tokens;
  std::vector<std::int64_t> slots;
  std::vector<std::pair<std::size_t, std::size_t>> path;  // (record, next child to visit)
  std::vector<char> placed(records.size(), 0);
  auto kids = [&](std::size_t i) -> std::vector<std::size_t> const* {
    auto const it = children.find(records[i].key);
    return it == children.end() ? nullptr : &it->second;
  };
  if (auto const roots = children.find(0); roots != children.end()) {
    for (auto root : roots->second) {
      path.push_back({root, 0});
      tokens.insert(tokens.end(), records[root].ids.begin(), records[root].ids.end());
      slots.push_back(records[root].slot);
      placed[root] = 1;
      while (!path.empty()) {
        auto& [i, next] = path.back();
        auto const* k = kids(i);
        if (k != nullptr && next < k->size()) {
          std::size_t const c = (*k)[next++];
          if (placed[c] != 0) { continue; }  // a cycle only a hash collision could make
          placed[c] = 1;
          path.push_back({c, 0});
          tokens.insert(tokens.end(), records[c].ids.begin(), records[c].ids.end());
          slots.push_back(records[c].slot);
          continue;
        }
        if (k == nullptr) { counts.restored += tree.adopt(tier::file, tokens, slots).pages; }
        path.pop_back();
        tokens.resize(tokens.size() - std::size_t(ids_per_page));
        slots.pop_back();
      }
    }
  }
  counts.dropped = std::int64_t(records.size()) - counts.restored;
  return counts;
}

}  // namespace strata::detail
