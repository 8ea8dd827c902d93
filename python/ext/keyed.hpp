// SPDX-License-Identifier: Apache-2.0
/**
 * @file python/ext/keyed.hpp
 * @brief Keyed stores in Python: what every store addressed by content shares (`content_keys`,
 *        `keyed_store_rates`, exists / get / set of NumPy rows, and `get_into` / `set_from` of
 *        pages scattered over host memory, the engines' zero-copy hooks), and `keyed_file_store`
 *        (local drives). `redis_store` (remote.hpp) has the same methods.
 */
#pragma once

#include "arrays.hpp"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <strata/tier/keyed_file_store.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace strata::python {

namespace nb = nanobind;
using namespace nb::literals;

/// Content keys as an `[n, 2]` uint64 array (hi, lo).
using key_array = nb::ndarray<std::uint64_t const, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
/// Pages as an `[n, page_bytes]` uint8 array.
using page_rows = nb::ndarray<std::uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using const_page_rows = nb::ndarray<std::uint8_t const, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

inline std::vector<content_key> keys_of(key_array const& a)
{
  if (a.shape(1) != 2) { raise_value("keys: expected an [n, 2] uint64 array (hi, lo), got ", a.shape(1), " columns"); }
  std::vector<content_key> k(a.shape(0));
  for (std::size_t i = 0; i < k.size(); ++i) {
    k[i] = {a(i, 0), a(i, 1)};
  }
  return k;
}

/// The pages of a batch: keys, and ids split evenly over them when given.
inline std::vector<keyed_page> pages_of(std::vector<content_key> const& keys, std::optional<token_ids> const& ids)
{
  std::vector<keyed_page> pages(keys.size());
  std::size_t per = 0;
  if (ids && !keys.empty()) {
    if (ids->v.size() % keys.size() != 0) {
      raise_value("ids: ", ids->v.size(), " ids do not split evenly over ", keys.size(), " pages");
    }
    per = ids->v.size() / keys.size();
  }
  for (std::size_t i = 0; i < keys.size(); ++i) {
    pages[i].key = keys[i];
    if (per > 0) { pages[i].ids = std::span<std::int32_t const>(ids->v).subspan(i * per, per); }
  }
  return pages;
}

/// A NumPy bool array of the flags (made as uint8, viewed as bool).
inline nb::object flags_array(std::vector<char> const& flags)
{
  auto* data = new std::uint8_t[flags.size() > 0 ? flags.size() : 1]();
  for (std::size_t i = 0; i < flags.size(); ++i) {
    data[i] = flags[i] != 0 ? 1 : 0;
  }
  nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<std::uint8_t*>(p); });
  nb::object bytes = nb::cast(nb::ndarray<nb::numpy, std::uint8_t, nb::ndim<1>>(data, {flags.size()}, owner));
  return bytes.attr("view")("bool");
}

template <class Rows>
void check_rows(Rows const& rows, std::size_t n, std::int64_t page_bytes, char const* what)
{
  if (rows.shape(0) != n || std::int64_t(rows.shape(1)) != page_bytes) {
    raise_value(what, ": expected a C-contiguous [", n, ", ", page_bytes, "] uint8 array, got [", rows.shape(0), ", ",
                rows.shape(1), "]");
  }
}

/// Flags for `n` pages, all false.
inline std::unique_ptr<bool[]> no_flags(std::size_t n) { return std::unique_ptr<bool[]>(new bool[n + 1]()); }

/// Bytes staged at once when a page's segments are gathered or scattered.
inline constexpr std::int64_t default_segment_staging = std::int64_t{64} << 20;

/**
 * Moves pages between a store and host memory where each page is `segments` regions
 * (`ptrs[i * segments + j]`, `sizes[...]` bytes, in record order): SGLang's
 * `get_page_buffer_meta`. One region per page moves in place; more are gathered into (or
 * scattered from) a staging buffer of at most `staging` bytes at a time. Checks everything before
 * any byte moves; the GIL is released while pages move.
 */
