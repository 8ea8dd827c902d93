// SPDX-License-Identifier: Apache-2.0
/**
 * @file python/ext/remote.hpp
 * @brief The remote tier in Python: `redis_store` (exists / get / set of pages by content key, with
 *        NumPy arrays), `content_keys`, `measure_keyed_store`. Built when hiredis is found
 *        (STRATA_PYTHON_REDIS); a `cpu_controller` takes a store as its remote tier (module.cpp).
 */
#pragma once

#include "arrays.hpp"
#include "controller_api.hpp"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <strata/tier/redis_store.hpp>

#include <chrono>
#include <cstdint>
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

/// `keyed_store_api` over a `redis_store` (the GPU controllers' face of it).
class redis_store_face final : public keyed_store_api {
 public:
  explicit redis_store_face(redis_store& s) : s_(&s) {}
  [[nodiscard]] std::int64_t page_bytes() const override { return s_->page_bytes(); }
  std::int64_t exists(std::span<content_key const> keys) override { return s_->exists(keys); }
  std::int64_t get(std::span<keyed_page const> p, std::span<std::byte* const> d, std::span<bool> f) override
  { return s_->get(p, d, f); }
  std::int64_t set(std::span<keyed_page const> p, std::span<std::byte const* const> src, std::span<bool> f) override
  { return s_->set(p, src, f); }
  io_ticket submit_exists(std::span<content_key const> keys) override { return s_->submit_exists(keys); }
  io_ticket submit_get(std::span<keyed_page const> p, std::span<std::byte* const> d) override
  { return s_->submit_get(p, d); }
  io_ticket submit_set(std::span<keyed_page const> p, std::span<std::byte const* const> src) override
  { return s_->submit_set(p, src); }
  io_status poll(io_ticket t, std::span<bool> f) override { return s_->poll(t, f); }
  io_status wait(io_ticket t, std::span<bool> f) override { return s_->wait(t, f); }

 private:
  redis_store* s_;
};

