// SPDX-License-Identifier: Apache-2.0
/**
 * @file geometry.hpp
 * @brief `kv_geometry`: the shape of one model's paged KV cache, and the sizes derived from it.
 *
 * Vocabulary used throughout strata:
 * - a **row** is one token's bytes in one (layer, plane): `kv_heads * head_dim * elem_bytes`;
 * - a **head row** is one (token, head): `head_dim * elem_bytes`, the unit a transpose moves;
 * - a **block** is one (page, layer, plane): `page_tokens` rows;
 * - a **page** is all layers and planes of `page_tokens` tokens: `layers * planes` blocks.
 */
#pragma once

#include <strata/config.hpp>
#include <strata/detail/checked.hpp>
#include <strata/error.hpp>

#include <cstdint>
#include <ostream>

namespace strata {

/**
 * @brief Shape of a paged KV cache: how many layers, tokens per page, heads, and bytes per element.
 *
 * A plain aggregate, usable in device code. Call `validate()` (every layout does) before trusting
 * the derived sizes: it rejects zero or negative fields, products that overflow 64 bits, and blocks
 * that are not a multiple of 16 bytes (the GPU copy kernels move 16-byte vectors).
 */
struct kv_geometry {
  std::int64_t layers{};       ///< transformer layers holding KV
  std::int64_t page_tokens{};  ///< tokens per page (16, 32, 64 in practice)
  std::int64_t kv_heads{};     ///< KV heads on this rank (after tensor-parallel sharding)
  std::int64_t head_dim{};     ///< elements per head (576 for DeepSeek MLA: kv_lora_rank + rope)
  std::int64_t elem_bytes{};   ///< bytes per element (2 for bf16/fp16, 1 for fp8)
  std::int64_t planes{};       ///< 2 for separate K and V, 1 for an MLA latent

  /// @brief Bytes of one (token, head): the unit a head-major ↔ token-major transpose moves.
  [[nodiscard]] STRATA_HOST_DEVICE constexpr std::int64_t head_bytes() const noexcept { return head_dim * elem_bytes; }
  /// @brief Bytes of one token in one (layer, plane).
  [[nodiscard]] STRATA_HOST_DEVICE constexpr std::int64_t row_bytes() const noexcept { return kv_heads * head_bytes(); }
  /// @brief Bytes of one (page, layer, plane) block.
  [[nodiscard]] STRATA_HOST_DEVICE constexpr std::int64_t block_bytes() const noexcept
  { return page_tokens * row_bytes(); }
  /// @brief Bytes of one page: every layer and plane of `page_tokens` tokens.
  [[nodiscard]] STRATA_HOST_DEVICE constexpr std::int64_t page_bytes() const noexcept
  { return layers * planes * block_bytes(); }
  /// @brief KV bytes of one token over all layers and planes (128 KiB for Llama-3.1-8B in bf16).
  [[nodiscard]] STRATA_HOST_DEVICE constexpr std::int64_t token_bytes() const noexcept
  { return layers * planes * row_bytes(); }
  /// @brief Blocks per page: `layers * planes`.
  [[nodiscard]] STRATA_HOST_DEVICE constexpr std::int64_t blocks_per_page() const noexcept { return layers * planes; }

  /**
   * @brief Checks every field and every derived size.
   * @throw strata::invalid_argument naming the field and its value: a field that is zero or
   *        negative, `planes` other than 1 or 2, `elem_bytes` other than 1, 2, 4 or 8, a size
   *        that overflows 64 bits, or a block that is not a multiple of 16 bytes.
   */
  void validate() const
  {
    auto positive = [](std::int64_t v, char const* name) {
      STRATA_EXPECTS(v > 0, "kv_geometry: ", name, " must be positive, got ", v);
    };
    positive(layers, "layers");
    positive(page_tokens, "page_tokens");
    positive(kv_heads, "kv_heads");
    positive(head_dim, "head_dim");
    positive(elem_bytes, "elem_bytes");
    positive(planes, "planes");
    STRATA_EXPECTS(planes == 1 || planes == 2, "kv_geometry: planes must be 1 (MLA latent) or 2 (K and V), got ",
                   planes);
    STRATA_EXPECTS(elem_bytes == 1 || elem_bytes == 2 || elem_bytes == 4 || elem_bytes == 8,
                   "kv_geometry: elem_bytes must be 1 (fp8), 2 (bf16, fp16), 4 (fp32) or 8, got ", elem_bytes);
    auto const head = detail::checked_mul(head_dim, elem_bytes);
    auto const row = head ? detail::checked_mul(*head, kv_heads) : std::nullopt;
    auto const block = row ? detail::checked_mul(*row, page_tokens) : std::nullopt;
    auto const per_layer = block ? detail::checked_mul(*block, planes) : std::nullopt;
    auto const page = per_layer ? detail::checked_mul(*per_layer, layers) : std::nullopt;
    STRATA_EXPECTS(page.has_value(), "kv_geometry: page size overflows 64 bits (layers=", layers,
                   ", page_tokens=", page_tokens, ", kv_heads=", kv_heads, ", head_dim=", head_dim,
                   ", elem_bytes=", elem_bytes, ", planes=", planes, ")");
    STRATA_EXPECTS(*block % 16 == 0, "kv_geometry: block_bytes must be a multiple of 16, got ", *block,
                   " (page_tokens=", page_tokens, " * kv_heads=", kv_heads, " * head_dim=", head_dim,
                   " * elem_bytes=", elem_bytes, ")");
  }

