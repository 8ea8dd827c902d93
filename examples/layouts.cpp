// SPDX-License-Identifier: Apache-2.0
// Layouts and a host copy for a real model's geometry.
//
// A Llama-3.1-8B cache in 32-token pages is kept page-first on the host (a page is one 4 MiB
// record) and layer-first in the engine (SGLang's per-layer K and V tensors, or Hugging Face's
// head-major tensors). host_copy moves pages between them, transposing where the layouts differ;
// it is the reference the GPU backends are tested against.
#include <strata/strata.hpp>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

int main()
{
  using namespace strata;
  kv_geometry const g = models::llama31_8b.geometry(/*page_tokens=*/32);
  std::printf(
      "%s, 32-token pages, bf16: %lld B per head row, %lld B per token row, %lld KiB per block,\n"
      "  %lld MiB per page (%lld blocks), %lld KiB of KV per token\n",
      models::llama31_8b.name, (long long)g.head_bytes(), (long long)g.row_bytes(), (long long)g.block_bytes() / 1024,
      (long long)g.page_bytes() >> 20, (long long)g.blocks_per_page(), (long long)g.token_bytes() / 1024);

  // Host tier: page-first, 8 pages. Engine: SGLang-style per-layer K and V tensors, 8 pages each.
  std::int64_t const pages = 8;
  std::vector<std::byte> host_mem(pages * g.page_bytes());
  std::vector<std::vector<std::byte>> k(g.layers), v(g.layers);
  std::vector<std::byte*> k_ptr, v_ptr;
  for (std::int64_t l = 0; l < g.layers; ++l) {
    k[l].resize(pages * g.block_bytes());
    v[l].resize(pages * g.block_bytes());
    k_ptr.push_back(k[l].data());
    v_ptr.push_back(v[l].data());
  }
  page_first const host{host_mem.data(), g, pages};
  layer_first_table const engine = sglang_layout(k_ptr, v_ptr, g, pages);

  std::mt19937_64 rng{42};
  for (auto& b : host_mem) {
    b = static_cast<std::byte>(rng());
  }

  // Load host pages 5, 6, 7 into engine pages 0, 1, 2 (a cached prefix of 96 tokens).
  page_pair const load[] = {{5, 0}, {6, 1}, {7, 2}};
  copy_plan const plan{host, engine, std::span<page_pair const>{load}, layer_range::all(g)};
  int runs = 0;
  for_each_run(plan, [&](copy_run const&) { ++runs; });
  host_copy{}.copy(plan);
  std::printf("load of %zu pages (%lld MiB) into %s: %d contiguous runs\n", std::size(load),
              (long long)plan.bytes() >> 20, layer_first_table::name, runs);

  // The same pages into a Hugging Face head-major cache: a transpose of 256-byte head rows.
  std::vector<std::vector<std::byte>> hk(g.layers), hv(g.layers);
  std::vector<std::byte*> hk_ptr, hv_ptr;
  for (std::int64_t l = 0; l < g.layers; ++l) {
    hk[l].resize(g.kv_heads * 4 * g.page_tokens * g.head_bytes());
    hv[l].resize(hk[l].size());
    hk_ptr.push_back(hk[l].data());
    hv_ptr.push_back(hv[l].data());
  }
  hf_layout const hf{hk_ptr, hv_ptr, g, /*batch=*/1, /*seq_capacity=*/4 * g.page_tokens};
  copy_plan const to_hf{host, hf, std::span<page_pair const>{load}, layer_range::all(g)};
  host_copy{}.copy(to_hf);

  // Check one head row: layer 17, V, token 9 of the second loaded page, head 5.
  block_ref const src = host.block(6, 17, 1);
  block_ref const sg = engine.block(1, 17, 1);
  block_ref const hfb = hf.block(1, 17, 1);
  auto row = [&](block_ref b) { return b.data + 9 * b.token_stride + 5 * b.head_stride; };
  bool const same =
      std::memcmp(row(src), row(sg), g.head_bytes()) == 0 && std::memcmp(row(src), row(hfb), g.head_bytes()) == 0;
  std::printf("layer 17, V, token 9, head 5: host %s SGLang %s Hugging Face\n", same ? "==" : "!=", same ? "==" : "!=");

  // Bad input is rejected before any byte moves.
  page_pair const bad[] = {{5, 0}, {6, 0}};
  try {
    host_copy{}.copy(copy_plan{host, engine, std::span<page_pair const>{bad}, layer_range::all(g)});
  } catch (invalid_argument const& e) {
    std::printf("rejected: %s\n", e.what());
  }
  return same ? 0 : 1;
}
