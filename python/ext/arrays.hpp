// SPDX-License-Identifier: Apache-2.0
/**
 * @file python/ext/arrays.hpp
 * @brief Arrays from Python (DLPack: NumPy, PyTorch, CuPy) checked before strata sees a pointer, the
 *        layouts that keep them alive, and the integer-list casters (token ids, page pairs).
 */
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/vector.h>

#include "text.hpp"

#include <strata/layout/engine.hpp>
#include <strata/layout/layer_first.hpp>
#include <strata/layout/page_first.hpp>
#include <strata/transfer/copy_plan.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace strata::python {

namespace nb = nanobind;

/// @brief DLPack device types strata distinguishes.
enum device_kind : int { dl_cpu = 1, dl_cuda = 2, dl_cuda_host = 3, dl_cuda_managed = 13 };

/// @brief Whether the CPU may read and write memory of this DLPack device type.
inline bool cpu_accessible(int device_type) noexcept
{ return device_type == dl_cpu || device_type == dl_cuda_host || device_type == dl_cuda_managed; }

inline std::string device_name(int type, int id)
{
  switch (type) {
    case dl_cpu:
      return "cpu";
    case dl_cuda:
      return "cuda:" + std::to_string(id);
    case dl_cuda_host:
      return "cuda_host";
    case dl_cuda_managed:
      return "cuda_managed:" + std::to_string(id);
    default:
      return "dlpack device " + std::to_string(type);
  }
}

template <class... Args>
[[noreturn]] void raise_value(Args const&... args)
{ throw nb::value_error(text(args...).c_str()); }
template <class... Args>
[[noreturn]] void raise_type(Args const&... args)
{ throw nb::type_error(text(args...).c_str()); }

inline std::string shape_of(nb::ndarray<> const& a)
{
  std::ostringstream s;
  s << "(";
  for (std::size_t i = 0; i < a.ndim(); ++i) {
    s << (i ? ", " : "") << a.shape(i);
  }
  s << (a.ndim() == 1 ? ",)" : ")");
  return s.str();
}

/// @brief Where an array's memory is, once checked.
struct array_place {
  std::byte* data = nullptr;
  int device_type = dl_cpu;
  int device_id = 0;
  std::uint8_t dtype_code = 0;
  std::uint8_t dtype_bits = 0;
  std::size_t bytes = 0;
};

/**
 * @brief Checks one array for a layout: elements of `g.elem_bytes` bytes, a device strata knows,
 *        C-contiguous, last dimension `head_dim`, `shape` when given (-1: any extent), and `bytes`
 *        bytes in all (-1: not checked here).
 * @throw TypeError for the element type or the memory order; ValueError for the device, the shape
 *        or the size
 */
inline array_place check_array(nb::ndarray<> const& a, std::string const& what, kv_geometry const& g,
                               std::vector<std::int64_t> const& shape, std::int64_t bytes)
{
  if (!a.is_valid()) { raise_type(what, ": expected an array"); }
  auto const dt = a.dtype();
  if (dt.lanes != 1 || dt.bits % 8 != 0 || std::int64_t(dt.bits / 8) != g.elem_bytes) {
    raise_type(what, ": elements of ", int(dt.bits), " bits (", int(dt.lanes),
               " lanes), the geometry has elem_bytes=", g.elem_bytes);
  }
  int const dev = a.device_type();
  if (dev != dl_cpu && dev != dl_cuda && dev != dl_cuda_host && dev != dl_cuda_managed) {
    raise_value(what, ": arrays on ", device_name(dev, a.device_id()), " are not supported (cpu or cuda)");
  }
  if (a.ndim() == 0) { raise_value(what, ": expected an array of at least one dimension, got a scalar"); }
  // C order, in elements; extents of 1 may carry any stride.
  std::int64_t expect = 1;
  for (std::size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expect) {
      raise_type(what, ": the array must be C-contiguous (shape ", shape_of(a), ", stride ", a.stride(i),
                 " in dimension ", i, " where ", expect, " is needed); pass .contiguous() / np.ascontiguousarray");
    }
    expect *= std::int64_t(a.shape(i));
  }
  if (std::int64_t(a.shape(a.ndim() - 1)) != g.head_dim) {
    raise_value(what, ": the last dimension must be head_dim=", g.head_dim, ", got shape ", shape_of(a));
  }
  if (!shape.empty()) {
    bool ok = shape.size() == a.ndim();
    for (std::size_t i = 0; ok && i < shape.size(); ++i) {
      ok = shape[i] < 0 || std::int64_t(a.shape(i)) == shape[i];
    }
    if (!ok) {
      std::ostringstream s;
      s << "(";
      for (std::size_t i = 0; i < shape.size(); ++i) {
        s << (i ? ", " : "");
        if (shape[i] < 0) {
          s << "*";
        } else {
          s << shape[i];
        }
      }
      s << ")";
      raise_value(what, ": expected shape ", s.str(), ", got ", shape_of(a));
    }
  }
  if (bytes >= 0 && std::int64_t(a.nbytes()) != bytes) {
    raise_value(what, ": ", a.nbytes(), " bytes (shape ", shape_of(a), "), expected ", bytes);
  }
  auto* const p = static_cast<std::byte*>(a.data_handle()) + a.byte_offset();
  if (p == nullptr) { raise_value(what, ": the array has no data"); }
  return {p, dev, a.device_id(), dt.code, dt.bits, a.nbytes()};
}

