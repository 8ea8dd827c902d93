// SPDX-License-Identifier: Apache-2.0
/**
 * @file sched/cost_model.hpp
 * @brief Predicted times: loading pages between tiers, prefill, decode.
 *
 * Defaults are one H200 (PCIe 5.0 x16) and the models of `strata::models`; every number says where
 * it comes from. The scheduler uses the model to predict a batch's load and compute time; the
 * simulator uses the same model as its clock.
 */
#pragma once

#include <strata/error.hpp>
#include <strata/geometry.hpp>
#include <strata/types.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace strata {

/// @brief Compute costs of one model on one GPU.
struct compute_costs {
  double prefill_s_per_token = 0;      ///< linear (GEMM and elementwise) prefill time per new token
  double attention_flop_per_pair = 0;  ///< FLOPs per (query, key) pair over all layers: 4 * q_heads * head_dim * layers
  double attention_flops = 0;          ///< sustained attention FLOP/s (causal prefill)
  double decode_weight_bytes = 0;      ///< bytes read per decode step whatever the batch (the weights)
  double decode_kv_bytes_per_token = 0;  ///< KV bytes read per token of context per step
  double hbm_bytes_per_s = 0;            ///< sustained HBM read bandwidth of decode
  double decode_overhead_s = 0;          ///< fixed per decode step (sampling, scheduling)
  double decode_s_per_sequence = 0;      ///< per sequence in the batch (the batch's GEMM rows)
  std::int64_t layers = 0;               ///< layers: the granularity of layer-wise load/compute overlap
};

/// @brief Whether pages of tier `t` are records that reach the device through host memory (the
///        file and remote tiers: `record_store`s, read into page-first host records, then copied
///        over PCIe like a host-tier load).
[[nodiscard]] constexpr bool is_record_tier(tier t) noexcept { return t == tier::file || t == tier::remote; }

/// @brief Costs of moving pages between tiers, as one transfer system does it.
struct io_costs {
  /// Sustained bandwidth of loads from each tier (index: `tier`; [device] unused). The host tier's
  /// is the PCIe copy into the device pool; a record tier's (file, remote) is the read of its
  /// records into host memory alone: `cost_model::load_s` adds the PCIe leg at the host tier's rate.
  std::array<double, tier_count> load_bytes_per_s{};
  /// Bandwidth of device -> host backups (the other direction of the link: no contention with loads).
  double backup_bytes_per_s = 0;
  /// Fixed time per load from each tier (launch, queue, network round trip).
  std::array<double, tier_count> load_latency_s{};
  /// Bandwidth of writes into each record tier (demotions and backups into file records or the
  /// remote store; index: `tier`; [device] and [host] unused). 0: the tier's load bandwidth.
  std::array<double, tier_count> store_bytes_per_s{};
  /// Whether a batch's reads from record tiers overlap its compute. false: they precede it, as the
  /// executors do today (`host_executor`, `gpu_executor`: records are read into a host bounce
  /// buffer on the calling thread, inside `begin_loads`, before the copies to the device are issued).
  bool record_reads_overlap = false;
  /// Engine-thread CPU seconds per byte loaded that delay the batch (0 with a submit thread).
  double cpu_s_per_byte = 0;
  /// Whether compute on layer l starts as soon as layer l has landed (else after the whole load).
  bool layerwise_overlap = true;
  /// Fractional slowdown of prefill compute while loads run beside it (SM copies cost compute).
  double prefill_slowdown = 0;
  /// Fractional slowdown of decode steps while loads run beside them.
  double decode_slowdown = 0;
};

/**
 * @brief Predicts load, prefill and decode times.
 */
