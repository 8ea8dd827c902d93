// SPDX-License-Identifier: Apache-2.0
// strata._strata: the nanobind module. Names are the C++ names; docs/python.md is the map.
#include "arrays.hpp"
#include "controller_impl.hpp"
#if STRATA_PYTHON_CUDA
#include "gpu.hpp"
#endif
#include "keyed.hpp"
#if STRATA_PYTHON_REDIS
#include "remote.hpp"
#endif

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <strata/cache/controller.hpp>
#include <strata/config.hpp>
#include <strata/index/hiradix_tree.hpp>
#include <strata/presets/h200.hpp>
#include <strata/tier/file_store.hpp>
#include <strata/transfer/host_copy.hpp>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;

namespace strata::python {
namespace {

// --- exceptions ---------------------------------------------------------------------------------

PyObject* error_type = nullptr;
PyObject* invalid_type = nullptr;
PyObject* oom_type = nullptr;
PyObject* cuda_type = nullptr;

void register_exceptions(nb::module_& m)
{
  error_type = PyErr_NewExceptionWithDoc("strata.Error", "Base of every error strata raises (a RuntimeError).",
                                         PyExc_RuntimeError, nullptr);
  nb::object invalid_bases = nb::make_tuple(nb::handle(error_type), nb::handle(PyExc_ValueError));
  invalid_type = PyErr_NewExceptionWithDoc("strata.InvalidArgument",
                                           "A value the API does not accept; nothing was changed (also a ValueError).",
                                           invalid_bases.ptr(), nullptr);
  nb::object oom_bases = nb::make_tuple(nb::handle(error_type), nb::handle(PyExc_MemoryError));
  oom_type = PyErr_NewExceptionWithDoc("strata.OutOfMemory",
                                       "An allocation (device, pinned host, page slots) failed (also a MemoryError).",
                                       oom_bases.ptr(), nullptr);
  cuda_type = PyErr_NewExceptionWithDoc("strata.CudaError", "A CUDA call failed.", error_type, nullptr);
  m.attr("Error") = nb::handle(error_type);
  m.attr("InvalidArgument") = nb::handle(invalid_type);
  m.attr("OutOfMemory") = nb::handle(oom_type);
  m.attr("CudaError") = nb::handle(cuda_type);
  nb::register_exception_translator([](std::exception_ptr const& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (strata::invalid_argument const& e) {
      PyErr_SetString(invalid_type, e.what());
    } catch (strata::out_of_memory const& e) {
      PyErr_SetString(oom_type, e.what());
    } catch (strata::cuda_error const& e) {
      PyErr_SetString(cuda_type, e.what());
    } catch (strata::error const& e) {
      PyErr_SetString(error_type, e.what());
    }
  });
}

// --- geometry -----------------------------------------------------------------------------------

std::string repr(kv_geometry const& g) { return "kv_geometry" + text(g); }

void bind_geometry(nb::module_& m)
{
  nb::class_<kv_geometry>(m, "kv_geometry", "Shape of a paged KV cache (validated on construction).")
      .def(
          "__init__",
          [](kv_geometry* self, std::int64_t layers, std::int64_t page_tokens, std::int64_t kv_heads,
             std::int64_t head_dim, std::int64_t elem_bytes, std::int64_t planes) {
            kv_geometry const g{layers, page_tokens, kv_heads, head_dim, elem_bytes, planes};
            g.validate();
            new (self) kv_geometry{g};
          },
          "layers"_a, "page_tokens"_a, "kv_heads"_a, "head_dim"_a, "elem_bytes"_a = 2, "planes"_a = 2)
      .def_ro("layers", &kv_geometry::layers)
      .def_ro("page_tokens", &kv_geometry::page_tokens)
      .def_ro("kv_heads", &kv_geometry::kv_heads)
      .def_ro("head_dim", &kv_geometry::head_dim)
      .def_ro("elem_bytes", &kv_geometry::elem_bytes)
      .def_ro("planes", &kv_geometry::planes)
      .def("head_bytes", &kv_geometry::head_bytes, "Bytes of one (token, head).")
      .def("row_bytes", &kv_geometry::row_bytes, "Bytes of one token in one (layer, plane).")
      .def("block_bytes", &kv_geometry::block_bytes, "Bytes of one (page, layer, plane) block.")
      .def("page_bytes", &kv_geometry::page_bytes, "Bytes of one page: every layer and plane.")
      .def("token_bytes", &kv_geometry::token_bytes, "KV bytes of one token over all layers and planes.")
      .def("blocks_per_page", &kv_geometry::blocks_per_page)
      .def("validate", &kv_geometry::validate)
      .def("__eq__", [](kv_geometry const& a, kv_geometry const& b) { return a == b; })
      .def("__hash__",
           [](kv_geometry const& g) {
             return nb::hash(nb::make_tuple(g.layers, g.page_tokens, g.kv_heads, g.head_dim, g.elem_bytes, g.planes));
           })
      .def("__repr__", &repr);

  nb::class_<model_shape>(m, "model_shape", "The model-side shape of a KV cache.")
      .def_prop_ro("name", [](model_shape const& s) { return std::string(s.name); })
      .def_ro("layers", &model_shape::layers)
      .def_ro("kv_heads", &model_shape::kv_heads)
      .def_ro("head_dim", &model_shape::head_dim)
      .def_ro("planes", &model_shape::planes)
      .def("geometry", &model_shape::geometry, "page_tokens"_a, "elem_bytes"_a = 2, "tensor_parallel"_a = 1,
           "The geometry of one tensor-parallel rank's cache.")
      .def("__repr__", [](model_shape const& s) { return text("model_shape(", s.name, ")"); });

  m.def(
      "_model_shapes",
      []() {
        std::vector<std::pair<std::string, model_shape>> out;
        out.emplace_back("llama31_8b", models::llama31_8b);
        out.emplace_back("qwen25_14b", models::qwen25_14b);
        out.emplace_back("llama31_70b", models::llama31_70b);
        out.emplace_back("deepseek_v3", models::deepseek_v3);
        return out;
      },
      "The KV shapes of strata::models (strata.models holds them by name).");
}

// --- enums and vocabulary -----------------------------------------------------------------------

void bind_vocabulary(nb::module_& m)
{
  nb::enum_<tier>(m, "tier", "Storage tiers, fastest first.")
      .value("device", tier::device)
      .value("host", tier::host)
      .value("file", tier::file)
      .value("remote", tier::remote);
  nb::enum_<write_policy>(m, "write_policy")
      .value("write_through", write_policy::write_through)
      .value("write_through_selective", write_policy::write_through_selective)
      .value("write_back", write_policy::write_back);
  nb::enum_<transient_state>(m, "transient_state")
      .value("none", transient_state::none)
      .value("in_queue", transient_state::in_queue)
      .value("in_flight", transient_state::in_flight);
  nb::enum_<prefetch_mode>(m, "prefetch_mode")
      .value("off", prefetch_mode::off)
      .value("best_effort", prefetch_mode::best_effort)
      .value("wait_complete", prefetch_mode::wait_complete)
      .value("timeout", prefetch_mode::timeout);
  nb::enum_<deferral_reason>(m, "deferral_reason")
      .value("delay_hit", deferral_reason::delay_hit)
      .value("balance", deferral_reason::balance)
      .value("memory", deferral_reason::memory)
      .value("budget", deferral_reason::budget)
      .value("changed", deferral_reason::changed);
  nb::enum_<layout_order>(m, "layout_order")
      .value("page_major", layout_order::page_major)
      .value("layer_major", layout_order::layer_major);

  nb::class_<node_ref>(m, "node_ref", "A node of the prefix index (stale once the node goes).")
      .def_ro("index", &node_ref::index)
      .def_ro("generation", &node_ref::generation)
      .def("__eq__", [](node_ref a, node_ref b) { return a == b; })
      .def("__hash__", [](node_ref r) { return nb::hash(nb::make_tuple(r.index, r.generation)); })
      .def("__repr__", [](node_ref r) { return text("node_ref(", r.index, ", ", r.generation, ")"); });

  nb::class_<copy_order>(m, "copy_order", "A copy the index asks for; run it, then complete(id) or cancel(id).")
      .def_ro("id", &copy_order::id)
      .def_ro("node", &copy_order::node)
      .def_ro("from_tier", &copy_order::from)
      .def_ro("to_tier", &copy_order::to)
      .def_ro("from_pages", &copy_order::from_pages)
      .def_ro("to_pages", &copy_order::to_pages)
      .def_ro("demotion", &copy_order::demotion)
      .def_ro("keys", &copy_order::keys)
      .def_ro("parent_key", &copy_order::parent_key)
      .def_ro("ids", &copy_order::ids)
      .def_ro("ids_per_page", &copy_order::ids_per_page)
      .def("__repr__", [](copy_order const& o) {
        return text("copy_order(id=", o.id, ", ", to_string(o.from), " -> ", to_string(o.to), ", ", o.from_pages.size(),
                    " pages", o.demotion ? ", demotion" : "", ")");
      });
}

// --- layouts ------------------------------------------------------------------------------------

using lf = py_layout<layer_first>;
using pf = py_layout<page_first>;
using lft = py_layout<layer_first_table>;
using vl = py_layout<vllm_layout>;
using hl = py_layout<hf_layout>;

/// Calls `f(py_layout<L>&)` for the layout object `h`.
template <class F>
decltype(auto) with_layout(nb::handle h, F&& f)
{
  if (nb::isinstance<lf>(h)) { return f(nb::cast<lf&>(h)); }
  if (nb::isinstance<pf>(h)) { return f(nb::cast<pf&>(h)); }
  if (nb::isinstance<lft>(h)) { return f(nb::cast<lft&>(h)); }
  if (nb::isinstance<vl>(h)) { return f(nb::cast<vl&>(h)); }
  if (nb::isinstance<hl>(h)) { return f(nb::cast<hl&>(h)); }
  raise_type("expected a strata layout (layer_first, page_first, layer_first_table, vllm_layout, hf_layout), got ",
             nb::type_name(h.type()).c_str());
}

template <class L>
py_layout<L> one_array_layout(nb::ndarray<> a, kv_geometry const& g, std::optional<std::int64_t> pages,
                              char const* what)
{
  g.validate();
  std::int64_t const n = pages_of(what, a.nbytes(), g.page_bytes(), pages);
  array_place const p = check_array(a, what, g, {}, n * g.page_bytes());
  py_layout<L> out{L{p.data, g, n}, {std::move(a)}, p.device_type, p.device_id};
  return out;
}

/// A table of per-(layer, plane) tensors, entry layer * planes + plane, each `[pages * page_tokens, heads, dim]`.
py_layout<layer_first_table> table_layout(std::vector<nb::ndarray<>> arrays, kv_geometry const& g,
                                          std::optional<std::int64_t> pages, char const* what)
{
  g.validate();
  if (std::int64_t(arrays.size()) != g.layers * g.planes) {
    raise_value(what, ": expected layers * planes = ", g.layers * g.planes, " arrays, got ", arrays.size());
  }
  std::int64_t const n = pages_of(what, arrays[0].nbytes(), g.block_bytes(), pages);
  std::vector<array_place> places;
  std::vector<std::byte*> table;
  for (std::size_t i = 0; i < arrays.size(); ++i) {
    std::string const name =
        text(what, " array ", i, " (layer ", i / std::size_t(g.planes), ", plane ", i % std::size_t(g.planes), ")");
    places.push_back(check_array(arrays[i], name, g, {}, n * g.block_bytes()));
    table.push_back(places.back().data);
  }
  check_same(places, what);
  return {layer_first_table{table, g, n}, std::move(arrays), places[0].device_type, places[0].device_id};
}

std::vector<nb::ndarray<>> interleave(std::vector<nb::ndarray<>> k, std::vector<nb::ndarray<>> v, kv_geometry const& g,
                                      char const* what)
{
  if (std::int64_t(k.size()) != g.layers || std::int64_t(v.size()) != g.layers) {
    raise_value(what, ": expected ", g.layers, " K and ", g.layers, " V arrays, got ", k.size(), " and ", v.size());
  }
  std::vector<nb::ndarray<>> out;
  for (std::size_t l = 0; l < k.size(); ++l) {
    out.push_back(std::move(k[l]));
    out.push_back(std::move(v[l]));
  }
  return out;
}

template <class P>
void layout_common(nb::class_<P>& c)
{
  using L = decltype(P::value);
  c.def_prop_ro("geometry", [](P const& p) { return kv_geometry(p.value.geometry()); })
      .def_prop_ro("num_pages", [](P const& p) { return p.value.num_pages(); })
      .def_prop_ro("order", [](P const&) { return L::order; })
      .def_prop_ro("name", [](P const&) { return std::string(L::name); })
      .def_prop_ro("device", &P::device, "Where the memory is: 'cpu', 'cuda:N', 'cuda_host'.")
      .def_prop_ro(
          "arrays", [](P const& p) { return p.arrays; }, "The arrays the layout keeps alive.")
      .def(
          "block",
          [](P const& p, std::int64_t page, std::int64_t layer, std::int64_t plane) {
            auto const& g = p.value.geometry();
            if (page < 0 || page >= p.value.num_pages() || layer < 0 || layer >= g.layers || plane < 0 ||
                plane >= g.planes) {
              throw nb::index_error(text("block(", page, ", ", layer, ", ", plane, ") outside (", p.value.num_pages(),
                                         ", ", g.layers, ", ", g.planes, ")")
                                        .c_str());
            }
            block_ref const b = p.value.block(page, layer, plane);
            return std::make_tuple(reinterpret_cast<std::uintptr_t>(b.data), b.token_stride, b.head_stride);
          },
          "page"_a, "layer"_a, "plane"_a,
          "(address, token_stride, head_stride) of the block's head row (0, 0), strides in bytes.")
      .def("__repr__", [](P const& p) {
        return text(L::name, "(", p.value.num_pages(), " pages, ", repr(p.value.geometry()), ", ", p.device(), ")");
      });
}

void bind_layouts(nb::module_& m)
{
  nb::class_<lf> c_lf(m, "layer_first", "One C-contiguous pool [layer][plane][page][page_tokens][kv_heads][head_dim].");
  c_lf.def(
      "__init__",
      [](lf* self, nb::handle a, kv_geometry const& g, std::optional<std::int64_t> pages) {
        new (self) lf{one_array_layout<layer_first>(to_array(a, "layer_first"), g, pages, "layer_first")};
      },
      "array"_a, "geometry"_a, "num_pages"_a = nb::none());
  layout_common(c_lf);

  nb::class_<pf> c_pf(
      m, "page_first",
      "One C-contiguous pool [page][layer][plane][page_tokens][kv_heads][head_dim]: a page is one record.");
  c_pf.def(
      "__init__",
      [](pf* self, nb::handle a, kv_geometry const& g, std::optional<std::int64_t> pages) {
        new (self) pf{one_array_layout<page_first>(to_array(a, "page_first"), g, pages, "page_first")};
      },
      "array"_a, "geometry"_a, "num_pages"_a = nb::none());
  c_pf.def("page_data", [](pf const& p, std::int64_t page) {
    if (page < 0 || page >= p.value.num_pages()) { throw nb::index_error("page out of range"); }
    return reinterpret_cast<std::uintptr_t>(p.value.page_data(page));
  });
  layout_common(c_pf);

  nb::class_<lft> c_lft(m, "layer_first_table",
                        "One tensor per (layer, plane), each [num_pages * page_tokens, kv_heads, head_dim].");
  c_lft.def(
      "__init__",
      [](lft* self, nb::handle arrays, kv_geometry const& g, std::optional<std::int64_t> pages) {
        new (self) lft{table_layout(to_arrays(arrays, "layer_first_table"), g, pages, "layer_first_table")};
      },
      "arrays"_a, "geometry"_a, "num_pages"_a = nb::none(), "arrays: entry layer * planes + plane.");
  layout_common(c_lft);

  m.def(
      "sglang_layout",
      [](nb::handle k, nb::handle v, kv_geometry const& g, std::optional<std::int64_t> pages) {
        if (g.planes != 2) { raise_value("sglang_layout: planes must be 2 (K and V), got ", g.planes); }
        return table_layout(
            interleave(to_arrays(k, "sglang_layout K"), to_arrays(v, "sglang_layout V"), g, "sglang_layout"), g, pages,
            "sglang_layout");
      },
      "k_buffers"_a, "v_buffers"_a, "geometry"_a, "num_pages"_a = nb::none(),
      "SGLang's MHA pool: per layer a K and a V array [tokens, kv_heads, head_dim] (a layer_first_table).");
  m.def(
      "mla_layout",
      [](nb::handle seq, kv_geometry const& g, std::optional<std::int64_t> pages) {
        auto arrays = to_arrays(seq, "mla_layout");
        if (g.planes != 1 || g.kv_heads != 1) {
          raise_value("mla_layout: an MLA latent has planes=1 and kv_heads=1, got planes=", g.planes,
                      " kv_heads=", g.kv_heads);
        }
        return table_layout(std::move(arrays), g, pages, "mla_layout");
      },
      "layer_buffers"_a, "geometry"_a, "num_pages"_a = nb::none(),
      "An MLA pool: per layer one array [tokens, 1, kv_lora_rank + rope_dim] (a layer_first_table).");

  nb::class_<vl> c_vl(m, "vllm_layout",
                      "vLLM's pool: per layer one array [planes, blocks, block_tokens, kv_heads, head_dim].");
  c_vl.def(
      "__init__",
      [](vl* self, nb::handle seq, kv_geometry const& g, std::optional<std::int64_t> blocks) {
        g.validate();
        auto arrays = to_arrays(seq, "vllm_layout");
        if (std::int64_t(arrays.size()) != g.layers) {
          raise_value("vllm_layout: expected ", g.layers, " arrays, got ", arrays.size());
        }
        std::int64_t const n = pages_of("vllm_layout", arrays[0].nbytes(), g.planes * g.block_bytes(), blocks);
        std::vector<array_place> places;
        std::vector<std::byte*> table;
        for (std::size_t i = 0; i < arrays.size(); ++i) {
          places.push_back(check_array(arrays[i], text("vllm_layout array ", i), g,
                                       {g.planes, n, g.page_tokens, g.kv_heads, g.head_dim}, -1));
          table.push_back(places.back().data);
        }
        check_same(places, "vllm_layout");
        new (self) vl{vllm_layout{table, g, n}, std::move(arrays), places[0].device_type, places[0].device_id};
      },
      "layer_buffers"_a, "geometry"_a, "num_blocks"_a = nb::none());
  layout_common(c_vl);

  nb::class_<hl> c_hl(m, "hf_layout",
                      "Hugging Face's cache: per layer a K and a V array [batch, kv_heads, seq_capacity, head_dim]; "
                      "page p is tokens of batch entry p // pages_per_sequence.");
  c_hl.def(
      "__init__",
      [](hl* self, nb::handle ks, nb::handle vs, kv_geometry const& g) {
        g.validate();
        auto k = to_arrays(ks, "hf_layout K");
        auto v = g.planes == 2 ? to_arrays(vs, "hf_layout V") : std::vector<nb::ndarray<>>{};
        if (std::int64_t(k.size()) != g.layers || std::int64_t(v.size()) != (g.planes == 2 ? g.layers : 0)) {
          raise_value("hf_layout: expected ", g.layers, " K and ", g.planes == 2 ? g.layers : 0, " V arrays, got ",
                      k.size(), " and ", v.size());
        }
        if (k[0].ndim() != 4) {
          raise_value("hf_layout: expected 4-D arrays [batch, kv_heads, seq, head_dim], got shape ", shape_of(k[0]));
        }
        std::int64_t const batch = std::int64_t(k[0].shape(0)), cap = std::int64_t(k[0].shape(2));
        std::vector<array_place> places;
        std::vector<std::byte*> kp, vp;
        for (std::size_t l = 0; l < k.size(); ++l) {
          places.push_back(check_array(k[l], text("hf_layout K ", l), g, {batch, g.kv_heads, cap, g.head_dim}, -1));
          kp.push_back(places.back().data);
        }
        for (std::size_t l = 0; l < v.size(); ++l) {
          places.push_back(check_array(v[l], text("hf_layout V ", l), g, {batch, g.kv_heads, cap, g.head_dim}, -1));
          vp.push_back(places.back().data);
        }
        check_same(places, "hf_layout");
        std::vector<nb::ndarray<>> all = std::move(k);
        for (auto& a : v) {
          all.push_back(std::move(a));
        }
        new (self) hl{hf_layout{kp, vp, g, batch, cap}, std::move(all), places[0].device_type, places[0].device_id};
      },
      "k_buffers"_a, "v_buffers"_a, "geometry"_a);
  c_hl.def_prop_ro("pages_per_sequence", [](hl const& p) { return p.value.pages_per_sequence(); });
  layout_common(c_hl);
}

// --- copy plans and host_copy -------------------------------------------------------------------

struct py_copy_plan {
  nb::object src, dst;
  std::vector<page_pair> pages;
  layer_range layers;
};

template <class F>
decltype(auto) with_plan(py_copy_plan const& p, F&& f)
{
  return with_layout(p.src, [&](auto& s) -> decltype(auto) {
    return with_layout(p.dst, [&](auto& d) -> decltype(auto) {
      copy_plan const plan{s.value, d.value, std::span<page_pair const>{p.pages}, p.layers};
      return f(plan, s, d);
    });
  });
}

void run_host_copy(py_copy_plan const& p)
{
  with_plan(p, [&](auto const& plan, auto const& s, auto const& d) {
    if (!s.cpu() || !d.cpu()) {
      raise_value("host_copy: both layouts must be in CPU-accessible memory (source on ", s.device(),
                  ", destination on ", d.device(), ")");
    }
    nb::gil_scoped_release unlocked;
    host_copy{}.copy(plan);
  });
}

layer_range to_layers(nb::handle src, std::optional<std::pair<std::int64_t, std::int64_t>> layers)
{
  if (layers) { return {layers->first, layers->second}; }
  return with_layout(src, [](auto& s) { return layer_range::all(s.value.geometry()); });
}

void bind_transfer(nb::module_& m)
{
  nb::class_<py_copy_plan>(m, "copy_plan",
                           "(source page, destination page) pairs over a layer range between two layouts.")
      .def(
          "__init__",
          [](py_copy_plan* self, nb::object src, nb::object dst, page_pairs pages,
             std::optional<std::pair<std::int64_t, std::int64_t>> layers) {
            layer_range const lr = to_layers(src, layers);
            (void)with_layout(dst, [](auto&) { return 0; });
            new (self) py_copy_plan{std::move(src), std::move(dst), std::move(pages.v), lr};
          },
          "src"_a, "dst"_a, "pages"_a, "layers"_a = nb::none(), "layers: (begin, end), default all layers.")
      .def_ro("src", &py_copy_plan::src)
      .def_ro("dst", &py_copy_plan::dst)
      .def_prop_ro("pages",
                   [](py_copy_plan const& p) {
                     std::vector<std::pair<std::int64_t, std::int64_t>> out;
                     for (auto const& x : p.pages) {
                       out.emplace_back(x.src, x.dst);
                     }
                     return out;
                   })
      .def_prop_ro("layers", [](py_copy_plan const& p) { return std::make_pair(p.layers.begin, p.layers.end); })
      .def("bytes",
           [](py_copy_plan const& p) {
             return with_plan(p, [](auto const& plan, auto&, auto&) { return plan.bytes(); });
           })
      .def(
          "validate",
          [](py_copy_plan const& p) { with_plan(p, [](auto const& plan, auto&, auto&) { validate(plan); }); },
          "Raises InvalidArgument for a plan that cannot be executed exactly.")
      .def(
          "runs",
          [](py_copy_plan const& p) {
            return with_plan(p, [](auto const& plan, auto&, auto&) {
              validate(plan);
              std::vector<std::tuple<std::uintptr_t, std::uintptr_t, std::int64_t>> out;
              for_each_run(plan, [&](copy_run const& r) {
                out.emplace_back(reinterpret_cast<std::uintptr_t>(r.src), reinterpret_cast<std::uintptr_t>(r.dst),
                                 r.bytes);
              });
              return out;
            });
          },
          "Maximal contiguous runs (source address, destination address, bytes), in copy order.");

  m.def("host_copy", &run_host_copy, "plan"_a,
        "Validates the plan, then copies it with memcpy on the calling thread (the GIL released).");
  m.def(
      "host_copy",
      [](nb::object src, nb::object dst, page_pairs pages,
         std::optional<std::pair<std::int64_t, std::int64_t>> layers) {
        layer_range const lr = to_layers(src, layers);
        run_host_copy(py_copy_plan{std::move(src), std::move(dst), std::move(pages.v), lr});
      },
      "src"_a, "dst"_a, "pages"_a, "layers"_a = nb::none());
}

// --- the prefix index ---------------------------------------------------------------------------

void bind_index(nb::module_& m)
{
  nb::class_<hiradix_config>(m, "hiradix_config")
      .def(nb::init<>())
      .def_rw("page_tokens", &hiradix_config::page_tokens)
      .def_rw("tokens_per_id", &hiradix_config::tokens_per_id)
      .def_rw("page_bytes", &hiradix_config::page_bytes)
      .def_rw("capacity", &hiradix_config::capacity, "Pages per tier [device, host, file, remote] (0: absent).")
      .def_rw("backup_policy", &hiradix_config::backup_policy)
      .def_rw("file_backup_policy", &hiradix_config::file_backup_policy)
      .def_rw("remote_backup_policy", &hiradix_config::remote_backup_policy)
      .def_rw("selective_hits", &hiradix_config::selective_hits)
      .def_rw("delay_hit_tokens", &hiradix_config::delay_hit_tokens);

  nb::class_<match_result>(m, "match_result")
      .def_ro("tokens", &match_result::tokens)
      .def_ro("tier_tokens", &match_result::tier_tokens)
      .def_ro("device_prefix_tokens", &match_result::device_prefix_tokens)
      .def_ro("fastest_tokens", &match_result::fastest_tokens)
      .def_ro("node", &match_result::node)
      .def_ro("transient_tokens", &match_result::transient_tokens)
      .def_ro("transient", &match_result::transient)
      .def_prop_ro("transient_owner", [](match_result const& r) { return r.transient_owner.value; })
      .def_ro("delay_hit", &match_result::delay_hit)
      .def("__repr__", [](match_result const& r) {
        return text("match_result(tokens=", r.tokens, ", device_prefix_tokens=", r.device_prefix_tokens,
                    ", transient_tokens=", r.transient_tokens, ", delay_hit=", r.delay_hit, ")");
      });
  nb::class_<insert_result>(m, "insert_result")
      .def_ro("new_pages", &insert_result::new_pages)
      .def_ro("node", &insert_result::node)
      .def_ro("unused_device_pages", &insert_result::unused_device_pages);
  nb::class_<adopt_result>(m, "adopt_result").def_ro("pages", &adopt_result::pages).def_ro("node", &adopt_result::node);
  nb::class_<discard_result>(m, "discard_result")
      .def_ro("dropped", &discard_result::dropped)
      .def_ro("pages", &discard_result::pages)
      .def_ro("freed_device", &discard_result::freed_device);
  nb::class_<eviction_result>(m, "eviction_result")
      .def_ro("pages", &eviction_result::pages)
      .def_ro("freed", &eviction_result::freed)
      .def_ro("demotions", &eviction_result::demotions);
  nb::class_<hiradix_stats>(m, "hiradix_stats")
      .def_ro("hit_tokens", &hiradix_stats::hit_tokens)
      .def_ro("matched_tokens", &hiradix_stats::matched_tokens)
      .def_ro("queried_tokens", &hiradix_stats::queried_tokens)
      .def_ro("delay_hits", &hiradix_stats::delay_hits)
      .def_ro("evicted_pages", &hiradix_stats::evicted_pages)
      .def_ro("resident_pages", &hiradix_stats::resident_pages)
      .def_ro("resident_bytes", &hiradix_stats::resident_bytes);

  using T = hiradix_tree;
  using pages_t = std::vector<std::int64_t>;
  nb::class_<T>(m, "hiradix_tree", "The prefix index over tiers (a standalone tree makes its own slot allocators).")
      .def(nb::init<hiradix_config>(), "config"_a = hiradix_config{})
      .def_prop_ro("config", &T::config)
      .def_prop_ro("root", &T::root)
      .def("has_tier", &T::has_tier, "tier"_a)
      .def(
          "match", [](T& t, token_ids const& tokens) { return t.match(tokens.v); }, "tokens"_a,
          "The cached prefix of tokens; a use (counts a hit, refreshes LRU, splits the node it ends in).")
      .def(
          "probe", [](T const& t, token_ids const& tokens) { return t.probe(tokens.v); }, "tokens"_a,
          "As match, with no side effects.")
      .def(
          "peek", [](T const& t, token_ids const& tokens) { return t.peek(tokens.v); }, "tokens"_a)
      .def("path_pages", &T::path_pages, "node"_a, "tier"_a, "arriving_too"_a = false)
      .def("path_length", &T::path_length, "node"_a)
      .def("pages_to_load", &T::pages_to_load, "node"_a)
      .def("alive", &T::alive, "node"_a)
      .def("holds", &T::holds, "tier"_a, "page"_a)
      .def(
          "insert", [](T& t, token_ids const& tokens, pages_t const& pages) { return t.insert(tokens.v, pages); },
          "tokens"_a, "device_pages"_a, "Free the result's unused_device_pages.")
      .def(
          "load", [](T& t, node_ref n, pages_t const& pages) { return t.load(n, pages); }, "node"_a, "device_pages"_a,
          "Copy orders bringing the node's path onto these device pages; run each, then complete(id).")
      .def("evict", &T::evict, "tier"_a, "pages"_a)
      .def("take_copies", &T::take_copies, "Backups and demotions queued by the write policy: run and complete each.")
      .def("take_internal_evictions", &T::take_internal_evictions)
      .def("complete", &T::complete, "id"_a, "A copy landed: returns device pages freed.")
      .def("cancel", &T::cancel, "id"_a, "A copy failed: returns device pages freed.")
      .def("pending_transfers", &T::pending_transfers)
      .def(
          "page_key",
          [](T const& t, token_ids const& page, std::uint64_t parent) { return t.page_key(page.v, parent); }, "page"_a,
          "parent_key"_a = 0)
      .def(
          "adopt",
          [](T& t, tier k, token_ids const& tokens, pages_t const& slots) { return t.adopt(k, tokens.v, slots); },
          "tier"_a, "tokens"_a, "slots"_a)
      .def("prefetch", &T::prefetch, "node"_a)
      .def("discard", &T::discard, "node"_a, "tier"_a)
      .def(
          "mark_in_queue",
          [](T& t, std::uint64_t request, token_ids const& tokens) { return t.mark_in_queue({request}, tokens.v); },
          "request"_a, "tokens"_a)
      .def(
          "mark_in_flight", [](T& t, std::uint64_t request) { t.mark_in_flight({request}); }, "request"_a)
      .def(
          "commit", [](T& t, std::uint64_t request, pages_t const& pages) { return t.commit({request}, pages); },
          "request"_a, "device_pages"_a)
      .def(
          "abort", [](T& t, std::uint64_t request) { t.abort({request}); }, "request"_a)
      .def(
          "transient_pages", [](T const& t, std::uint64_t request) { return t.transient_pages({request}); },
          "request"_a)
      .def("lock", &T::lock, "node"_a, "tier"_a)
      .def("unlock", &T::unlock, "node"_a, "tier"_a)
      .def("locks", &T::locks, "node"_a, "tier"_a)
      .def("evictable_pages", &T::evictable_pages, "tier"_a)
      .def("reclaimable_pages", &T::reclaimable_pages, "tier"_a)
      .def("stats", &T::stats)
      .def("node_count", &T::node_count)
      .def("resident", &T::resident, "node"_a, "tier"_a)
      .def("free_slots", &T::free_slots, "tier"_a)
      .def("memory_bytes", &T::memory_bytes)
      .def("check_invariants", &T::check_invariants);
}

// --- file tier ----------------------------------------------------------------------------------

void bind_file_store(nb::module_& m)
{
  nb::class_<file_store_options>(m, "file_store_options")
      .def(
          "__init__",
          [](file_store_options* self, std::string directory) {
            new (self) file_store_options{};
            self->directory = std::move(directory);
          },
          "directory"_a = "")
      .def_rw("directory", &file_store_options::directory)
      .def_rw("directories", &file_store_options::directories,
              "One directory per drive instead of directory: records striped across them, a queue per drive")
      .def_rw("files", &file_store_options::files)
      .def_rw("tp_rank", &file_store_options::tp_rank)
      .def_rw("tp_size", &file_store_options::tp_size)
      .def_rw("tag", &file_store_options::tag)
      .def_rw("use_direct_io", &file_store_options::use_direct_io)
      .def_rw("use_io_uring", &file_store_options::use_io_uring)
      .def_rw("io_threads", &file_store_options::io_threads)
      .def_rw("reopen", &file_store_options::reopen)
      .def_rw("verify_on_reopen", &file_store_options::verify_on_reopen)
      .def_rw("sync_writes", &file_store_options::sync_writes)
      .def_rw("max_io_bytes", &file_store_options::max_io_bytes)
      .def_rw("lock_wait_ms", &file_store_options::lock_wait_ms);

  nb::class_<recovered_record>(m, "recovered_record")
      .def_ro("slot", &recovered_record::slot)
      .def_ro("key", &recovered_record::key)
      .def_ro("parent_key", &recovered_record::parent_key)
      .def_ro("ids", &recovered_record::ids);

  nb::class_<file_store>(m, "file_store",
                         "The NVMe tier: one checksummed record per page. Not movable: controllers hold it by "
                         "reference and keep it alive.")
      .def(
          "__init__",
          [](file_store* self, kv_geometry const& g, std::int64_t pages, file_store_options options) {
            nb::gil_scoped_release unlocked;
            new (self) file_store(g, pages, std::move(options));
          },
          "geometry"_a, "pages"_a, "options"_a)
      .def_prop_ro("geometry", &file_store::geometry)
      .def_prop_ro("capacity", &file_store::capacity)
      .def_prop_ro("record_bytes", &file_store::record_bytes)
      .def_prop_ro("uses_io_uring", &file_store::uses_io_uring)
      .def_prop_ro("direct_io", &file_store::direct_io)
      .def_prop_ro("paths", &file_store::paths)
      .def_prop_ro("directories", &file_store::directories)
      .def("drive", &file_store::drive, "slot"_a, "The drive (index into directories) that holds a slot")
      .def_prop_ro("recovered",
                   [](file_store const& f) {
                     auto const r = f.recovered();
                     return std::vector<recovered_record>(r.begin(), r.end());
                   })
      .def_prop_ro("dropped", &file_store::dropped)
      .def_prop_ro("last_error", &file_store::last_error)
      .def("key", &file_store::key, "slot"_a)
      .def("slots_used", [](file_store const& f) { return f.slots().used(); });
}

// --- the controller -----------------------------------------------------------------------------

/// A controller with what it must outlive: the layout's arrays, the file tier, the remote store
/// (and the face the controller reaches it through).
struct py_controller {
  nb::object layout;
  nb::object file;
  nb::object remote;
  std::unique_ptr<keyed_store_api> remote_face;
  std::unique_ptr<controller_api> c;
  py_controller(nb::object l, nb::object f, std::unique_ptr<controller_api> p, nb::object r = nb::none(),
                std::unique_ptr<keyed_store_api> face = nullptr)
      : layout{std::move(l)}, file{std::move(f)}, remote{std::move(r)}, remote_face{std::move(face)}, c{std::move(p)}
  {
  }
  py_controller(py_controller const&) = delete;
  ~py_controller() { c.reset(); }  // the controller goes before what it refers to
  controller_api& get() const { return *c; }
};

/// A CPU engine's bundle with a file tier below the host.
template <kv_layout Layout>
struct host_file_policies {
  using tiers = tier_stack<device_pool<Layout>, host_pool, file_store&>;
  using scheduler = strata_scheduler;
  using executor = cpu_executor;
};

/// A CPU engine's bundle with a shared remote tier below the host (and a file tier between them).
template <kv_layout Layout>
struct host_remote_policies {
  using tiers = tier_stack<device_pool<Layout>, host_pool, remote_tier<keyed_store_api>>;
  using scheduler = strata_scheduler;
  using executor = cpu_executor;
};
template <kv_layout Layout>
struct host_file_remote_policies {
  using tiers = tier_stack<device_pool<Layout>, host_pool, file_store&, remote_tier<keyed_store_api>>;
  using scheduler = strata_scheduler;
  using executor = cpu_executor;
};

/// The face a controller reaches a Python `redis_store` through (null for None).
std::unique_ptr<keyed_store_api> remote_face(nb::object const& remote, char const* who)
{
  if (remote.is_none()) { return nullptr; }
#if STRATA_PYTHON_REDIS
  return std::make_unique<redis_store_face>(nb::cast<redis_store&>(remote));
#else
  raise_value(who, ": this module was built without hiredis: no remote tier");
#endif
}

template <class Layout>
std::unique_ptr<controller_api> make_host(py_layout<Layout> const& layout, std::int64_t host_pages,
                                          controller_options const& o, file_store* file, keyed_store_api* remote)
{
  if (!layout.cpu()) {
    raise_value("cpu_controller: the CPU executor copies with memcpy: the layout must be in CPU memory, it is on ",
                layout.device(), " (use gpu_controller for CUDA tensors)");
  }
  kv_geometry const g = layout.value.geometry();
  if (remote != nullptr) {
    if constexpr (std::is_same_v<Layout, layer_first_table>) {
      remote_tier<keyed_store_api> tier{*remote, g};
      if (file != nullptr) {
        using C = cache_controller<host_file_remote_policies<Layout>>;
        return std::make_unique<controller_impl<C, host_hooks>>(
            typename C::tiers_type{device_pool<Layout>{layout.value}, host_pool{g, host_pages}, *file, std::move(tier)},
            o, strata_scheduler{}, cpu_executor{});
      }
      using C = cache_controller<host_remote_policies<Layout>>;
      return std::make_unique<controller_impl<C, host_hooks>>(
          typename C::tiers_type{device_pool<Layout>{layout.value}, host_pool{g, host_pages}, std::move(tier)}, o,
          strata_scheduler{}, cpu_executor{});
    }
  }
  if (file != nullptr) {
    using C = cache_controller<host_file_policies<Layout>>;
    return std::make_unique<controller_impl<C, host_hooks>>(
        typename C::tiers_type{device_pool<Layout>{layout.value}, host_pool{g, host_pages}, *file}, o,
        strata_scheduler{}, cpu_executor{});
  }
  using C = cache_controller<cpu_policies<Layout>>;
  return std::make_unique<controller_impl<C, host_hooks>>(
      typename C::tiers_type{device_pool<Layout>{layout.value}, host_pool{g, host_pages}}, o, strata_scheduler{},
      cpu_executor{});
}

py_controller* cpu_controller(nb::object layout, std::int64_t host_pages, std::optional<controller_options> options,
                              nb::object file, nb::object remote)
{
  controller_options const o = options.value_or(controller_options{});
  file_store* fs = file.is_none() ? nullptr : &nb::cast<file_store&>(file);
  std::unique_ptr<keyed_store_api> face = remote_face(remote, "cpu_controller");
  keyed_store_api* rs = face.get();
  std::unique_ptr<controller_api> c;
  if (nb::isinstance<lft>(layout)) {
    auto const& l = nb::cast<lft const&>(layout);
    nb::gil_scoped_release unlocked;
    c = make_host(l, host_pages, o, fs, rs);
  } else if (nb::isinstance<lf>(layout)) {
    if (fs != nullptr || rs != nullptr) {
      raise_value("cpu_controller: a file or remote tier needs a layer_first_table pool");
    }
    auto const& l = nb::cast<lf const&>(layout);
    nb::gil_scoped_release unlocked;
    c = make_host(l, host_pages, o, fs, rs);
  } else {
    raise_type(
        "cpu_controller: the engine's pool must be a layer_first_table (sglang_layout, mla_layout) or a "
        "layer_first, got ",
        nb::type_name(layout.type()).c_str());
  }
  return new py_controller{std::move(layout), std::move(file), std::move(c), std::move(remote), std::move(face)};
}

#if STRATA_PYTHON_CUDA
// --- the GPU transfer backends and the pinned host pool ------------------------------------------

struct py_gpu_copier {
  std::unique_ptr<gpu_copier_api> impl;
};

/// An enqueued copy; keeps its plan (hence both layouts' arrays) and its copier alive until it lands.
struct py_gpu_transfer {
  std::unique_ptr<gpu_transfer_api> impl;
  nb::object plan, copier;
  ~py_gpu_transfer()
  {
    nb::gil_scoped_release unlocked;  // the destructor waits for the copy
    impl.reset();
  }
};

copier_kind to_copier_kind(nb::handle backend)
{
  if (nb::isinstance<nb::int_>(backend)) {
    int const b = nb::cast<int>(backend);
    if (b < 0 || b > 3) {
      raise_value("gpu_copier: backend ", b, " is not 0 (gpu_assisted), 1 (dma_batch), 2 (staged) or 3 (dma_copy)");
    }
    return copier_kind(b);
  }
  std::string const name = nb::cast<std::string>(backend);
  if (name == "gpu_assisted") { return copier_kind::gpu_assisted; }
  if (name == "dma_batch") { return copier_kind::dma_batch; }
  if (name == "staged") { return copier_kind::staged; }
  if (name == "dma_copy") { return copier_kind::dma_copy; }
  raise_value("gpu_copier: unknown backend '", name, "' (gpu_assisted, dma_batch, staged, dma_copy)");
}

void bind_gpu_transfer(nb::module_& m)
{
  nb::class_<py_gpu_transfer>(m, "gpu_transfer", "A copy a gpu_copier enqueued (a transfer_handle).")
      .def(
          "wait_layer",
          [](py_gpu_transfer const& t, std::int64_t layer, std::uintptr_t stream) {
            t.impl->wait_layer(layer, stream);
          },
          "layer"_a, "stream"_a = 0, "Makes `stream` wait until `layer` has landed (per-layer copies).")
      .def(
          "wait", [](py_gpu_transfer const& t, std::uintptr_t stream) { t.impl->wait(stream); }, "stream"_a = 0,
          "Makes `stream` wait for the whole copy.")
      .def(
          "synchronize", [](py_gpu_transfer const& t) { t.impl->synchronize(); },
          nb::call_guard<nb::gil_scoped_release>(), "Blocks until the whole copy has landed.")
      .def("done", [](py_gpu_transfer const& t) { return t.impl->done(); }, "True once the copy has landed.");

  nb::class_<py_gpu_copier>(m, "gpu_copier",
                            "One transfer backend: gpu_assisted (SM copy kernels on `ctas` SMs), dma_batch "
                            "(cudaMemcpyBatchAsync), staged (records by the copy engine, relayed by a kernel) or "
                            "dma_copy (one cudaMemcpyAsync per block: the baseline).")
      .def(
          "__init__",
          [](py_gpu_copier* self, nb::object backend, int ctas) {
            copier_kind const k = to_copier_kind(backend);
            new (self) py_gpu_copier{make_gpu_copier(k, ctas)};
          },
          "backend"_a = "gpu_assisted", "ctas"_a = 2)
      .def_prop_ro("name", [](py_gpu_copier const& c) { return std::string(c.impl->name()); })
      .def(
          "copy",
          [](nb::object self, nb::object plan_obj, std::uintptr_t stream, bool per_layer) {
            auto& c = nb::cast<py_gpu_copier&>(self);
            auto const& p = nb::cast<py_copy_plan const&>(plan_obj);
            std::unique_ptr<gpu_transfer_api> t = with_plan(p, [&](auto const& plan, auto const& s, auto const& d) {
              gpu_layout const src{s.value};
              gpu_layout const dst{d.value};
              nb::gil_scoped_release unlocked;
              return c.impl->copy(src, dst, plan.pages, plan.layers, stream, per_layer);
            });
            return new py_gpu_transfer{std::move(t), std::move(plan_obj), std::move(self)};
          },
          "plan"_a, "stream"_a = 0, "per_layer"_a = true, nb::rv_policy::take_ownership,
          "Validates `plan` and enqueues it on `stream` (one side page_first: the host tier's records; host "
          "memory pinned for gpu_assisted and staged); returns its gpu_transfer. Nothing is enqueued for a "
          "rejected plan.");

  m.def(
      "pinned_host_pool",
      [](kv_geometry const& g, std::int64_t pages, bool registered) {
        std::unique_ptr<pinned_pool_api> pool;
        {
          nb::gil_scoped_release unlocked;
          pool = make_pinned_pool(g, pages, registered);
        }
        std::byte* data = pool->data();
        std::size_t const shape[3] = {std::size_t(pages), std::size_t(g.page_bytes() / (g.elem_bytes * g.head_dim)),
                                      std::size_t(g.head_dim)};
        nb::dlpack::dtype const dt{std::uint8_t(nb::dlpack::dtype_code::UInt), std::uint8_t(8 * g.elem_bytes), 1};
        nb::capsule owner(pool.release(), [](void* p) noexcept { delete static_cast<pinned_pool_api*>(p); });
        return nb::ndarray<nb::numpy>(data, 3, shape, owner, nullptr, dt);
      },
      "geometry"_a, "pages"_a, "registered"_a = false,
      "The host tier's memory (pinned_host_pool, one chunk): pinned, device-mapped page-first records as an array "
      "[pages, page_bytes / (elem_bytes * head_dim), head_dim] of unsigned integers of elem_bytes (view it as the "
      "cache's dtype), freed with the last array using it. Wrap it as `page_first(array, geometry)`.");
}
#endif

void bind_controller(nb::module_& m)
{
  nb::class_<controller_options>(m, "controller_options", "Settings of a cache controller.")
      .def(nb::init<>())
      .def_rw("backup_policy", &controller_options::backup_policy, "When device pages are backed up to the host.")
      .def_rw("remote_backup_policy", &controller_options::remote_backup_policy,
              "Host -> remote copies: as soon as a page is on the host (write_through, the default), or when it "
              "leaves the tier above (write_back).")
      .def_rw("file_backup_policy", &controller_options::file_backup_policy,
              "When host pages are copied to the file tier.")
      .def_rw("prefetch", &controller_options::prefetch)
      .def_rw("prefetch_timeout_s", &controller_options::prefetch_timeout_s)
      .def_rw("selective_hits", &controller_options::selective_hits)
      .def_rw("delay_hit_tokens", &controller_options::delay_hit_tokens)
      .def_rw("ids_are_pages", &controller_options::ids_are_pages)
      .def_rw("records_by_cost", &controller_options::records_by_cost,
              "Copy into the file tier only pages a later read pays for (cost_model::record_breakeven_tokens); "
              "False: every page the write policies send.")
      .def_rw("record_write_backlog_s", &controller_options::record_write_backlog_s,
              "What may be on its way into the file tier at once, in seconds of its write bandwidth; a copy past "
              "it is dropped (0: no bound).")
      .def_rw("device_pages_by_chunk", &controller_options::device_pages_by_chunk,
              "Each chunk's begin_loads takes the device pages it computes into (read page_table after every "
              "begin_loads); False (the default): a request's first chunk takes all of its pages.")
      .def(
          "set_file_tier",
          [](controller_options& o, kv_geometry const& g, double read_bytes_per_s, double write_bytes_per_s) {
            cost_model c = o.costs.page_bytes() == 0 ? h200::costs_for(g) : o.costs;
            c.set_file_tier(read_bytes_per_s, write_bytes_per_s);  // throws before anything changes
            o.costs = c;
          },
          "geometry"_a, "read_bytes_per_s"_a, "write_bytes_per_s"_a,
          "The cost model's file-tier bandwidths (cost_model::set_file_tier), over the H200 figures for the "
          "pool's `geometry` (h200::costs_for) unless a model was set already. What the controller predicts a "
          "file-tier hit costs against recomputing it (prefetch and load, or recompute); defaults: 1.92e9 / "
          "2.88e9 B/s, the H200 machine's disk.")
      .def(
          "set_remote_tier",
          [](controller_options& o, kv_geometry const& g, double read_bytes_per_s, double write_bytes_per_s,
             double latency_s) {
            cost_model c = o.costs.page_bytes() == 0 ? h200::costs_for(g) : o.costs;
            c.set_remote_tier(read_bytes_per_s, write_bytes_per_s, latency_s);  // throws before anything changes
            o.costs = c;
          },
          "geometry"_a, "read_bytes_per_s"_a, "write_bytes_per_s"_a, "latency_s"_a,
          "The cost model's remote-tier rates and round trip (cost_model::set_remote_tier; measure them with "
          "measure_keyed_store), over the H200 figures unless a model was set already; defaults: 10e9 B/s, 1 ms.")
      .def_prop_ro(
          "file_read_bytes_per_s",
          [](controller_options const& o) -> std::optional<double> {
            if (o.costs.page_bytes() == 0) { return std::nullopt; }
            return o.costs.io().load_bytes_per_s[std::size_t(tier::file)];
          },
          "The cost model's file-tier read bandwidth (None: the H200 default, chosen by the controller).");

  nb::class_<schedule_budget>(m, "schedule_budget")
      .def(
          "__init__",
          [](schedule_budget* self, std::int64_t tokens, std::int64_t seqs, std::int64_t ctx, std::int64_t left) {
            new (self) schedule_budget{tokens, seqs, ctx, left};
          },
          "tokens"_a = 8192, "running_sequences"_a = 0, "running_context_tokens"_a = 0, "running_max_remaining"_a = 0)
      .def_rw("tokens", &schedule_budget::tokens)
      .def_rw("running_sequences", &schedule_budget::running_sequences)
      .def_rw("running_context_tokens", &schedule_budget::running_context_tokens)
      .def_rw("running_max_remaining", &schedule_budget::running_max_remaining);

  nb::class_<prefill_item>(m, "prefill_item")
      .def_ro("index", &prefill_item::index)
      .def_prop_ro("id", [](prefill_item const& p) { return p.id.value; })
      .def_ro("chunk_tokens", &prefill_item::chunk_tokens)
      .def_ro("context_tokens", &prefill_item::context_tokens)
      .def_ro("cached_tokens", &prefill_item::cached_tokens)
      .def_ro("load_pages", &prefill_item::load_pages)
      .def_ro("new_pages", &prefill_item::new_pages)
      .def_ro("first_chunk", &prefill_item::first_chunk)
      .def_ro("last_chunk", &prefill_item::last_chunk)
      .def_ro("cached_node", &prefill_item::cached_node)
      .def("__repr__", [](prefill_item const& p) {
        return text("prefill_item(id=", p.id.value, ", context_tokens=", p.context_tokens,
                    ", chunk_tokens=", p.chunk_tokens, ", cached_tokens=", p.cached_tokens,
                    p.first_chunk ? ", first" : "", p.last_chunk ? ", last" : "", ")");
      });
  nb::class_<deferral>(m, "deferral")
      .def_ro("index", &deferral::index)
      .def_prop_ro("id", [](deferral const& d) { return d.id.value; })
      .def_ro("reason", &deferral::reason)
      .def_prop_ro("waiting_for", [](deferral const& d) { return d.waiting_for.value; });
  nb::class_<batch_plan>(m, "batch_plan", "What runs next; pass it to begin_loads before the next schedule.")
      .def_ro("prefills", &batch_plan::prefills)
      .def_ro("deferred", &batch_plan::deferred)
      .def_ro("bubble_decode_steps", &batch_plan::bubble_decode_steps)
      .def_ro("predicted_load_s", &batch_plan::predicted_load_s)
      .def_ro("predicted_serial_load_s", &batch_plan::predicted_serial_load_s)
      .def_ro("predicted_compute_s", &batch_plan::predicted_compute_s)
      .def_ro("round", &batch_plan::round)
      .def("tokens", &batch_plan::tokens);
  nb::class_<started_request>(m, "started_request")
      .def_prop_ro("id", [](started_request const& s) { return s.id.value; })
      .def_ro("cached_pages", &started_request::cached_pages, "Prompt pages found cached, by tier they came from.");
  nb::class_<loads_info>(m, "load_handle", "The loads of one batch and what it runs.")
      .def_ro("round", &loads_info::round)
      .def_ro("ran", &loads_info::ran)
      .def_ro("skipped", &loads_info::skipped)
      .def_ro("started", &loads_info::started)
      .def_ro("loaded_pages", &loads_info::loaded_pages)
      .def_ro("after", &loads_info::after, "Earlier batches' loads this batch also waits for.")
      .def("has_loads", [](loads_info const& l) { return l.has_loads; });
  nb::class_<prefill_info>(m, "prefill_result")
      .def_ro("duplicate_positions", &prefill_info::duplicate_positions)
      .def_ro("after", &prefill_info::after, "Loads still filling pages the page table now points at.");
  nb::class_<cache_stats>(m, "cache_stats")
      .def_ro("hit_tokens", &cache_stats::hit_tokens)
      .def_ro("computed_tokens", &cache_stats::computed_tokens)
      .def_ro("bytes_moved", &cache_stats::bytes_moved, "[from][to] tier.")
      .def_ro("deferrals", &cache_stats::deferrals)
      .def_ro("evicted_pages", &cache_stats::evicted_pages)
      .def_ro("submitted", &cache_stats::submitted)
      .def_ro("released", &cache_stats::released)
      .def_ro("failed_transfers", &cache_stats::failed_transfers)
      .def_ro("requeued", &cache_stats::requeued)
      .def_ro("discarded_pages", &cache_stats::discarded_pages)
      .def_ro("prefetched_pages", &cache_stats::prefetched_pages)
      .def_ro("prefetch_waits", &cache_stats::prefetch_waits)
      .def_ro("prefetch_timeouts", &cache_stats::prefetch_timeouts)
      .def_ro("prefetch_abandoned_pages", &cache_stats::prefetch_abandoned_pages)
      .def_ro("prefetch_not_worth_pages", &cache_stats::prefetch_not_worth_pages)
      .def_ro("recomputed_pages", &cache_stats::recomputed_pages,
              "Cached file-tier pages the plans chose to recompute instead of reading.")
      .def_ro("recomputed_read_s", &cache_stats::recomputed_read_s)
      .def_ro("recomputed_compute_s", &cache_stats::recomputed_compute_s)
      .def_ro("writes_not_worth", &cache_stats::writes_not_worth,
              "[tier]: pages kept out because reading them back would not beat recomputing them.")
      .def_ro("writes_dropped", &cache_stats::writes_dropped, "[tier]: pages not written: the write backlog was full.")
      .def_ro("restored_pages", &cache_stats::restored_pages)
      .def_ro("restore_dropped", &cache_stats::restore_dropped)
      .def_ro("remote_lookups", &cache_stats::remote_lookups)
      .def_ro("remote_found_pages", &cache_stats::remote_found_pages)
      .def_ro("remote_lookup_waits", &cache_stats::remote_lookup_waits);
  nb::class_<executor_stats>(m, "executor_stats")
      .def_ro("transfers", &executor_stats::transfers, "[load, copy][gpu_assisted, dma_batch, staged].")
      .def_ro("bytes", &executor_stats::bytes)
      .def_ro("failed_submissions", &executor_stats::failed_submissions)
      .def_ro("dma_descriptor_us", &executor_stats::dma_descriptor_us,
              "What a dma_batch descriptor costs its enqueuing thread as observed now, µs (0: host executor).");
  nb::class_<executor_calibration>(m, "executor_calibration",
                                   "What warm_up measured on this machine (zeros: the host executor).")
      .def_ro("load_gbps", &executor_calibration::load_gbps,
              "Host -> device GB/s by backend [gpu_assisted, dma_batch, staged] (staged: not measured, 0).")
      .def_ro("copy_gbps", &executor_calibration::copy_gbps, "Device -> host GB/s by backend.")
      .def_ro("dma_descriptor_us", &executor_calibration::dma_descriptor_us, "Host time per dma_batch descriptor, µs.");

  using P = py_controller;
  using release_gil = nb::call_guard<nb::gil_scoped_release>;
  nb::class_<P>(m, "cache_controller",
                "The cache controller (made by cpu_controller or gpu_controller). Streams are integers "
                "(torch.cuda.current_stream().cuda_stream; 0 is the legacy default stream, and the only "
                "value the host executor takes). Blocking calls release the GIL.")
      .def(
          "submit",
          [](P& p, std::uint64_t id, token_ids const& tokens, std::int64_t prompt_tokens, std::int64_t max_new_tokens,
             double arrival_s, std::uintptr_t stream) {
            nb::gil_scoped_release unlocked;
            p.get().submit(cache_request{request_id{id}, tokens.v, prompt_tokens, max_new_tokens, arrival_s}, stream);
          },
          "id"_a, "tokens"_a, "prompt_tokens"_a = 0, "max_new_tokens"_a = 1, "arrival_s"_a = 0.0, "stream"_a = 0)
      .def(
          "schedule", [](P& p, schedule_budget const& b) { return p.get().schedule(b); }, "budget"_a, release_gil())
      .def(
          "schedule",
          [](P& p, std::int64_t tokens, std::int64_t seqs, std::int64_t ctx, std::int64_t left) {
            return p.get().schedule(schedule_budget{tokens, seqs, ctx, left});
          },
          "tokens"_a = 8192, "running_sequences"_a = 0, "running_context_tokens"_a = 0, "running_max_remaining"_a = 0,
          release_gil())
      .def(
          "begin_loads", [](P& p, batch_plan const& plan, std::uintptr_t s) { return p.get().begin_loads(plan, s); },
          "plan"_a, "stream"_a = 0, release_gil())
      .def(
          "wait_layer",
          [](P& p, loads_info const& l, std::int64_t layer, std::uintptr_t s) {
            return p.get().wait_layer(l, layer, s);
          },
          "loads"_a, "layer"_a, "stream"_a = 0, release_gil(),
          "Makes the stream wait for this layer of the loads only; False when they failed.")
      .def(
          "complete", [](P& p, loads_info const& l) { return p.get().complete(l); }, "loads"_a, release_gil())
      .def(
          "poll", [](P& p, std::uintptr_t s) { return p.get().poll(s); }, "stream"_a = 0, release_gil())
      .def(
          "page_table", [](P const& p, std::uint64_t id) { return p.get().page_table({id}); }, "id"_a, release_gil())
      .def(
          "finish_prefill", [](P& p, std::uint64_t id, std::uintptr_t s) { return p.get().finish_prefill({id}, s); },
          "id"_a, "stream"_a = 0, release_gil())
      .def(
          "wait_after", [](P& p, prefill_info const& r, std::uintptr_t s) { return p.get().wait_after(r, s); },
          "result"_a, "stream"_a = 0, release_gil(),
          "Makes the stream wait for the loads still filling pages the finished request's page table points "
          "at (`result.after`); False when one failed: `failed(id)` is then True, release and resubmit.")
      .def(
          "release",
          [](P& p, std::uint64_t id, std::optional<token_ids> const& tokens, std::uintptr_t s) {
            nb::gil_scoped_release unlocked;
            p.get().release({id}, tokens ? std::span<std::int32_t const>{tokens->v} : std::span<std::int32_t const>{},
                            s);
          },
          "id"_a, "cache_tokens"_a = nb::none(), "stream"_a = 0)
      .def(
          "evict", [](P& p, tier t, std::int64_t pages, std::uintptr_t s) { return p.get().evict(t, pages, s); },
          "tier"_a, "pages"_a, "stream"_a = 0, release_gil())
      .def(
          "probe",
          [](P const& p, token_ids const& tokens) {
            nb::gil_scoped_release unlocked;
            return p.get().probe(tokens.v);
          },
          "tokens"_a)
      .def("device_pages_available", [](P const& p) { return p.get().device_pages_available(); })
      .def("waiting", [](P const& p) { return p.get().waiting(); })
      .def(
          "failed", [](P const& p, std::uint64_t id) { return p.get().failed({id}); }, "id"_a)
      .def(
          "prefilled", [](P const& p, std::uint64_t id) { return p.get().prefilled({id}); }, "id"_a,
          "Whether finish_prefill is due: False once a failed load sent the request back to wait.")
      .def("live_requests", [](P const& p) { return p.get().live_requests(); })
      .def("pending_submissions", [](P const& p) { return p.get().pending_submissions(); })
      .def("stats", [](P const& p) { return p.get().stats(); })
      .def("index_stats", [](P const& p) { return p.get().index_stats(); })
      .def("check_invariants", [](P const& p) { p.get().check_invariants(); })
      .def_prop_ro("page_tokens", [](P const& p) { return p.get().page_tokens(); })
      .def_prop_ro("geometry", [](P const& p) { return p.get().geometry(); })
      .def_prop_ro("options", [](P const& p) { return p.get().options(); })
      .def_prop_ro("tiers", [](P const& p) { return p.get().tiers(); })
      .def(
          "capacity", [](P const& p, tier t) { return p.get().capacity(t); }, "tier"_a)
      .def_prop_ro(
          "executor", [](P const& p) { return p.get().executor_name(); }, "'host' or 'gpu'.")
      .def_ro("layout", &P::layout)
      .def_ro("file_store", &P::file)
      .def_ro("remote_store", &P::remote)
      .def(
          "set_activity", [](P& p, int a, double ms) { p.get().set_activity(a, ms); }, "activity"_a,
          "compute_ms"_a = 0.0, "What the GPU does (0 idle, 1 prefill, 2 decode), for the backend choice.")
      .def(
          "synchronize", [](P& p) { p.get().synchronize(); }, release_gil())
      .def("executor_stats", [](P const& p) { return p.get().stats_of_executor(); })
      .def(
          "warm_up", [](P& p) { return p.get().warm_up(); },
          "gpu_executor::warm_up: loads the copy kernels and scales the backend choice's cost tables to rates "
          "measured on this machine (scratch memory, none of the pool's; ~10-30 ms). Call it before the first "
          "transfer. The host executor: nothing to do, zeros.");

  m.def("cpu_controller", &cpu_controller, "layout"_a, "host_pages"_a, "options"_a = nb::none(),
        "file_store"_a = nb::none(), "remote_store"_a = nb::none(), nb::rv_policy::take_ownership,
        "cache_controller<cpu_policies<Layout>> over a CPU pool (layer_first_table or layer_first); with a "
        "file_store, tiers device, host, file; with a redis_store (layer_first_table), a shared remote tier "
        "below them (docs/remote_tier.md).");

#if STRATA_PYTHON_CUDA
  m.def(
      "gpu_controller",
      [](nb::object layout, std::int64_t host_pages, std::optional<controller_options> options, nb::object file,
         std::optional<int> force, bool staged_loads, bool dma_submit_thread, double cpu_weight,
         std::uintptr_t load_stream, std::uintptr_t copy_stream, bool registered_host_memory, nb::object remote,
         int load_ctas) {
        if (!nb::isinstance<lft>(layout)) {
          raise_type("gpu_controller: the engine's pool must be a layer_first_table (sglang_layout, mla_layout), got ",
                     nb::type_name(layout.type()).c_str());
        }
        auto const& l = nb::cast<lft const&>(layout);
        if (l.device_type != dl_cuda) {
          raise_value("gpu_controller: the engine's pool must be CUDA tensors, it is on ", l.device());
        }
        if (load_ctas <= 0) { raise_value("gpu_controller: load_ctas must be positive, got ", load_ctas); }
        file_store* fs = file.is_none() ? nullptr : &nb::cast<file_store&>(file);
        std::unique_ptr<keyed_store_api> face = remote_face(remote, "gpu_controller");
        keyed_store_api* rs = face.get();
        gpu_options g{force,       staged_loads,           dma_submit_thread, cpu_weight, load_stream,
                      copy_stream, registered_host_memory, load_ctas,         l.device_id};
        controller_options const o = options.value_or(controller_options{});
        std::unique_ptr<controller_api> c;
        {
          nb::gil_scoped_release unlocked;
          c = make_gpu_controller(l.value, host_pages, o, g, fs, rs);
        }
        return new py_controller{std::move(layout), std::move(file), std::move(c), std::move(remote), std::move(face)};
      },
      "layout"_a, "host_pages"_a, "options"_a = nb::none(), "file_store"_a = nb::none(), "force"_a = nb::none(),
      "staged_loads"_a = false, "dma_submit_thread"_a = true, "cpu_weight"_a = 1.0, "load_stream"_a = 0,
      "copy_stream"_a = 0, "registered_host_memory"_a = false, "remote_store"_a = nb::none(), "load_ctas"_a = 2,
      nb::rv_policy::take_ownership,
      "cache_controller<gpu_policies<layer_first_table>> over CUDA tensors (with a file_store: device, pinned host, "
      "file; with a redis_store, a shared remote tier below them). force: 0 gpu_assisted, 1 dma_batch, 2 staged. "
      "It works on the tensors' device, whichever is current when it is called; streams must be that device's.");
  m.def("cuda_device_count", &cuda_device_count);
  m.attr("cuda_built") = true;
  bind_gpu_transfer(m);
#else
  m.def("cuda_device_count", []() { return 0; });
  m.attr("cuda_built") = false;
#endif
}

}  // namespace
}  // namespace strata::python

NB_MODULE(_strata, m)
{
  using namespace strata::python;
  m.doc() = "strata: hierarchical KV caching for LLM serving (C++ core, nanobind binding)";
  m.attr("__version__") = text(STRATA_VERSION_MAJOR, ".", STRATA_VERSION_MINOR, ".", STRATA_VERSION_PATCH);
  register_exceptions(m);
  bind_geometry(m);
  bind_vocabulary(m);
  bind_layouts(m);
  bind_transfer(m);
  bind_index(m);
  bind_file_store(m);
  bind_keyed(m);
#if STRATA_PYTHON_REDIS
  bind_remote(m);
  m.attr("redis_built") = true;
#else
  m.attr("redis_built") = false;
#endif
  bind_controller(m);
}
