// SPDX-License-Identifier: Apache-2.0
// The "model" of the [gpu] controller tests: kernels that write each page's KV from the content
// function (tests/support/kv_content.hpp) and count the words that differ from it.
#pragma once

#include "../support/kv_content.hpp"

#include <strata/layout/layer_first.hpp>

#include <cstdint>

namespace strata::test {
namespace {

/// Up to 64 (device page, key) pairs per launch, by value.
struct page_jobs {
  int n = 0;
  std::int64_t page[64];
  std::uint64_t key[64];
};

/// The "model": writes every layer and plane of each job's page.
__global__ void write_pages(layer_first l, page_jobs jobs)
{
  kv_geometry const g = l.geometry();
  std::int64_t const words = g.block_bytes() / 8;
  for (int j = blockIdx.x; j < jobs.n; j += gridDim.x) {
    for (std::int64_t layer = 0; layer < g.layers; ++layer) {
      for (std::int64_t k = 0; k < g.planes; ++k) {
        auto* b = reinterpret_cast<std::uint64_t*>(l.block(jobs.page[j], layer, k).data);
        for (std::int64_t w = threadIdx.x; w < words; w += blockDim.x) {
          b[w] = kv_word(jobs.key[j], layer, k, w);
        }
      }
    }
  }
}

/// Counts the words of layer `layer` of each job's page that differ from the content function.
__global__ void check_layer(layer_first l, page_jobs jobs, std::int64_t layer, unsigned long long* bad)
{
  kv_geometry const g = l.geometry();
  std::int64_t const words = g.block_bytes() / 8;
  for (int j = blockIdx.x; j < jobs.n; j += gridDim.x) {
    for (std::int64_t k = 0; k < g.planes; ++k) {
      auto const* b = reinterpret_cast<std::uint64_t const*>(l.block(jobs.page[j], layer, k).data);
      for (std::int64_t w = threadIdx.x; w < words; w += blockDim.x) {
        if (b[w] != kv_word(jobs.key[j], layer, k, w)) { atomicAdd(bad, 1ull); }
      }
    }
  }
}

}  // namespace
}  // namespace strata::test