/**
 * @brief An array argument: anything with DLPack or the buffer protocol, writable (layouts are
 *        copied into). @throw TypeError for anything else, ValueError for a read-only array
 */
inline nb::ndarray<> to_array(nb::handle h, std::string const& what)
{
  nb::ndarray<> a;
  if (nb::try_cast(h, a, false)) { return a; }
  nb::ndarray<nb::ro> r;
  if (nb::try_cast(h, r, false)) {
    raise_value(what, ": the array is read-only (a layout's memory is written by copies)");
  }
  raise_type(what, ": expected an array (NumPy, PyTorch, CuPy: DLPack or the buffer protocol), got ",
             nb::type_name(h.type()).c_str());
}

/// @brief A sequence of array arguments.
inline std::vector<nb::ndarray<>> to_arrays(nb::handle seq, std::string const& what)
{
  if (!PySequence_Check(seq.ptr()) || PyUnicode_Check(seq.ptr())) {
    raise_type(what, ": expected a sequence of arrays, got ", nb::type_name(seq.type()).c_str());
  }
  std::vector<nb::ndarray<>> out;
  std::size_t i = 0;
  for (nb::handle item : nb::borrow<nb::sequence>(seq)) {
    out.push_back(to_array(item, text(what, " array ", i++)));
  }
  if (out.empty()) { raise_value(what, ": no arrays"); }
  return out;
}

/// @brief Pages an array of `bytes` bytes holds at `per_page` bytes a page (`given` wins when set).
inline std::int64_t pages_of(std::string const& what, std::size_t bytes, std::int64_t per_page,
                             std::optional<std::int64_t> given)
{
  if (given) {
    if (*given <= 0) { raise_value(what, ": num_pages must be positive, got ", *given); }
    return *given;
  }
  if (per_page <= 0 || bytes == 0 || std::int64_t(bytes) % per_page != 0) {
    raise_value(what, ": ", bytes, " bytes are not a whole number of pages of ", per_page, " bytes");
  }
  return std::int64_t(bytes) / per_page;
}

/**
 * @brief A layout over Python arrays: the value strata copies with, and the arrays, held so that
 *        their memory lives as long as the layout does.
 */
template <class L>
struct py_layout {
  L value;
  std::vector<nb::ndarray<>> arrays;
  int device_type = dl_cpu;
  int device_id = 0;

  [[nodiscard]] bool cpu() const noexcept { return cpu_accessible(device_type); }
  [[nodiscard]] std::string device() const { return device_name(device_type, device_id); }
};

/// @brief All arrays of one layout on one device with one element type.
inline void check_same(std::vector<array_place> const& places, std::string const& what)
{
  for (std::size_t i = 1; i < places.size(); ++i) {
    if (places[i].device_type != places[0].device_type || places[i].device_id != places[0].device_id) {
      raise_value(what, ": array ", i, " is on ", device_name(places[i].device_type, places[i].device_id),
                  ", array 0 on ", device_name(places[0].device_type, places[0].device_id));
    }
    if (places[i].dtype_code != places[0].dtype_code || places[i].dtype_bits != places[0].dtype_bits) {
      raise_type(what, ": array ", i, " has another element type than array 0");
    }
  }
  // Two arrays over the same memory (K passed as V, views of one tensor) would overwrite each other.
  std::vector<std::size_t> order(places.size());
  for (std::size_t i = 0; i < order.size(); ++i) {
    order[i] = i;
  }
  auto const at = [&](std::size_t i) { return reinterpret_cast<std::uintptr_t>(places[i].data); };
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return at(a) < at(b); });
  for (std::size_t k = 1; k < order.size(); ++k) {
    if (at(order[k]) < at(order[k - 1]) + places[order[k - 1]].bytes) {
      raise_value(what, ": arrays ", std::min(order[k - 1], order[k]), " and ", std::max(order[k - 1], order[k]),
                  " share memory (the same tensor, or views of one): each must have its own");
    }
  }
}

/// @brief Token ids from a Python sequence of ints or a 1-D integer array (NumPy, a CPU tensor).
struct token_ids {
  std::vector<std::int32_t> v;
};

/// @brief (source, destination) page pairs from a sequence of pairs or an `[n, 2]` integer array.
struct page_pairs {
  std::vector<page_pair> v;
};

