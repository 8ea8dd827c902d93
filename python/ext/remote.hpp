// SPDX-License-Identifier: Apache-2.0
/**
 * @file python/ext/remote.hpp
 * @brief The remote tier in Python: `redis_store` (exists / get / set of pages by content key, with
 *        NumPy arrays, or regions of host memory), `measure_keyed_store` of it (keyed.hpp has what every
 *        keyed store shares). Built when hiredis is found
 *        (STRATA_PYTHON_REDIS); a `cpu_controller` takes a store as its remote tier (module.cpp).
 */
#pragma once

#include "controller_api.hpp"
#include "keyed.hpp"

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
      .def_rw("max_value_bytes", &redis_store_options::max_value_bytes)
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
      .def_ro("slot_map_refreshes", &redis_store_stats::slot_map_refreshes)
      .def_ro("batches_failed", &redis_store_stats::batches_failed);

  nb::class_<redis_store> rs(m, "redis_store",
                             "Pages in Redis Cluster (or one server), addressed by content and shared by every engine "
                             "instance of the same namespace (docs/remote_tier.md).");
  rs.def(
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
      .def_prop_ro("clustered", &redis_store::clustered)
      .def(
          "key_name", [](redis_store const& s, std::uint64_t hi, std::uint64_t lo) { return s.key_name({hi, lo}); },
          "hi"_a, "lo"_a, "The Redis key of a page.")
      .def("stats", &redis_store::stats);
  def_keyed_methods<redis_store>(rs);

  def_measure<redis_store>(m);
}

}  // namespace strata::python