  /// @brief Field-wise equality.
  friend constexpr bool operator==(kv_geometry const&, kv_geometry const&) = default;
};

/// @brief Prints `{layers=32, page_tokens=32, kv_heads=8, head_dim=128, elem_bytes=2, planes=2}`.
inline std::ostream& operator<<(std::ostream& out, kv_geometry const& g)
{
  return out << "{layers=" << g.layers << ", page_tokens=" << g.page_tokens << ", kv_heads=" << g.kv_heads
             << ", head_dim=" << g.head_dim << ", elem_bytes=" << g.elem_bytes << ", planes=" << g.planes << "}";
}

/**
 * @brief The model-side shape of a KV cache, before a page size and element type are chosen.
 */
struct model_shape {
  char const* name{};       ///< human-readable name, for examples and reports
  std::int64_t layers{};    ///< layers holding KV
  std::int64_t kv_heads{};  ///< KV heads of the whole model (before tensor parallelism)
  std::int64_t head_dim{};  ///< elements per head
  std::int64_t planes{};    ///< 2 for K/V, 1 for MLA

  /**
   * @brief The geometry of one tensor-parallel rank's cache.
   * @param page_tokens tokens per page
   * @param elem_bytes bytes per element (2 for bf16)
   * @param tensor_parallel ranks the KV heads are split over; must divide `kv_heads` (an MLA latent,
   *        `planes == 1`, is replicated, not split)
   * @throw strata::invalid_argument for a split that does not divide the heads, or an invalid geometry
   */
  [[nodiscard]] kv_geometry geometry(std::int64_t page_tokens, std::int64_t elem_bytes = 2,
                                     std::int64_t tensor_parallel = 1) const
  {
    STRATA_EXPECTS(tensor_parallel > 0, "model_shape: tensor_parallel must be positive, got ", tensor_parallel);
    std::int64_t heads = kv_heads;
    if (planes == 2) {
      STRATA_EXPECTS(kv_heads % tensor_parallel == 0, "model_shape ", name, ": tensor_parallel=", tensor_parallel,
                     " does not divide kv_heads=", kv_heads);
      heads = kv_heads / tensor_parallel;
    }
    kv_geometry g{layers, page_tokens, heads, head_dim, elem_bytes, planes};
    g.validate();
    return g;
  }
};

/// @brief KV shapes of the models strata's examples, tests and benchmarks use.
namespace models {
/// @brief Llama-3.1-8B: 32 layers, 8 KV heads of 128 (GQA). 128 KiB per token in bf16.
inline constexpr model_shape llama31_8b{"Llama-3.1-8B", 32, 8, 128, 2};
/// @brief Qwen-2.5-14B: 48 layers, 8 KV heads of 128.
inline constexpr model_shape qwen25_14b{"Qwen-2.5-14B", 48, 8, 128, 2};
/// @brief Llama-3.1-70B: 80 layers, 8 KV heads of 128.
inline constexpr model_shape llama31_70b{"Llama-3.1-70B", 80, 8, 128, 2};
/// @brief DeepSeek-V3 MLA: 61 layers, one latent plane of 512 + 64 = 576 elements per token.
inline constexpr model_shape deepseek_v3{"DeepSeek-V3", 61, 1, 576, 1};
}  // namespace models

}  // namespace strata
