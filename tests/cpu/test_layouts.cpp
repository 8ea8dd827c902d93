// SPDX-License-Identifier: Apache-2.0
#include "../support/catch.hpp"
#include "../support/pools.hpp"

#include <strata/strata.hpp>

#include <limits>
#include <random>
#include <vector>

using namespace strata;
using strata::test::layout_kind;

namespace {
std::byte* at(std::vector<std::byte>& v, std::int64_t off) { return v.data() + off; }
}  // namespace

TEST_CASE("layer_first and page_first address blocks by their stride order", "[cpu][layout]")
{
  kv_geometry const g{3, 4, 2, 8, 2, 2};  // block 128 bytes
  std::int64_t const n = 5;
  std::vector<std::byte> mem(static_cast<std::size_t>(n * g.page_bytes()));
  layer_first const lf{mem.data(), g, n};
  page_first const pf{mem.data(), g, n};
  for (std::int64_t p = 0; p < n; ++p) {
    for (std::int64_t l = 0; l < g.layers; ++l) {
      for (std::int64_t k = 0; k < g.planes; ++k) {
        CHECK(lf.block(p, l, k).data == at(mem, ((l * 2 + k) * n + p) * 128));
        CHECK(pf.block(p, l, k).data == at(mem, p * g.page_bytes() + (l * 2 + k) * 128));
        CHECK(lf.block(p, l, k).contiguous(g));
        CHECK(pf.block(p, l, k).contiguous(g));
      }
    }
    CHECK(pf.page_data(p) == at(mem, p * g.page_bytes()));
  }
  CHECK(lf.pool_bytes() == static_cast<std::int64_t>(mem.size()));
  CHECK(pf.pool_bytes() == static_cast<std::int64_t>(mem.size()));
}

TEST_CASE("page_first_chunked addresses records chunk by chunk", "[cpu][layout]")
{
  kv_geometry const g{2, 4, 2, 8, 2, 2};
  std::vector<std::byte> a(3 * g.page_bytes()), b(3 * g.page_bytes());
  std::byte* chunks[] = {b.data(), a.data()};  // not in address order
  page_first_chunked const l{chunks, g, 3, 5};
  CHECK(l.num_pages() == 5);
  CHECK(l.page_data(0) == b.data());
  CHECK(l.page_data(2) == b.data() + 2 * g.page_bytes());
  CHECK(l.page_data(3) == a.data());
  CHECK(l.block(4, 1, 1).data == a.data() + g.page_bytes() + 3 * g.block_bytes());

  STRATA_REQUIRE_THROWS(invalid_argument, "7 pages do not fill 2 chunks of 3 pages",
                        page_first_chunked(chunks, g, 3, 7));
  STRATA_REQUIRE_THROWS(invalid_argument, "3 pages do not fill 2 chunks of 3 pages",
                        page_first_chunked(chunks, g, 3, 3));
  STRATA_REQUIRE_THROWS(invalid_argument, "pages_per_chunk must be positive", page_first_chunked(chunks, g, 0, 1));
  STRATA_REQUIRE_THROWS(invalid_argument, "pointer table is empty",
                        page_first_chunked(std::span<std::byte* const>{}, g, 3, 1));
}

