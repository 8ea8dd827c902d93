// SPDX-License-Identifier: Apache-2.0
/**
 * @file layout/engine.hpp
 * @brief The KV pools of real engines: SGLang (MHA and MLA), vLLM, Hugging Face transformers.
 *
 * Each is a `kv_layout` built from the engine's own tensors' data pointers, so strata moves pages
 * straight into and out of memory the engine owns.
 */
#pragma once

#include <strata/layout/layer_first.hpp>

#include <vector>

namespace strata {

/**
 * @brief SGLang's MHA pool: per layer one `[tokens, kv_heads, head_dim]` K tensor and one V tensor.
 * @param k_buffers `layers` K base pointers (`k_buffer[layer].data_ptr()`)
 * @param v_buffers `layers` V base pointers
 * @param geometry shape of the cache; `planes` must be 2
 * @param num_pages pages each tensor holds (`tokens / page_tokens`)
 * @throw strata::invalid_argument for mismatched list lengths, `planes != 2`, or what
 *        `layer_first_table` rejects
 */
inline layer_first_table sglang_layout(std::span<std::byte* const> k_buffers, std::span<std::byte* const> v_buffers,
                                       kv_geometry const& geometry, std::int64_t num_pages)
{
  STRATA_EXPECTS(geometry.planes == 2, "sglang_layout: planes must be 2 (K and V), got ", geometry.planes);
  STRATA_EXPECTS(k_buffers.size() == v_buffers.size() && static_cast<std::int64_t>(k_buffers.size()) == geometry.layers,
                 "sglang_layout: expected ", geometry.layers, " K and V pointers, got ", k_buffers.size(), " and ",
                 v_buffers.size());
  std::vector<std::byte*> table;
  table.reserve(2 * k_buffers.size());
  for (std::size_t l = 0; l < k_buffers.size(); ++l) {
    table.push_back(k_buffers[l]);
    table.push_back(v_buffers[l]);
  }
  return layer_first_table{table, geometry, num_pages};
}

/**
 * @brief An MLA pool (SGLang, DeepSeek): per layer one `[tokens, 1, kv_lora_rank + rope_dim]` tensor.
 * @param layer_buffers `layers` base pointers
 * @param geometry shape of the cache; `planes` must be 1 and `kv_heads` 1
 * @param num_pages pages each tensor holds
 * @throw strata::invalid_argument for a geometry that is not MLA-shaped, or what `layer_first_table` rejects
 */
inline layer_first_table mla_layout(std::span<std::byte* const> layer_buffers, kv_geometry const& geometry,
                                    std::int64_t num_pages)
{
  STRATA_EXPECTS(geometry.planes == 1 && geometry.kv_heads == 1,
                 "mla_layout: an MLA latent has planes=1 and kv_heads=1, got planes=", geometry.planes,
                 " kv_heads=", geometry.kv_heads);
  return layer_first_table{layer_buffers, geometry, num_pages};
}

/**
 * @brief vLLM's pool: per layer one `[planes, num_blocks, block_tokens, kv_heads, head_dim]` tensor
 *        (K at plane 0, V at plane 1; a vLLM block is a strata page).
 */
class vllm_layout {
 public:
  static constexpr layout_order order = layout_order::layer_major;  ///< memory order
  static constexpr char const* name = "vllm";                       ///< for reports

  /**
   * @param layer_buffers `layers` base pointers (`kv_caches[layer].data_ptr()`)
   * @param geometry shape of the cache (`page_tokens` is vLLM's `block_size`)
   * @param num_blocks blocks each tensor holds
   * @throw strata::invalid_argument for a table of the wrong length or with a null entry, an invalid
   *        geometry, a non-positive block count, or a tensor size that overflows 64 bits
   */
  vllm_layout(std::span<std::byte* const> layer_buffers, kv_geometry const& geometry, std::int64_t num_blocks)
      : geometry_{geometry}, num_pages_{num_blocks}
  {
    geometry.validate();
    STRATA_EXPECTS(static_cast<std::int64_t>(layer_buffers.size()) == geometry.layers, name, ": expected ",
                   geometry.layers, " layer pointers, got ", layer_buffers.size());
    table_ = detail::pointer_table::from(layer_buffers, name);
    STRATA_EXPECTS(num_blocks > 0, name, ": num_blocks must be positive, got ", num_blocks);
    (void)detail::checked_extent(detail::checked_extent(num_blocks, geometry.planes, name), geometry.block_bytes(),
                                 name);
  }

  /// @brief Shape of the cache.
  [[nodiscard]] STRATA_HOST_DEVICE kv_geometry const& geometry() const noexcept { return geometry_; }
  /// @brief Blocks (pages) in each layer's tensor.
  [[nodiscard]] STRATA_HOST_DEVICE std::int64_t num_pages() const noexcept { return num_pages_; }
  /// @brief Bytes each layer's tensor spans.
  [[nodiscard]] std::int64_t tensor_bytes() const noexcept
  { return geometry_.planes * num_pages_ * geometry_.block_bytes(); }

  /// @brief The block of (page, layer, plane); unchecked.
  [[nodiscard]] STRATA_HOST_DEVICE block_ref block(std::int64_t page, std::int64_t layer,
                                                   std::int64_t plane) const noexcept
  {
    auto const& g = geometry_;
    return {table_.ptr[layer] + (plane * num_pages_ + page) * g.block_bytes(), g.row_bytes(), g.head_bytes()};
  }