class cost_model {
 public:
  /// @brief An empty model (no rates: every prediction is meaningless until one is assigned).
  cost_model() = default;
  /**
   * @param compute the model's compute costs
   * @param io the transfer system's costs
   * @param page_bytes KV bytes of one page (all layers)
   * @param page_tokens tokens per page
   * @throw strata::invalid_argument for non-positive rates, sizes or layer count, or negative costs
   */
  cost_model(compute_costs const& compute, io_costs const& io, std::int64_t page_bytes, std::int64_t page_tokens)
      : compute_{compute}, io_{io}, page_bytes_{page_bytes}, page_tokens_{page_tokens}
  {
    STRATA_EXPECTS(page_bytes > 0 && page_tokens > 0, "cost_model: page_bytes and page_tokens must be positive, got ",
                   page_bytes, " and ", page_tokens);
    STRATA_EXPECTS(compute.prefill_s_per_token > 0 && compute.attention_flops > 0 && compute.hbm_bytes_per_s > 0 &&
                       compute.layers > 0,
                   "cost_model: prefill time, attention FLOP/s, HBM bandwidth and layers must be positive");
    STRATA_EXPECTS(compute.attention_flop_per_pair >= 0 && compute.decode_weight_bytes >= 0 &&
                       compute.decode_kv_bytes_per_token >= 0 && compute.decode_overhead_s >= 0 &&
                       compute.decode_s_per_sequence >= 0,
                   "cost_model: compute costs must not be negative");
    for (std::size_t t = 1; t < tier_count; ++t) {
      STRATA_EXPECTS(io.load_bytes_per_s[t] > 0, "cost_model: load bandwidth from the ", to_string(tier(t)),
                     " tier must be positive, got ", io.load_bytes_per_s[t]);
      STRATA_EXPECTS(io.load_latency_s[t] >= 0, "cost_model: negative load latency");
      STRATA_EXPECTS(io.store_bytes_per_s[t] >= 0, "cost_model: write bandwidth into the ", to_string(tier(t)),
                     " tier must not be negative, got ", io.store_bytes_per_s[t]);
    }
    STRATA_EXPECTS(io.backup_bytes_per_s > 0, "cost_model: backup bandwidth must be positive");
    STRATA_EXPECTS(io.cpu_s_per_byte >= 0 && io.prefill_slowdown >= 0 && io.decode_slowdown >= 0,
                   "cost_model: CPU cost and slowdowns must not be negative");
  }

  /// @brief The compute costs.
  [[nodiscard]] compute_costs const& compute() const noexcept { return compute_; }
  /// @brief The transfer costs.
  [[nodiscard]] io_costs const& io() const noexcept { return io_; }
  /// @brief KV bytes per page.
  [[nodiscard]] std::int64_t page_bytes() const noexcept { return page_bytes_; }
  /// @brief Tokens per page.
  [[nodiscard]] std::int64_t page_tokens() const noexcept { return page_tokens_; }