TEST_CASE("engine layouts address blocks as the engines store them", "[cpu][layout]")
{
  kv_geometry const g{2, 4, 2, 8, 2, 2};  // head row 16 B, token row 32 B, block 128 B
  std::int64_t const n = 6;

  SECTION("SGLang: per-layer [tokens, heads, dim] K and V tensors")
  {
    std::vector<std::byte> k0(768), k1(768), v0(768), v1(768);
    std::byte* ks[] = {k0.data(), k1.data()};
    std::byte* vs[] = {v0.data(), v1.data()};
    auto const l = sglang_layout(ks, vs, g, n);
    // token t of page p is token p * page_tokens + t of the tensor
    CHECK(l.block(3, 1, 0).data == k1.data() + 3 * 4 * 32);
    CHECK(l.block(3, 0, 1).data == v0.data() + 3 * 4 * 32);
    CHECK(l.block(5, 1, 1).token_stride == 32);
    CHECK(l.tensor_bytes() == 768);
  }
  SECTION("vLLM: per-layer [2, blocks, block_tokens, heads, dim] tensors")
  {
    std::vector<std::byte> t0(2 * 768), t1(2 * 768);
    std::byte* ts[] = {t0.data(), t1.data()};
    vllm_layout const l{ts, g, n};
    CHECK(l.block(2, 0, 0).data == t0.data() + 2 * 128);
    CHECK(l.block(2, 1, 1).data == t1.data() + (n + 2) * 128);
    CHECK(l.tensor_bytes() == 2 * 768);
  }
  SECTION("Hugging Face: per-layer [batch, heads, capacity, dim], head-major")
  {
    std::int64_t const batch = 2, capacity = 12;  // 3 pages per sequence
    std::int64_t const tensor = batch * g.kv_heads * capacity * g.head_bytes();
    std::vector<std::byte> k0(tensor), k1(tensor), v0(tensor), v1(tensor);
    std::byte* ks[] = {k0.data(), k1.data()};
    std::byte* vs[] = {v0.data(), v1.data()};
    hf_layout const l{ks, vs, g, batch, capacity};
    CHECK(l.num_pages() == 6);
    CHECK(l.pages_per_sequence() == 3);
    block_ref const b = l.block(4, 1, 1);  // sequence 1, tokens 4..7
    CHECK(b.data == v1.data() + (1 * g.kv_heads * capacity + 4) * g.head_bytes());
    CHECK(b.token_stride == g.head_bytes());
    CHECK(b.head_stride == capacity * g.head_bytes());
    CHECK_FALSE(b.contiguous(g));
    CHECK(l.tensor_bytes() == tensor);
  }
  SECTION("MLA: one plane per layer")
  {
    kv_geometry const m{3, 4, 1, 576, 2, 1};
    std::vector<std::byte> a(n * m.block_bytes()), b(n * m.block_bytes()), c(n * m.block_bytes());
    std::byte* ts[] = {a.data(), b.data(), c.data()};
    auto const l = mla_layout(ts, m, n);
    CHECK(l.block(1, 2, 0).data == c.data() + m.block_bytes());
  }
}

TEST_CASE("every layout maps head rows one-to-one onto its memory", "[cpu][layout]")
{
  std::mt19937_64 rng{20261129};
  for (int trial = 0; trial < 60; ++trial) {
    kv_geometry const g = test::random_geometry(rng);
    std::int64_t const pages = std::uniform_int_distribution<std::int64_t>{1, 9}(rng);
    for (layout_kind const kind : test::all_layout_kinds) {
      if (!test::supports(kind, g)) { continue; }
      test::with_pool(kind, g, pages, rng, [&](auto& pool) {
        INFO("layout " << test::to_string(kind) << " geometry " << g << " pages " << pool.layout.num_pages());
        std::vector<int> hits(pool.storage.size());
        std::int64_t covered = 0;
        bool inside = true;
        for (std::int64_t p = 0; p < pool.layout.num_pages(); ++p) {
          for (std::int64_t l = 0; l < g.layers; ++l) {
            for (std::int64_t k = 0; k < g.planes; ++k) {
              block_ref const b = pool.layout.block(p, l, k);
              for (std::int64_t t = 0; t < g.page_tokens; ++t) {
                for (std::int64_t h = 0; h < g.kv_heads; ++h) {
                  std::int64_t const off = b.data + t * b.token_stride + h * b.head_stride - pool.storage.data();
                  inside = inside && off >= 0 && off + g.head_bytes() <= static_cast<std::int64_t>(hits.size());
                  if (!inside) { continue; }
                  for (std::int64_t i = 0; i < g.head_bytes(); ++i) {
                    ++hits[static_cast<std::size_t>(off + i)];
                  }
                  covered += g.head_bytes();
                }
              }
            }
          }
        }
        REQUIRE(inside);
        CHECK(covered == pool.layout.num_pages() * g.page_bytes());
        CHECK(std::all_of(hits.begin(), hits.end(), [](int h) { return h <= 1; }));
      });
    }
  }
}