template <class Store>
nb::object move_segments(Store& s, key_array const& keys, std::vector<std::uint64_t> const& ptrs,
                         std::vector<std::int64_t> const& sizes, bool write, std::int64_t staging, char const* what)
{
  auto const k = keys_of(keys);
  std::size_t const n = k.size();
  if (ptrs.size() != sizes.size()) { raise_value(what, ": ", ptrs.size(), " pointers and ", sizes.size(), " sizes"); }
  if (n == 0) {
    if (!ptrs.empty()) { raise_value(what, ": ", ptrs.size(), " regions for no page"); }
    return flags_array({});
  }
  if (ptrs.size() % n != 0 || ptrs.empty()) {
    raise_value(what, ": ", ptrs.size(), " regions do not split evenly over ", n, " pages");
  }
  if (staging <= 0) { raise_value(what, ": staging_bytes must be positive, got ", staging); }
  std::size_t const per = ptrs.size() / n;
  std::int64_t const pb = s.page_bytes();
  for (std::size_t i = 0; i < n; ++i) {
    std::int64_t sum = 0;
    for (std::size_t j = i * per; j < (i + 1) * per; ++j) {
      if (ptrs[j] == 0) { raise_value(what, ": region ", j, " of page ", i, " is a null pointer"); }
      if (sizes[j] <= 0) { raise_value(what, ": region ", j, " of page ", i, " has size ", sizes[j]); }
      sum += sizes[j];
    }
    if (sum != pb) { raise_value(what, ": page ", i, " has ", sum, " bytes in its regions, the store's pages ", pb); }
  }
  auto const pages = pages_of(k, std::nullopt);
  auto flags = no_flags(n);
  {
    nb::gil_scoped_release unlocked;
    if (per == 1) {
      if (write) {
        std::vector<std::byte const*> src(n);
        for (std::size_t i = 0; i < n; ++i) {
          src[i] = reinterpret_cast<std::byte const*>(ptrs[i]);
        }
        s.set(pages, src, {flags.get(), n});
      } else {
        std::vector<std::byte*> dst(n);
        for (std::size_t i = 0; i < n; ++i) {
          dst[i] = reinterpret_cast<std::byte*>(ptrs[i]);
        }
        s.get(pages, dst, {flags.get(), n});
      }
    } else {
      std::size_t const chunk = std::size_t(std::clamp<std::int64_t>(staging / pb, 1, std::int64_t(n)));
      // One staging buffer per calling thread, kept: an engine's prefetch and backup threads each
      // reuse theirs instead of faulting fresh pages in on every batch.
      thread_local std::unique_ptr<std::byte[]> buf;
      thread_local std::size_t buf_bytes = 0;
      if (buf_bytes < chunk * std::size_t(pb)) {
        buf.reset();
        buf.reset(new std::byte[chunk * std::size_t(pb)]);
        buf_bytes = chunk * std::size_t(pb);
      }
      std::vector<std::byte*> rows(chunk);
      for (std::size_t r = 0; r < chunk; ++r) {
        rows[r] = buf.get() + r * std::size_t(pb);
      }
      auto each_region = [&](std::size_t page, auto&& f) {
        std::byte* row = rows[page % chunk];
        for (std::size_t j = page * per; j < (page + 1) * per; ++j) {
          f(row, reinterpret_cast<std::byte*>(ptrs[j]), std::size_t(sizes[j]));
          row += sizes[j];
        }
      };
      for (std::size_t first = 0; first < n; first += chunk) {
        std::size_t const count = std::min(chunk, n - first);
        std::span<keyed_page const> part(pages.data() + first, count);
        std::span<bool> part_flags(flags.get() + first, count);
        if (write) {
          for (std::size_t i = first; i < first + count; ++i) {
            each_region(i, [](std::byte* row, std::byte* region, std::size_t b) { std::memcpy(row, region, b); });
          }
          std::vector<std::byte const*> src(rows.begin(), rows.begin() + std::ptrdiff_t(count));
          s.set(part, src, part_flags);
        } else {
          s.get(part, std::span<std::byte* const>(rows.data(), count), part_flags);
          for (std::size_t i = first; i < first + count; ++i) {
            if (flags[i]) {
              each_region(i, [](std::byte* row, std::byte* region, std::size_t b) { std::memcpy(region, row, b); });
            }
          }
        }
      }
    }
  }
  return flags_array(std::vector<char>(flags.get(), flags.get() + n));
}

