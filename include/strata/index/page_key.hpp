// SPDX-License-Identifier: Apache-2.0
/**
 * @file index/page_key.hpp
 * @brief The content key of a page: its ids hashed over the key of the page before it, so that
 *        equal keys mean equal prefixes. One definition serves the prefix index (child lookup, the
 *        keys copy orders carry), the records a file tier keeps (written with each record, checked
 *        on every read and at restart) and the controller's registry of pages being computed.
 *
 * The function is part of the file tier's on-disk format: it changes only with the format version
 * (`detail::file_format_version`).
 */
#pragma once

#include <strata/detail/hash.hpp>

#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace strata {

/**
 * @brief The content key of one page.
 * @param ids the page's ids (token ids; one id in page-id mode), all of them
 * @param parent the key of the page before it in its prefix (0 for a prompt's first page)
 * @return a 64-bit key; equal keys mean equal prefixes up to a collision a record store detects
 *         (records keep their ids, checked against the index's)
 */
inline std::uint64_t chain_key(std::span<std::int32_t const> ids, std::uint64_t parent) noexcept
{
  std::uint64_t h = detail::mix64(parent + 0x9e3779b97f4a7c15ull);
  std::size_t i = 0;
  for (; i + 2 <= ids.size(); i += 2) {
    std::uint64_t w;
    std::memcpy(&w, ids.data() + i, sizeof w);
    h = (h ^ w) * 0x100000001b3ull + (h >> 29);
  }
  if (i < ids.size()) { h = (h ^ static_cast<std::uint32_t>(ids[i])) * 0x100000001b3ull; }
  return detail::mix64(h);
}

/**
 * @brief The content keys of every whole page of `ids`, `ids_per_page` ids each, chained from a
 *        first page (a trailing partial page has none).
 */
inline std::vector<std::uint64_t> chain_keys(std::span<std::int32_t const> ids, std::int64_t ids_per_page)
{
  std::vector<std::uint64_t> keys;
  if (ids_per_page <= 0) { return keys; }
  std::size_t const per = std::size_t(ids_per_page);
  keys.reserve(ids.size() / per);
  std::uint64_t parent = 0;
  for (std::size_t at = 0; at + per <= ids.size(); at += per) {
    parent = chain_key(ids.subspan(at, per), parent);
    keys.push_back(parent);
  }
  return keys;
}

}  // namespace strata