 private:
  detail::pointer_table table_;
  kv_geometry geometry_;
  std::int64_t num_pages_;
};
static_assert(kv_layout<vllm_layout>);

/**
 * @brief Hugging Face transformers' static cache: per layer a K and a V tensor
 *        `[batch, kv_heads, seq_capacity, head_dim]` (head-major).
 *
 * Pages are numbered sequence by sequence: page p is tokens
 * `[(p % pages_per_sequence) * page_tokens, ... + page_tokens)` of batch entry
 * `p / pages_per_sequence`, where `pages_per_sequence = seq_capacity / page_tokens`. A head's tokens
 * are contiguous, so a block is `kv_heads` runs, and a copy to a token-major layout transposes.
 */
class hf_layout {
 public:
  static constexpr layout_order order = layout_order::layer_major;  ///< memory order
  static constexpr char const* name = "hf";                         ///< for reports

  /**
   * @param k_buffers `layers` K base pointers (`cache.layers[l].keys.data_ptr()`)
   * @param v_buffers `layers` V base pointers; empty when `planes == 1`
   * @param geometry shape of the cache; `head_dim * elem_bytes` must be a multiple of 16
   * @param batch sequences in the cache
   * @param seq_capacity tokens per sequence; a multiple of `page_tokens` (a partial page would be
   *        unreachable, so it is rejected rather than silently dropped)
   * @throw strata::invalid_argument for any of the above, a null pointer, or an overflowing size
   */
  hf_layout(std::span<std::byte* const> k_buffers, std::span<std::byte* const> v_buffers, kv_geometry const& geometry,
            std::int64_t batch, std::int64_t seq_capacity)
      : geometry_{geometry}, seq_capacity_{seq_capacity}
  {
    geometry.validate();
    STRATA_EXPECTS(static_cast<std::int64_t>(k_buffers.size()) == geometry.layers, name, ": expected ", geometry.layers,
                   " K pointers, got ", k_buffers.size());
    STRATA_EXPECTS(static_cast<std::int64_t>(v_buffers.size()) == (geometry.planes == 2 ? geometry.layers : 0), name,
                   ": expected ", geometry.planes == 2 ? geometry.layers : 0, " V pointers, got ", v_buffers.size());
    STRATA_EXPECTS(geometry.head_bytes() % 16 == 0, name, ": head_dim * elem_bytes must be a multiple of 16, got ",
                   geometry.head_bytes());
    STRATA_EXPECTS(batch > 0, name, ": batch must be positive, got ", batch);
    STRATA_EXPECTS(seq_capacity > 0 && seq_capacity % geometry.page_tokens == 0, name, ": seq_capacity ", seq_capacity,
                   " must be a positive multiple of page_tokens ", geometry.page_tokens);
    std::vector<std::byte*> table;
    for (std::size_t l = 0; l < k_buffers.size(); ++l) {
      table.push_back(k_buffers[l]);
      if (geometry.planes == 2) { table.push_back(v_buffers[l]); }
    }
    table_ = detail::pointer_table::from(table, name);
    pages_per_sequence_ = seq_capacity / geometry.page_tokens;
    num_pages_ = detail::checked_extent(batch, pages_per_sequence_, name);
    auto const per_batch = detail::checked_extent(detail::checked_extent(geometry.kv_heads, seq_capacity, name),
                                                  geometry.head_bytes(), name);
    (void)detail::checked_extent(per_batch, batch, name);
  }

  /// @brief Shape of the cache.
  [[nodiscard]] STRATA_HOST_DEVICE kv_geometry const& geometry() const noexcept { return geometry_; }
  /// @brief Pages in the cache: `batch * pages_per_sequence()`.
  [[nodiscard]] STRATA_HOST_DEVICE std::int64_t num_pages() const noexcept { return num_pages_; }
  /// @brief Pages per batch entry.
  [[nodiscard]] STRATA_HOST_DEVICE std::int64_t pages_per_sequence() const noexcept { return pages_per_sequence_; }
  /// @brief Bytes each (layer, plane) tensor spans.
  [[nodiscard]] std::int64_t tensor_bytes() const noexcept
  { return num_pages_ / pages_per_sequence_ * geometry_.kv_heads * seq_capacity_ * geometry_.head_bytes(); }

  /// @brief The block of (page, layer, plane); unchecked.
  [[nodiscard]] STRATA_HOST_DEVICE block_ref block(std::int64_t page, std::int64_t layer,
                                                   std::int64_t plane) const noexcept
  {
    auto const& g = geometry_;
    std::int64_t const seq = page / pages_per_sequence_;
    std::int64_t const first_token = (page - seq * pages_per_sequence_) * g.page_tokens;
    std::int64_t const head_stride = seq_capacity_ * g.head_bytes();
    return {table_.ptr[layer * g.planes + plane] + seq * g.kv_heads * head_stride + first_token * g.head_bytes(),
            g.head_bytes(), head_stride};
  }

 private:
  detail::pointer_table table_;
  kv_geometry geometry_;
  std::int64_t seq_capacity_;
  std::int64_t pages_per_sequence_{};
  std::int64_t num_pages_{};
};
static_assert(kv_layout<hf_layout>);

}  // namespace strata
