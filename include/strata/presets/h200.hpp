// SPDX-License-Identifier: Apache-2.0
/**
 * @file presets/h200.hpp
 * @brief Every measured machine figure strata ships, for one NVIDIA H200 (PCIe 5.0 x16) and its
 *        host: compute costs of known models, the transfer systems' rates, the file tier's disk,
 *        and the GPU executor's table of backend costs. docs/cost_model.md and docs/benchmarks.md
 *        give each figure's source (date, benchmark, commit).
 *
 * Read by whoever needs defaults (the cache controller's cost model, the GPU executor's backend
 * choice, the simulator); nothing below `cache/` depends on it. Another machine is another preset.
 */
#pragma once

#include <strata/error.hpp>
#include <strata/geometry.hpp>
#include <strata/sched/cost_model.hpp>
#include <strata/transfer/choice.hpp>

#include <array>

namespace strata {
/// @brief Measured and derived figures of one H200 and its host (docs/cost_model.md for every source).
namespace h200 {

/**
 * @brief Compute costs of a model on one H200.
 *
 * - Linear prefill: Llama-3.1-8B's per-layer GEMMs for 4,096 tokens ran 75–78 ms (bench_interference,
 *   2026-11-29: 18.8 µs per token, 0.74 PFLOP/s); +10% for norms, RoPE and the rest; other models scale
 *   by their non-embedding parameters (Llama-3.1-70B in FP8 at 1.5x the bf16 rate: 141 GB of bf16
 *   weights do not fit one H200 with a KV cache).
 * - Attention: 4 * q_heads * head_dim * layers FLOPs per (query, key) pair at 450 TFLOP/s (about 60%
 *   of the measured bf16 GEMM rate, what FlashAttention-3 reports for long causal sequences).
 * - Decode: every parameter's bytes (16.06 GB for Llama-3.1-8B in bf16; a conservative reading, as
 *   only rows of the embedding table are read) streamed at 3.58 TB/s (measured: 13.96 GB of
 *   Llama-3.1-8B GEMM weights per step in 3.9 ms), plus the KV cache read, 0.2 ms per step and 2 µs
 *   per sequence.
 */
inline compute_costs model_costs(model_shape const& m)
{
  struct shape {
    double non_embedding_params, all_params_bytes, q_heads, head_dim, rate_scale;
  };
  auto same = [&](model_shape const& o) {
    return m.layers == o.layers && m.kv_heads == o.kv_heads && m.head_dim == o.head_dim && m.planes == o.planes;
  };
  shape s{};
  if (same(models::llama31_8b)) {
    s = {6.98e9, 16.06e9, 32, 128, 1.0};  // bf16
  } else if (same(models::qwen25_14b)) {
    s = {13.1e9, 29.54e9, 40, 128, 1.0};  // bf16
  } else if (same(models::llama31_70b)) {
    s = {68.5e9, 70.6e9, 64, 128, 1.5};  // FP8 weights
  } else {
    STRATA_EXPECTS(false, "h200::model_costs: no figures for ", m.name ? m.name : "this model", " (", m.layers,
                   " layers, ", m.kv_heads, " KV heads of ", m.head_dim,
                   "): Llama-3.1-8B, Qwen-2.5-14B and Llama-3.1-70B have them");
  }
  double const llama8b_s_per_param_token = 18.8e-6 / 6.98e9;  // measured GEMM rate
  compute_costs c;
  c.prefill_s_per_token = 1.1 * s.non_embedding_params * llama8b_s_per_param_token / s.rate_scale;
  c.attention_flop_per_pair = 4 * s.q_heads * s.head_dim * double(m.layers);
  c.attention_flops = 450e12;
  c.decode_weight_bytes = s.all_params_bytes;
  c.decode_kv_bytes_per_token = double(m.layers * m.planes * m.kv_heads * m.head_dim * 2);
  c.hbm_bytes_per_s = 3.58e12;
  c.decode_overhead_s = 0.2e-3;
  c.decode_s_per_sequence = 2e-6;
  c.layers = m.layers;
  return c;
}

/// @brief File-tier read bandwidth measured on the H200 machine's disk (2026-12-01, `bench_file_store`,
///        docs/results/2026-12-01-h200/file_store-ee1a499.txt): the median of the six read and
///        shuffled-read repetitions of Llama-3.1-8B 32-token records through `file_store` (O_DIRECT,
///        io_uring, CRC-32C), 1.924 GB/s, 0.99 of a plain sequential O_DIRECT read of the same bytes.
inline constexpr double file_read_bytes_per_s = 1.92e9;
/// @brief File-tier write bandwidth measured in the same run: median of three, 2.876 GB/s (1.00 of sequential).
inline constexpr double file_write_bytes_per_s = 2.88e9;
/// @brief Assumed, not measured here: one PCIe 5.0 x4 NVMe drive, 12 GB/s each way (what the cost
///        model used before the file tier was measured). `cost_model::set_file_tier` selects it.
inline constexpr double pcie5_nvme_bytes_per_s = 12e9;

/**
 * @brief Tiers below the host. File: the measured `file_read_bytes_per_s` and
 *        `file_write_bytes_per_s` of the H200 machine's disk, 100 µs per load (assumed); its pages
 *        then cross PCIe at the host tier's rate (`cost_model::load_s`). Remote (assumed, not
 *        measured): a 100 Gb/s network store at 10 GB/s each way and 1 ms per transfer.
 */
inline void lower_tiers(io_costs& io)
{
  io.load_bytes_per_s[2] = file_read_bytes_per_s;
  io.store_bytes_per_s[2] = file_write_bytes_per_s;
  io.load_latency_s[2] = 100e-6;
  io.load_bytes_per_s[3] = 10e9;
  io.store_bytes_per_s[3] = 10e9;
  io.load_latency_s[3] = 1e-3;
}

/**
 * @brief GPU-assisted I/O (2 CTAs) with layer-wise overlap: 49.4 GB/s loads and 52.4 GB/s backups
 *        (bench_transfer, Llama-3.1-8B 32-token pages, 8K context), and the compute it costs with
 *        the SM count target: prefill +4.4%, decode +4.6% while loads run (bench_interference, loads at 0.87-0.88 of
 * contiguous meanwhile).
 */
inline io_costs gpu_assisted_io()
{
  io_costs io;
  io.load_bytes_per_s[1] = 49.4e9;
  io.load_latency_s[1] = 20e-6;
  io.backup_bytes_per_s = 52.4e9;
  io.layerwise_overlap = true;
  io.prefill_slowdown = 0.044;
  io.decode_slowdown = 0.046;
  lower_tiers(io);
  return io;
}

/// @brief Batched DMA from a submit thread (SGLang-like): 52.3 GB/s loads, 53.3 GB/s backups,
///        layer-wise overlap, prefill +2.6% and decode +3.8% beside loads.
inline io_costs batched_dma_io()
{
  io_costs io;
  io.load_bytes_per_s[1] = 52.3e9;
  io.load_latency_s[1] = 50e-6;
  io.backup_bytes_per_s = 53.3e9;
  io.layerwise_overlap = true;
  io.prefill_slowdown = 0.026;
  io.decode_slowdown = 0.038;
  lower_tiers(io);
  return io;
}

/// @brief Per-block DMA (vLLM-with-offloading-like): 16.0 GB/s loads and 17.4 GB/s backups for
///        64 KiB blocks, the whole load before the forward pass.
inline io_costs per_block_dma_io()
{
  io_costs io;
  io.load_bytes_per_s[1] = 16.0e9;
  io.load_latency_s[1] = 50e-6;
  io.backup_bytes_per_s = 17.4e9;
  io.layerwise_overlap = false;
  lower_tiers(io);
  return io;
}

/// @brief A cost model for `m` (32-token pages, bf16 KV) with transfer system `io`.
inline cost_model costs(model_shape const& m, io_costs const& io, std::int64_t page_tokens = 32)
{
  kv_geometry const g = m.geometry(page_tokens);
  return cost_model{model_costs(m), io, g.page_bytes(), page_tokens};
}

/**
 * @brief H200 cost figures for any geometry: a known model's (`models::`) when the geometry is
 *        one, else Llama-3.1-8B's compute scaled by KV bytes per token (a rough proxy for model size).
 */
inline cost_model costs_for(kv_geometry const& g)
{
  for (model_shape const& m : {models::llama31_8b, models::qwen25_14b, models::llama31_70b}) {
    if (m.layers == g.layers && m.kv_heads == g.kv_heads && m.head_dim == g.head_dim && m.planes == g.planes) {
      return cost_model{model_costs(m), gpu_assisted_io(), g.page_bytes(), g.page_tokens};
    }
  }
  compute_costs c = model_costs(models::llama31_8b);
  double const scale =
      double(g.token_bytes()) / double(models::llama31_8b.geometry(g.page_tokens, g.elem_bytes).token_bytes());
  c.prefill_s_per_token *= scale;
  c.attention_flop_per_pair *= scale;
  c.decode_weight_bytes *= scale;
  c.decode_kv_bytes_per_token = double(g.token_bytes());
  c.layers = g.layers;
  return cost_model{c, gpu_assisted_io(), g.page_bytes(), g.page_tokens};
}

/**
 * @brief Measured costs of the loads of an 8K-token Llama-3.1-8B context (64 KiB blocks) on the
 *        H200 (docs/benchmarks.md, commits 4f1e287 and 33baf22; contiguous copy 55 GB/s), indexed by
 *        `gpu_backend`: bandwidth alone / beside prefill / beside decode, and the compute's slowdown.
 *        `dma_batch` is further capped by its descriptor rate on small blocks (`gpu_executor_config`).
 */
inline std::array<transfer_option, gpu_backend_count> load_options()
{
  return {transfer_option{"gpu_assisted/2", {50.8, 34.1, 47.9}, {0, 0.15, 0.045}, 0.05},
          transfer_option{"dma_batch (submit thread)", {53.2, 52.8, 52.3}, {0, 0.023, 0.038}, 0.05},
          transfer_option{"staged", {53.8, 25.3, 53.4}, {0, 0.045, 0.06}, 0.5}};
}
/// @brief The same for backups and demotions (device to host; `gpu_assisted` with one CTA).
inline std::array<transfer_option, gpu_backend_count> copy_options()
{
  return {transfer_option{"gpu_assisted/1", {42.1, 29.7, 29.7}, {0, 0.125, 0.032}, 0.05},
          transfer_option{"dma_batch (submit thread)", {53.4, 52.8, 52.3}, {0, 0.023, 0.038}, 0.05},
          transfer_option{"staged", {54.0, 25.3, 53.4}, {0, 0.045, 0.06}, 0.5}};
}

}  // namespace h200
}  // namespace strata
