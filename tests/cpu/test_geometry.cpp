// SPDX-License-Identifier: Apache-2.0
#include "../support/catch.hpp"

#include <strata/geometry.hpp>

#include <cstdint>
#include <limits>

using strata::kv_geometry;

TEST_CASE("derived sizes of real models", "[cpu][geometry]")
{
  kv_geometry const llama = strata::models::llama31_8b.geometry(32);
  CHECK(llama.head_bytes() == 256);
  CHECK(llama.row_bytes() == 2048);
  CHECK(llama.block_bytes() == 64 * 1024);
  CHECK(llama.token_bytes() == 128 * 1024);  // DESIGN.md: 128 KiB per token
  CHECK(llama.page_bytes() == 32 * 2 * 64 * 1024);
  CHECK(llama.blocks_per_page() == 64);

  kv_geometry const tp8 = strata::models::llama31_8b.geometry(32, 2, 8);
  CHECK(tp8.kv_heads == 1);
  CHECK(tp8.block_bytes() == 8 * 1024);  // the 8 KiB blocks of the TP8 shard

  kv_geometry const mla = strata::models::deepseek_v3.geometry(64);
  CHECK(mla.planes == 1);
  CHECK(mla.row_bytes() == 1152);
  CHECK(mla.page_bytes() == 61 * 64 * 1152);
  // An MLA latent is replicated across tensor-parallel ranks, not split.
  CHECK(strata::models::deepseek_v3.geometry(64, 2, 8) == mla);

  CHECK(strata::models::qwen25_14b.geometry(16).layers == 48);
  CHECK(strata::models::llama31_70b.geometry(16).token_bytes() == 80 * 2 * 8 * 128 * 2);
}

TEST_CASE("geometry validation names the field and value", "[cpu][geometry]")
{
  kv_geometry const ok{32, 32, 8, 128, 2, 2};
  REQUIRE_NOTHROW(ok.validate());

  auto with = [&](auto member, std::int64_t v) {
    kv_geometry g = ok;
    g.*member = v;
    return g;
  };
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "layers must be positive, got 0",
                        with(&kv_geometry::layers, 0).validate());
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "page_tokens must be positive, got -16",
                        with(&kv_geometry::page_tokens, -16).validate());
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "kv_heads must be positive, got 0",
                        with(&kv_geometry::kv_heads, 0).validate());
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "head_dim must be positive, got -1",
                        with(&kv_geometry::head_dim, -1).validate());
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "elem_bytes must be positive, got 0",
                        with(&kv_geometry::elem_bytes, 0).validate());
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "planes must be positive, got 0",
                        with(&kv_geometry::planes, 0).validate());
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "planes must be 1 (MLA latent) or 2 (K and V), got 3",
                        with(&kv_geometry::planes, 3).validate());
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "elem_bytes must be 1 (fp8), 2 (bf16, fp16), 4 (fp32) or 8, got 3",
                        with(&kv_geometry::elem_bytes, 3).validate());
  for (std::int64_t const e : {1, 2, 4, 8}) {
    REQUIRE_NOTHROW(with(&kv_geometry::elem_bytes, e).validate());
  }
}

TEST_CASE("geometry validation rejects 64-bit overflow", "[cpu][geometry]")
{
  std::int64_t const big = std::numeric_limits<std::int64_t>::max() / 2;
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "overflows 64 bits", kv_geometry{2, 16, big, 128, 2, 2}.validate());
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "overflows 64 bits",
                        kv_geometry{std::int64_t{1} << 40, 1 << 12, 8, 128, 2, 2}.validate());
  // The largest products that still fit pass.
  REQUIRE_NOTHROW(kv_geometry{std::int64_t{1} << 20, 1 << 12, 8, 128, 2, 2}.validate());
}

TEST_CASE("geometry validation rejects blocks that are not a multiple of 16 bytes", "[cpu][geometry]")
{
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "block_bytes must be a multiple of 16, got 24",
                        kv_geometry({1, 1, 3, 4, 2, 2}).validate());
  REQUIRE_NOTHROW(kv_geometry{1, 2, 3, 4, 2, 2}.validate());  // 48 bytes
}

TEST_CASE("model_shape rejects a tensor-parallel split that does not divide the heads", "[cpu][geometry]")
{
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "tensor_parallel=3 does not divide kv_heads=8",
                        (void)strata::models::llama31_8b.geometry(32, 2, 3));
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "tensor_parallel must be positive",
                        (void)strata::models::llama31_8b.geometry(32, 2, 0));
  STRATA_REQUIRE_THROWS(strata::invalid_argument, "page_tokens must be positive",
                        (void)strata::models::llama31_8b.geometry(0));
}
