// SPDX-License-Identifier: Apache-2.0
// A CUDA consumer of an installed strata: the device headers compile through strata::cuda.
#include <strata/strata.hpp>

static_assert(STRATA_HAS_CUDA == 1, "strata::cuda defines STRATA_HAS_CUDA");

__global__ void block_bytes(strata::kv_geometry g, long long* out) { *out = g.block_bytes(); }

int main() { return 0; }
