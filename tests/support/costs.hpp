// SPDX-License-Identifier: Apache-2.0
// Cost models for the controller tests.
#pragma once

#include <strata/cache/controller.hpp>
#include <strata/presets/h200.hpp>

namespace strata::test {

/// @brief The H200 cost model for `g` with file and remote tiers that read and writes faster than the tiny
///        test models compute, so that the index keeps pages there and plans load file hits (with
///        the default one a page of these models is cheaper to recompute than to write and read:
///        `cost_model::record_breakeven_tokens`, `choose_prefix`) — for tests of the data path,
///        not of that choice.
inline cost_model reading_pays(kv_geometry const& g)
{
  cost_model const c = h200::costs_for(g);
  io_costs io = c.io();
  for (tier t : {tier::file, tier::remote}) {
    io.load_bytes_per_s[std::size_t(t)] = 1e15;
    io.store_bytes_per_s[std::size_t(t)] = 1e15;
    io.load_latency_s[std::size_t(t)] = 0;
  }
  io.load_latency_s[std::size_t(tier::host)] = 0;
  return cost_model{c.compute(), io, c.page_bytes(), c.page_tokens()};
}

}  // namespace strata::test