  /**
   * @brief Seconds to load `pages[t]` pages from each lower tier t onto the device. Each tier with
   *        pages adds its latency and its bytes over its bandwidth; a record tier's pages (file,
   *        remote) then cross PCIe from the host bounce buffer as one more host-tier copy (host
   *        latency and bandwidth). CPU submission time on the engine thread counts once per byte
   *        copied to the device. All copies share the link: their times add.
   */
  [[nodiscard]] double load_s(std::array<std::int64_t, tier_count> const& pages) const noexcept
  {
    double s = 0;
    for (std::size_t t = 1; t < tier_count; ++t) {
      if (pages[t] <= 0) { continue; }
      double const bytes = double(pages[t]) * double(page_bytes_);
      s += io_.load_latency_s[t] + bytes / io_.load_bytes_per_s[t] + bytes * io_.cpu_s_per_byte;
      if (is_record_tier(tier(t))) { s += host_leg_s(bytes); }
    }
    return s;
  }
  /// @brief Of `load_s(pages)`, the seconds spent reading record tiers (file, remote) into host
  ///        memory: latency plus bytes over the tier's read bandwidth (no PCIe leg).
  [[nodiscard]] double record_read_s(std::array<std::int64_t, tier_count> const& pages) const noexcept
  {
    double s = 0;
    for (std::size_t t = 1; t < tier_count; ++t) {
      if (pages[t] <= 0 || !is_record_tier(tier(t))) { continue; }
      s += io_.load_latency_s[t] + double(pages[t]) * double(page_bytes_) / io_.load_bytes_per_s[t];
    }
    return s;
  }
  /// @brief Of `load_s(pages)`, the seconds that precede the batch's compute and do not pipeline
  ///        with it: the record reads unless `io_costs::record_reads_overlap`, else 0. Pass it to
  ///        `batch_s` and `stall_s`.
  [[nodiscard]] double serial_load_s(std::array<std::int64_t, tier_count> const& pages) const noexcept
  { return io_.record_reads_overlap ? 0.0 : record_read_s(pages); }
  /// @brief Write bandwidth into tier `t` (a record tier's `store_bytes_per_s`, or its load
  ///        bandwidth where that is 0; the host's is `backup_bytes_per_s`).
  [[nodiscard]] double write_bytes_per_s(tier t) const noexcept
  {
    if (!is_record_tier(t)) { return io_.backup_bytes_per_s; }
    double const w = io_.store_bytes_per_s[std::size_t(t)];
    return w > 0 ? w : io_.load_bytes_per_s[std::size_t(t)];
  }
  /**
   * @brief Seconds of a copy of `pages` pages from tier `from` to tier `to` that is not a batch's
   *        load (a backup, demotion or prefetch, in the background: no latency, no engine CPU):
   *        the device -> host leg at the backup bandwidth when it leaves the device, the read of
   *        records when it leaves a record tier, the write of records when it enters one, and the
   *        host -> device leg when it enters the device.
   */
  [[nodiscard]] double copy_s(tier from, tier to, std::int64_t pages) const noexcept
  {
    double const bytes = double(pages) * double(page_bytes_);
    double s = 0;
    if (from == tier::device) { s += bytes / io_.backup_bytes_per_s; }
    if (is_record_tier(from)) { s += bytes / io_.load_bytes_per_s[std::size_t(from)]; }
    if (is_record_tier(to)) { s += bytes / write_bytes_per_s(to); }
    if (to == tier::device) { s += bytes / io_.load_bytes_per_s[std::size_t(tier::host)]; }
    return s;
  }
  /// @brief Seconds to back `pages` pages up to the host.
  [[nodiscard]] double backup_s(std::int64_t pages) const noexcept
  { return double(pages) * double(page_bytes_) / io_.backup_bytes_per_s; }
  /// @brief Seconds of prefill for `new_tokens` tokens attending to `context_tokens` earlier tokens
  ///        (and causally to each other).
  [[nodiscard]] double prefill_s(std::int64_t new_tokens, std::int64_t context_tokens) const noexcept
  {
    double const n = double(new_tokens);
    double const pairs = n * double(context_tokens) + 0.5 * n * n;
    return n * compute_.prefill_s_per_token + pairs * compute_.attention_flop_per_pair / compute_.attention_flops;
  }
  /// @brief Seconds of one decode step for `sequences` sequences holding `context_tokens` in all.
  [[nodiscard]] double decode_s(std::int64_t sequences, std::int64_t context_tokens) const noexcept
  {
    if (sequences <= 0) { return 0; }
    return compute_.decode_overhead_s + double(sequences) * compute_.decode_s_per_sequence +
           (compute_.decode_weight_bytes + double(context_tokens) * compute_.decode_kv_bytes_per_token) /
               compute_.hbm_bytes_per_s;
  }
  /**
   * @brief Seconds of a prefill batch that loads for `load` seconds and computes for `compute`:
   *        with layer-wise overlap the two pipeline layer by layer (compute slowed while loads run
   *        beside it), else the load comes first.
   * @param serial of `load`, the seconds that precede the compute whatever the overlap
   *        (`serial_load_s`: record reads); clamped to [0, load]
   */
  [[nodiscard]] double batch_s(double load, double compute, double serial = 0) const noexcept
  {
    if (load <= 0) { return compute; }
    if (!io_.layerwise_overlap) { return load + compute; }
    serial = std::clamp(serial, 0.0, load);
    double const rest = load - serial;
    double const c = slowed_compute_s(rest, compute);
    return serial + std::max(rest, c) + std::min(rest, c) / double(compute_.layers);
  }
  /// @brief Of `batch_s(load, compute, serial)`, the seconds the GPU computes nothing while it
  ///        waits for loads (not the slowdown of compute beside them): what decode steps may fill.
  [[nodiscard]] double stall_s(double load, double compute, double serial = 0) const noexcept
  {
    if (load <= 0) { return 0; }
    double const rest = load - std::clamp(serial, 0.0, load);
    return std::max(
        0.0, batch_s(load, compute, serial) - (io_.layerwise_overlap ? slowed_compute_s(rest, compute) : compute));
  }

