// SPDX-License-Identifier: Apache-2.0
/**
 * @file transfer/host_copy.hpp
 * @brief The CPU reference transfer: executes any copy plan with `memcpy` over merged runs.
 */
#pragma once

#include <strata/transfer/copy_plan.hpp>

#include <cstring>

namespace strata {

/**
 * @brief Copies pages between any two layouts on the calling CPU thread, transposing as it goes.
 *
 * Both layouts' memory must be readable/writable by the CPU (host memory, or mapped pinned memory).
 * It defines the semantics every GPU backend is tested against: after `copy(plan)`, for every pair
 * and every layer in range, the destination block holds the source block's head rows; no other byte
 * of the destination changes.
 */
struct host_copy {
  static constexpr char const* name = "host_copy";  ///< for reports

  /**
   * @brief Validates `plan`, then copies it.
   * @throw strata::invalid_argument from `validate`, before any byte moves
   */
  template <kv_layout Src, kv_layout Dst>
  void copy(copy_plan<Src, Dst> const& plan) const
  {
    validate(plan);
    for_each_run(plan, [](copy_run const& r) { std::memcpy(r.dst, r.src, static_cast<std::size_t>(r.bytes)); });
  }
};

}  // namespace strata