/// The methods every keyed store has in Python: exists, get, set (NumPy rows), get_into, set_from (regions).
template <class Store, class Class>
void def_keyed_methods(Class& cls)
{
  cls.def_prop_ro("page_bytes", &Store::page_bytes)
      .def(
          "exists",
          [](Store& s, key_array keys) {
            auto const k = keys_of(keys);
            nb::gil_scoped_release unlocked;
            return s.exists(k);
          },
          "keys"_a, "How many leading pages of keys (one prefix, in order) the store holds.")
      .def(
          "contains",
          [](Store& s, key_array keys) {
            auto const k = keys_of(keys);
            auto have = no_flags(k.size());
            {
              nb::gil_scoped_release unlocked;
              s.contains(k, {have.get(), k.size()});
            }
            return flags_array(std::vector<char>(have.get(), have.get() + k.size()));
          },
          "keys"_a, "Which keys (of any prefixes, in any order) the store holds: a NumPy bool array.")
      .def(
          "get",
          [](Store& s, key_array keys, page_rows out, std::optional<token_ids> const& ids) {
            auto const k = keys_of(keys);
            check_rows(out, k.size(), s.page_bytes(), "get: out");
            auto const pages = pages_of(k, ids);
            std::vector<std::byte*> dests(k.size());
            for (std::size_t i = 0; i < k.size(); ++i) {
              dests[i] = reinterpret_cast<std::byte*>(out.data()) + i * std::size_t(s.page_bytes());
            }
            auto intact = no_flags(k.size());
            {
              nb::gil_scoped_release unlocked;
              s.get(pages, dests, {intact.get(), k.size()});
            }
            return flags_array(std::vector<char>(intact.get(), intact.get() + k.size()));
          },
          "keys"_a, "out"_a, "ids"_a = nb::none(),
          "Reads pages into out's rows; returns which arrived intact (ids, when given, are compared).")
      .def(
          "set",
          [](Store& s, key_array keys, const_page_rows pages_in, std::optional<token_ids> const& ids) {
            auto const k = keys_of(keys);
            check_rows(pages_in, k.size(), s.page_bytes(), "set: pages");
            auto const pages = pages_of(k, ids);
            std::vector<std::byte const*> sources(k.size());
            for (std::size_t i = 0; i < k.size(); ++i) {
              sources[i] = reinterpret_cast<std::byte const*>(pages_in.data()) + i * std::size_t(s.page_bytes());
            }
            auto written = no_flags(k.size());
            {
              nb::gil_scoped_release unlocked;
              s.set(pages, sources, {written.get(), k.size()});
            }
            return flags_array(std::vector<char>(written.get(), written.get() + k.size()));
          },
          "keys"_a, "pages"_a, "ids"_a = nb::none(), "Writes pages from the rows; returns which were stored.")
      .def(
          "get_into",
          [](Store& s, key_array keys, std::vector<std::uint64_t> const& ptrs, std::vector<std::int64_t> const& sizes,
             std::int64_t staging) { return move_segments(s, keys, ptrs, sizes, false, staging, "get_into"); },
          "keys"_a, "ptrs"_a, "sizes"_a, "staging_bytes"_a = default_segment_staging,
          "Reads pages into host memory given as regions (len(ptrs) / len(keys) per page, in order, summing to "
          "page_bytes: SGLang's get_page_buffer_meta); returns which arrived intact. The memory must stay valid "
          "and unused by others for the call.")
      .def(
          "set_from",
          [](Store& s, key_array keys, std::vector<std::uint64_t> const& ptrs, std::vector<std::int64_t> const& sizes,
             std::int64_t staging) { return move_segments(s, keys, ptrs, sizes, true, staging, "set_from"); },
          "keys"_a, "ptrs"_a, "sizes"_a, "staging_bytes"_a = default_segment_staging,
          "Writes pages from host memory given as regions (as get_into); returns which were stored.");
}