inline void bind_remote(nb::module_& m)
{
  auto ms = [](auto member) {
    return [member](redis_store_options const& o) { return std::int64_t((o.*member).count()); };
  };
  auto set_ms = [](auto member) {
    return [member](redis_store_options& o, std::int64_t v) { o.*member = std::chrono::milliseconds(v); };
  };
  nb::class_<redis_store_options>(m, "redis_store_options", "How a redis_store reaches its servers.")
      .def(nb::init<>())
      .def_rw("key_prefix", &redis_store_options::key_prefix)
      .def_prop_rw("connect_timeout_ms", ms(&redis_store_options::connect_timeout),
                   set_ms(&redis_store_options::connect_timeout))
      .def_prop_rw("command_timeout_ms", ms(&redis_store_options::command_timeout),
                   set_ms(&redis_store_options::command_timeout))
      .def_prop_rw("retry_budget_ms", ms(&redis_store_options::retry_budget),
                   set_ms(&redis_store_options::retry_budget))
      .def_rw("max_batch_bytes", &redis_store_options::max_batch_bytes)
      .def_rw("io_threads", &redis_store_options::io_threads);

  nb::class_<redis_store_stats>(m, "redis_store_stats")
      .def_ro("pages_read", &redis_store_stats::pages_read)
      .def_ro("pages_absent", &redis_store_stats::pages_absent)
      .def_ro("pages_rejected", &redis_store_stats::pages_rejected)
      .def_ro("pages_written", &redis_store_stats::pages_written)
      .def_ro("pages_unanswered", &redis_store_stats::pages_unanswered)
      .def_ro("bytes_read", &redis_store_stats::bytes_read)
      .def_ro("bytes_written", &redis_store_stats::bytes_written)
      .def_ro("moved", &redis_store_stats::moved)
      .def_ro("ask", &redis_store_stats::ask)
      .def_ro("reconnects", &redis_store_stats::reconnects)
      .def_ro("slot_map_refreshes", &redis_store_stats::slot_map_refreshes);

  nb::class_<keyed_store_rates>(m, "keyed_store_rates")
      .def_ro("read_bytes_per_s", &keyed_store_rates::read_bytes_per_s)
      .def_ro("write_bytes_per_s", &keyed_store_rates::write_bytes_per_s)
      .def_ro("round_trip_s", &keyed_store_rates::round_trip_s);

  nb::class_<redis_store>(m, "redis_store",
                          "Pages in Redis Cluster (or one server), addressed by content and shared by every engine "
                          "instance of the same namespace (docs/remote_tier.md).")
      .def(
          "__init__",
          [](redis_store* self, std::vector<std::string> nodes, kv_geometry const& g, std::string model,
             std::string dtype, std::string layout, int tp_rank, int tp_size,
             std::optional<redis_store_options> options) {
            redis_store_options o = options.value_or(redis_store_options{});
            o.nodes = std::move(nodes);
            o.space = {std::move(model), std::move(dtype), std::move(layout), g, tp_rank, tp_size};
            nb::gil_scoped_release unlocked;
            new (self) redis_store(std::move(o));
          },
          "nodes"_a, "geometry"_a, "model"_a, "dtype"_a, "layout"_a = "page_first", "tp_rank"_a = 0, "tp_size"_a = 1,
          "options"_a = nb::none(),
          "nodes: 'host:port' of any cluster nodes (or one server). Raises ValueError for bad input and "
          "strata.Error when no node answers.")
      .def_prop_ro("page_bytes", &redis_store::page_bytes)
      .def_prop_ro("clustered", &redis_store::clustered)
      .def(
          "key_name", [](redis_store const& s, std::uint64_t hi, std::uint64_t lo) { return s.key_name({hi, lo}); },
          "hi"_a, "lo"_a, "The Redis key of a page.")
      .def(
          "exists",
          [](redis_store& s, key_array keys) {
            auto const k = keys_of(keys);
            nb::gil_scoped_release unlocked;
            return s.exists(k);
          },
          "keys"_a, "How many leading pages of keys (one prefix, in order) the store holds.")
      .def(
          "get",
          [](redis_store& s, key_array keys, page_rows out, std::optional<token_ids> const& ids) {
            auto const k = keys_of(keys);
            check_rows(out, k.size(), s.page_bytes(), "get: out");
            auto const pages = pages_of(k, ids);
            std::vector<std::byte*> dests(k.size());
            for (std::size_t i = 0; i < k.size(); ++i) {
              dests[i] = reinterpret_cast<std::byte*>(out.data()) + i * std::size_t(s.page_bytes());
            }
            std::unique_ptr<bool[]> intact(new bool[k.size() + 1]());
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
          [](redis_store& s, key_array keys, const_page_rows pages_in, std::optional<token_ids> const& ids) {
            auto const k = keys_of(keys);
            check_rows(pages_in, k.size(), s.page_bytes(), "set: pages");
            auto const pages = pages_of(k, ids);
            std::vector<std::byte const*> sources(k.size());
            for (std::size_t i = 0; i < k.size(); ++i) {
              sources[i] = reinterpret_cast<std::byte const*>(pages_in.data()) + i * std::size_t(s.page_bytes());
            }
            std::unique_ptr<bool[]> written(new bool[k.size() + 1]());
            {
              nb::gil_scoped_release unlocked;
              s.set(pages, sources, {written.get(), k.size()});
            }
            return flags_array(std::vector<char>(written.get(), written.get() + k.size()));
          },
          "keys"_a, "pages"_a, "ids"_a = nb::none(), "Writes pages from the rows; returns which were stored.")
      .def("stats", &redis_store::stats);

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
  m.def(
      "measure_keyed_store",
      [](redis_store& s, std::int64_t pages) {
        nb::gil_scoped_release unlocked;
        return measure_keyed_store(s, pages);
      },
      "store"_a, "pages"_a = 64, "A store's read and write rates and round trip, with scratch pages.");
}

}  // namespace strata::python