TEST_CASE("layouts reject bad construction arguments", "[cpu][layout]")
{
  kv_geometry const g{2, 4, 2, 8, 2, 2};
  std::vector<std::byte> mem(4096);
  std::byte* p = mem.data();
  std::byte* two[] = {p, p};
  std::byte* four[] = {p, p, p, p};
  std::byte* with_null[] = {p, nullptr, p, p};

  STRATA_REQUIRE_THROWS(invalid_argument, "layer_first: base pointer is null", layer_first(nullptr, g, 4));
  STRATA_REQUIRE_THROWS(invalid_argument, "page_first: base pointer is null", page_first(nullptr, g, 4));
  STRATA_REQUIRE_THROWS(invalid_argument, "num_pages must be positive, got 0", layer_first(p, g, 0));
  STRATA_REQUIRE_THROWS(invalid_argument, "num_pages must be positive, got -3", page_first(p, g, -3));
  STRATA_REQUIRE_THROWS(invalid_argument, "size overflows 64 bits",
                        page_first(p, g, std::numeric_limits<std::int64_t>::max() / 8));
  STRATA_REQUIRE_THROWS(invalid_argument, "layers must be positive", layer_first(p, kv_geometry{0, 4, 2, 8, 2, 2}, 4));

  STRATA_REQUIRE_THROWS(invalid_argument, "table has 2 entries, expected layers * planes = 4",
                        layer_first_table(two, g, 4));
  STRATA_REQUIRE_THROWS(invalid_argument, "table entry 1 is a null pointer", layer_first_table(with_null, g, 4));
  STRATA_REQUIRE_THROWS(invalid_argument, "num_pages must be positive", layer_first_table(four, g, 0));
  std::vector<std::byte*> too_many(max_layer_tables + 2, p);
  STRATA_REQUIRE_THROWS(invalid_argument, "exceed the capacity of 512",
                        layer_first_table(too_many, kv_geometry{max_layer_tables / 2 + 1, 4, 2, 8, 2, 2}, 4));

  STRATA_REQUIRE_THROWS(invalid_argument, "expected 2 K and V pointers, got 2 and 1",
                        sglang_layout(two, std::span<std::byte* const>(two, 1), g, 4));
  STRATA_REQUIRE_THROWS(invalid_argument, "sglang_layout: planes must be 2",
                        sglang_layout(two, two, kv_geometry{2, 4, 2, 8, 2, 1}, 4));
  STRATA_REQUIRE_THROWS(invalid_argument, "mla_layout: an MLA latent has planes=1 and kv_heads=1",
                        mla_layout(four, g, 4));

  STRATA_REQUIRE_THROWS(invalid_argument, "vllm: expected 2 layer pointers, got 4", vllm_layout(four, g, 4));
  STRATA_REQUIRE_THROWS(invalid_argument, "num_blocks must be positive", vllm_layout(two, g, 0));

  STRATA_REQUIRE_THROWS(invalid_argument, "seq_capacity 10 must be a positive multiple of page_tokens 4",
                        hf_layout(two, two, g, 1, 10));
  STRATA_REQUIRE_THROWS(invalid_argument, "batch must be positive", hf_layout(two, two, g, 0, 8));
  STRATA_REQUIRE_THROWS(invalid_argument, "expected 2 V pointers, got 4", hf_layout(two, four, g, 1, 8));
  STRATA_REQUIRE_THROWS(invalid_argument, "head_dim * elem_bytes must be a multiple of 16, got 8",
                        hf_layout(two, two, kv_geometry{2, 4, 2, 4, 2, 2}, 1, 8));
}