/// `measure_keyed_store(store, pages)` for one store type (an overload per store).
template <class Store>
void def_measure(nb::module_& m)
{
  m.def(
      "measure_keyed_store",
      [](Store& s, std::int64_t pages) {
        nb::gil_scoped_release unlocked;
        return measure_keyed_store(s, pages);
      },
      "store"_a, "pages"_a = 64, "A store's read and write rates and round trip, with scratch pages.");
}

inline void bind_keyed(nb::module_& m)
{
  nb::class_<keyed_store_rates>(m, "keyed_store_rates")
      .def_ro("read_bytes_per_s", &keyed_store_rates::read_bytes_per_s)
      .def_ro("write_bytes_per_s", &keyed_store_rates::write_bytes_per_s)
      .def_ro("round_trip_s", &keyed_store_rates::round_trip_s);

  m.def(
      "content_keys",
      [](token_ids const& ids, std::int64_t ids_per_page) {
        if (ids_per_page <= 0) { raise_value("content_keys: ids_per_page must be positive, got ", ids_per_page); }
        auto const keys = chain_content_keys(ids.v, ids_per_page);
        auto* data = new std::uint64_t[keys.size() * 2 + 2];
        for (std::size_t i = 0; i < keys.size(); ++i) {
          data[2 * i] = keys[i].hi;
          data[2 * i + 1] = keys[i].lo;
        }
        nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<std::uint64_t*>(p); });
        return nb::ndarray<nb::numpy, std::uint64_t, nb::ndim<2>>(data, {keys.size(), 2}, owner);
      },
      "ids"_a, "ids_per_page"_a, "The 128-bit content keys of every whole page, chained: an [n, 2] uint64 array.");

  nb::class_<keyed_file_store_stats>(m, "keyed_file_store_stats")
      .def_ro("pages_read", &keyed_file_store_stats::pages_read)
      .def_ro("pages_absent", &keyed_file_store_stats::pages_absent)
      .def_ro("pages_rejected", &keyed_file_store_stats::pages_rejected)
      .def_ro("pages_written", &keyed_file_store_stats::pages_written)
      .def_ro("pages_present", &keyed_file_store_stats::pages_present)
      .def_ro("pages_refused", &keyed_file_store_stats::pages_refused)
      .def_ro("pages_evicted", &keyed_file_store_stats::pages_evicted);

  nb::class_<keyed_file_store> kfs(
      m, "keyed_file_store",
      "Pages by content key on local drives (one directory per drive), least recently used replaced when full, "
      "kept across restarts (docs/engines.md).");
  kfs.def(
      "__init__",
      [](keyed_file_store* self, std::vector<std::string> directories, kv_geometry const& g, std::int64_t pages,
         std::string model, std::string dtype, std::string layout, int tp_rank, int tp_size,
         std::optional<file_store_options> files) {
        keyed_file_store_options o;
        o.files = files.value_or(file_store_options{});
        o.files.directory.clear();
        o.files.directories = std::move(directories);
        o.space = {std::move(model), std::move(dtype), std::move(layout), g, tp_rank, tp_size};
        o.pages = pages;
        nb::gil_scoped_release unlocked;
        new (self) keyed_file_store(std::move(o));
      },
      "directories"_a, "geometry"_a, "pages"_a, "model"_a, "dtype"_a, "layout"_a = "page_first", "tp_rank"_a = 0,
      "tp_size"_a = 1, "files"_a = nb::none(),
      "directories: one per drive (a subdirectory per namespace is made in each). files: I/O threads, direct I/O, "
      "io_uring (its directory fields are ignored). Raises ValueError for bad input and strata.Error when the files "
      "cannot be opened or hold another capacity.");
  def_keyed_methods<keyed_file_store>(kfs);
  kfs.def_prop_ro("capacity", &keyed_file_store::capacity)
      .def_prop_ro("size", &keyed_file_store::size)
      .def_prop_ro("directories", [](keyed_file_store const& s) { return s.files().directories(); })
      .def("stats", &keyed_file_store::stats);

  def_measure<keyed_file_store>(m);
}

}  // namespace strata::python