namespace impl {

/// Reads element i of a 1-D or 2-D integer array as int64 (false: not an integer type).
template <class Array>
bool read_int(Array const& a, std::int64_t offset_elems, std::int64_t& out) noexcept
{
  auto const* p = static_cast<std::byte const*>(a.data_handle()) + a.byte_offset();
  auto const dt = a.dtype();
  std::int64_t const bytes = dt.bits / 8;
  p += offset_elems * bytes;
  auto const code = dt.code;
  if (code == std::uint8_t(nb::dlpack::dtype_code::Int)) {
    switch (dt.bits) {
      case 8:
        out = *reinterpret_cast<std::int8_t const*>(p);
        return true;
      case 16:
        out = *reinterpret_cast<std::int16_t const*>(p);
        return true;
      case 32:
        out = *reinterpret_cast<std::int32_t const*>(p);
        return true;
      case 64:
        out = *reinterpret_cast<std::int64_t const*>(p);
        return true;
      default:
        return false;
    }
  }
  if (code == std::uint8_t(nb::dlpack::dtype_code::UInt)) {
    switch (dt.bits) {
      case 8:
        out = *reinterpret_cast<std::uint8_t const*>(p);
        return true;
      case 16:
        out = *reinterpret_cast<std::uint16_t const*>(p);
        return true;
      case 32:
        out = *reinterpret_cast<std::uint32_t const*>(p);
        return true;
      case 64: {
        auto const u = *reinterpret_cast<std::uint64_t const*>(p);
        if (u > std::uint64_t(std::numeric_limits<std::int64_t>::max())) { return false; }
        out = std::int64_t(u);
        return true;
      }
      default:
        return false;
    }
  }
  return false;
}

}  // namespace impl
}  // namespace strata::python

namespace nanobind::detail {

template <>
struct type_caster<strata::python::token_ids> {
  NB_TYPE_CASTER(strata::python::token_ids,
                 io_name("collections.abc.Sequence[int] | numpy.typing.NDArray[numpy.integer]", "list[int]"))

  bool from_python(handle src, uint32_t flags, cleanup_list* cleanup) noexcept
  {
    if (PyUnicode_Check(src.ptr()) || PyBytes_Check(src.ptr())) { return false; }
    value.v.clear();
    if (!PyList_Check(src.ptr()) && !PyTuple_Check(src.ptr())) {
      make_caster<ndarray<ro, ndim<1>, device::cpu>> array;
      if (array.from_python(src, flags & ~uint32_t(cast_flags::convert), cleanup)) {
        auto const& a = array.value;
        value.v.resize(a.shape(0));
        for (std::size_t i = 0; i < a.shape(0); ++i) {
          std::int64_t t = 0;
          if (!strata::python::impl::read_int(a, std::int64_t(i) * a.stride(0), t) ||
              t < std::numeric_limits<std::int32_t>::min() || t > std::numeric_limits<std::int32_t>::max()) {
            return false;
          }
          value.v[i] = std::int32_t(t);
        }
        return true;
      }
    }
    make_caster<std::vector<std::int64_t>> list;
    if (!list.from_python(src, flags, cleanup)) { return false; }
    auto const& l = list.value;
    value.v.resize(l.size());
    for (std::size_t i = 0; i < l.size(); ++i) {
      if (l[i] < std::numeric_limits<std::int32_t>::min() || l[i] > std::numeric_limits<std::int32_t>::max()) {
        return false;
      }
      value.v[i] = std::int32_t(l[i]);
    }
    return true;
  }
  static handle from_cpp(strata::python::token_ids const& t, rv_policy p, cleanup_list* c) noexcept
  { return make_caster<std::vector<std::int32_t>>::from_cpp(t.v, p, c); }
};

template <>
struct type_caster<strata::python::page_pairs> {
  NB_TYPE_CASTER(strata::python::page_pairs,
                 io_name("collections.abc.Sequence[tuple[int, int]] | numpy.typing.NDArray[numpy.integer]",
                         "list[tuple[int, int]]"))

  bool from_python(handle src, uint32_t flags, cleanup_list* cleanup) noexcept
  {
    value.v.clear();
    if (!PyList_Check(src.ptr()) && !PyTuple_Check(src.ptr())) {
      make_caster<ndarray<ro, shape<-1, 2>, device::cpu>> array;
      if (array.from_python(src, flags & ~uint32_t(cast_flags::convert), cleanup)) {
        auto const& a = array.value;
        value.v.resize(a.shape(0));
        for (std::size_t i = 0; i < a.shape(0); ++i) {
          std::int64_t s = 0, d = 0;
          if (!strata::python::impl::read_int(a, std::int64_t(i) * a.stride(0), s) ||
              !strata::python::impl::read_int(a, std::int64_t(i) * a.stride(0) + a.stride(1), d)) {
            return false;
          }
          value.v[i] = {s, d};
        }
        return true;
      }
    }
    make_caster<std::vector<std::pair<std::int64_t, std::int64_t>>> list;
    if (!list.from_python(src, flags, cleanup)) { return false; }
    for (auto const& [s, d] : list.value) {
      value.v.push_back({s, d});
    }
    return true;
  }
  static handle from_cpp(strata::python::page_pairs const& t, rv_policy p, cleanup_list* c) noexcept
  {
    std::vector<std::pair<std::int64_t, std::int64_t>> out;
    for (auto const& x : t.v) {
      out.emplace_back(x.src, x.dst);
    }
    return make_caster<decltype(out)>::from_cpp(out, p, c);
  }
};

}  // namespace nanobind::detail