  /**
   * @brief Sets the file tier's read bandwidth (what `load_s` charges per byte before the PCIe
   *        leg) and its write bandwidth (demotions into it), in bytes per second; latency unchanged.
   * @throw strata::invalid_argument unless both are positive and finite; the model is then unchanged
   */
  void set_file_tier(double read_bytes_per_s, double write_bytes_per_s)
  {
    STRATA_EXPECTS(std::isfinite(read_bytes_per_s) && read_bytes_per_s > 0,
                   "cost_model::set_file_tier: the read bandwidth must be a positive, finite number of bytes/s, got ",
                   read_bytes_per_s);
    STRATA_EXPECTS(std::isfinite(write_bytes_per_s) && write_bytes_per_s > 0,
                   "cost_model::set_file_tier: the write bandwidth must be a positive, finite number of bytes/s, got ",
                   write_bytes_per_s);
    io_.load_bytes_per_s[std::size_t(tier::file)] = read_bytes_per_s;
    io_.store_bytes_per_s[std::size_t(tier::file)] = write_bytes_per_s;
  }

  /**
   * @brief Sets the file tier's read and write bandwidth from the output of `bench_file_store`
   *        (Google Benchmark's console format, as committed under docs/results/): the median over
   *        every repetition of the `read` and `read(shuffled slots)` runs of `-p<page_tokens>`
   *        records, and of their `write` runs (aggregate rows such as `_median` are skipped; the
   *        write bandwidth is unchanged when the file has no write runs). Each `GB/s=` counter is
   *        the store's payload rate, checksums and headers included.
   * @param path the benchmark's output
   * @param page_tokens selects the records (`llama3.1-8b-p32`: 32)
   * @return the read and write bandwidth now in the model, bytes per second
   * @throw strata::invalid_argument when the file cannot be read, a matching row has no readable
   *        `GB/s=` counter, or no read row matches; the model is then unchanged
   */
  std::pair<double, double> calibrate_file_tier(std::string const& path, std::int64_t page_tokens)
  {
    std::ifstream in{path};
    STRATA_EXPECTS(in.good(), "cost_model::calibrate_file_tier: cannot read ", path);
    std::string const records = "-p" + std::to_string(page_tokens) + "/";
    std::vector<double> reads, writes;
    std::string line;
    for (std::int64_t line_no = 1; std::getline(in, line); ++line_no) {
      std::istringstream words{line};
      std::string name;
      words >> name;
      std::size_t const at = name.find(records);
      if (at == std::string::npos) { continue; }
      std::string const op = name.substr(at + records.size());
      bool const read = op.rfind("read", 0) == 0, write = op.rfind("write", 0) == 0;
      bool const aggregate = name.find("_mean") != std::string::npos || name.find("_median") != std::string::npos ||
                             name.find("_stddev") != std::string::npos || name.find("_cv") != std::string::npos;
      if ((!read && !write) || aggregate) { continue; }
      std::size_t const counter = line.find(" GB/s=");
      double gbps = 0;
      bool parsed = counter != std::string::npos;
      if (parsed) {
        try {
          std::size_t used = 0;
          std::string const cell = line.substr(counter + 6, line.find(' ', counter + 6) - (counter + 6));
          gbps = std::stod(cell, &used);
          parsed = used == cell.size() && std::isfinite(gbps) && gbps > 0;
        } catch (std::logic_error const&) {  // std::stod
          parsed = false;
        }
      }
      STRATA_EXPECTS(parsed, "cost_model::calibrate_file_tier: ", path, ":", line_no,
                     ": no positive GB/s= counter in '", line, "'");
      (read ? reads : writes).push_back(gbps * 1e9);
    }
    STRATA_EXPECTS(!reads.empty(), "cost_model::calibrate_file_tier: no read runs of ",
                   records.substr(1, records.size() - 2), " records in ", path);
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      std::size_t const n = v.size();
      return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    };
    set_file_tier(median(reads), writes.empty() ? write_bytes_per_s(tier::file) : median(writes));
    return {io_.load_bytes_per_s[std::size_t(tier::file)], io_.store_bytes_per_s[std::size_t(tier::file)]};
  }

  /**
   * @brief Replaces the host tier's load bandwidth and the backup bandwidth with the best `GBps` of
   *        the matching rows of a `bench_transfer` CSV (one backend, KV head count and page size;
   *        the best of the contexts measured). File and remote tiers are other links: unchanged.
   * @param path the CSV (`transfer.csv` under `$OUT`)
   * @param backend e.g. "gpu_assisted/2"; @param kv_heads, page_tokens select the rows
   * @throw strata::invalid_argument when the file cannot be read, a row cannot be parsed, or no
   *        load and backup rows match; the model is then unchanged
   */
  void calibrate_from_csv(std::string const& path, std::string const& backend, std::int64_t kv_heads,
                          std::int64_t page_tokens)
  {
    std::ifstream in{path};
    STRATA_EXPECTS(in.good(), "cost_model::calibrate_from_csv: cannot read ", path);
    std::string line;
    std::getline(in, line);  // header
    double load = 0, backup = 0;
    for (std::int64_t line_no = 2; std::getline(in, line); ++line_no) {
      std::vector<std::string> f;
      std::stringstream ss{line};
      for (std::string cell; std::getline(ss, cell, ',');) {
        f.push_back(cell);
      }
      if (f.size() < 6 || f[5] != backend) { continue; }
      STRATA_EXPECTS(f.size() >= 7, "cost_model::calibrate_from_csv: ", path, ":", line_no, ": a ", backend,
                     " row without a GBps cell");
      STRATA_EXPECTS(f[4] == "load" || f[4] == "backup", "cost_model::calibrate_from_csv: ", path, ":", line_no,
                     ": direction '", f[4], "' is neither load nor backup");
      std::int64_t heads = 0, page = 0;
      double gbps = 0;
      bool parsed = true;
      try {  // each cell whole: "8x" is not 8
        std::size_t used_heads = 0, used_page = 0, used_gbps = 0;
        heads = std::stoll(f[1], &used_heads), page = std::stoll(f[2], &used_page), gbps = std::stod(f[6], &used_gbps);
        parsed = used_heads == f[1].size() && used_page == f[2].size() && used_gbps == f[6].size();
      } catch (std::logic_error const&) {  // std::stoll / std::stod
        parsed = false;
      }
      STRATA_EXPECTS(parsed, "cost_model::calibrate_from_csv: ", path, ":", line_no, ": cannot parse '", line, "'");
      if (heads != kv_heads || page != page_tokens) { continue; }
      double& best = f[4] == "load" ? load : backup;
      best = std::max(best, gbps * 1e9);
    }
    STRATA_EXPECTS(load > 0 && backup > 0, "cost_model::calibrate_from_csv: no load and backup rows for ", backend,
                   ", ", kv_heads, " KV heads, ", page_tokens, "-token pages in ", path);
    io_.load_bytes_per_s[std::size_t(tier::host)] = load;
    io_.backup_bytes_per_s = backup;
  }

 private:
  /// The PCIe leg of a record tier's bytes: from the host bounce buffer into the device pool, one
  /// more host-tier copy (the engine-thread CPU of those bytes is counted once, by `load_s`).
  [[nodiscard]] double host_leg_s(double bytes) const noexcept
  { return io_.load_latency_s[std::size_t(tier::host)] + bytes / io_.load_bytes_per_s[std::size_t(tier::host)]; }
  /// Compute time with the part that overlaps loads slowed by `prefill_slowdown`.
  [[nodiscard]] double slowed_compute_s(double load, double compute) const noexcept
  { return compute + std::min(load, compute) * io_.prefill_slowdown; }

  compute_costs compute_{};
  io_costs io_{};
  std::int64_t page_bytes_{0};  // 0: an empty model (default-constructed)
  std::int64_t page_tokens_{0};
};

/// @brief Measured and derived costs on one H200. See docs/cost_model.md for every source.
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

}  // namespace h200
}  // namespace strata
