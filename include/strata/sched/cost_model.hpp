// SPDX-License-Identifier: Apache-2.0
/**
 * @file sched/cost_model.hpp
 * @brief Predicted times: loading pages between tiers, prefill, decode.
 *
 * The model holds no figures of its own: `presets/h200.hpp` has every H200 number, each saying where
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
#include <limits>

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
  /// executors do today (`cpu_executor`, `gpu_executor`: records are read into host staging on a
  /// record thread, and the batch's layers wait for the last chunk's copy to the device).
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
   *        remote) then cross PCIe from the host staging as one more host-tier copy (host
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
   * @brief How deep into a prompt a page must lie before keeping it in record tier `t` pays: a
   *        later read of it from `t` saves more than recomputing it would cost, by more than the
   *        time its write holds the pages it copies. In tokens before the page's middle.
   *
   * Writing and reading a page cost the same at any depth (the tier's write; its read, then the
   * PCIe leg); recomputing it costs its linear prefill plus attention to every token before it,
   * which grows with the depth. A page of P tokens whose middle lies m tokens in costs P (a + m f)
   * to recompute (a: linear seconds per token, f: attention seconds per (query, key) pair), P r to
   * read and P w to write, so keeping it pays past m = (r + w - a) / f. -infinity: it always pays
   * (and for tiers that are not record tiers); +infinity: it never does.
   */
  [[nodiscard]] double record_breakeven_tokens(tier t) const noexcept
  {
    double const inf = std::numeric_limits<double>::infinity();
    if (!is_record_tier(t) || page_bytes_ == 0) { return -inf; }
    double const per_token = double(page_bytes_) / double(page_tokens_);
    double const r = per_token * (1 / io_.load_bytes_per_s[std::size_t(t)] +
                                  1 / io_.load_bytes_per_s[std::size_t(tier::host)] + io_.cpu_s_per_byte);
    double const w = per_token / write_bytes_per_s(t);
    double const a = compute_.prefill_s_per_token;
    double const f = compute_.attention_flop_per_pair / compute_.attention_flops;
    if (f <= 0) { return r + w < a ? -inf : inf; }
    return (r + w - a) / f;
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
    set_ |= file_set;
  }

  /**
   * @brief Sets the remote tier's read and write bandwidth (bytes per second, as measured through
   *        the store: `measure_keyed_store`) and the latency of one read (a round trip).
   * @throw strata::invalid_argument unless both bandwidths are positive and finite and the latency
   *        finite and not negative; the model is then unchanged
   */
  void set_remote_tier(double read_bytes_per_s, double write_bytes_per_s, double latency_s)
  {
    STRATA_EXPECTS(std::isfinite(read_bytes_per_s) && read_bytes_per_s > 0 && std::isfinite(write_bytes_per_s) &&
                       write_bytes_per_s > 0,
                   "cost_model::set_remote_tier: bandwidths must be positive, finite numbers of bytes/s, got ",
                   read_bytes_per_s, " and ", write_bytes_per_s);
    STRATA_EXPECTS(std::isfinite(latency_s) && latency_s >= 0,
                   "cost_model::set_remote_tier: the latency must be finite and not negative, got ", latency_s);
    io_.load_bytes_per_s[std::size_t(tier::remote)] = read_bytes_per_s;
    io_.store_bytes_per_s[std::size_t(tier::remote)] = write_bytes_per_s;
    io_.load_latency_s[std::size_t(tier::remote)] = latency_s;
    set_ |= remote_set;
  }

  /**
   * @brief Sets the host tier's load bandwidth (PCIe into the device pool) and the backup bandwidth
   *        (device -> host), in bytes per second; latencies unchanged.
   * @throw strata::invalid_argument unless both are positive and finite; the model is then unchanged
   */
  void set_host_link(double load_bytes_per_s, double backup_bytes_per_s)
  {
    STRATA_EXPECTS(std::isfinite(load_bytes_per_s) && load_bytes_per_s > 0 && std::isfinite(backup_bytes_per_s) &&
                       backup_bytes_per_s > 0,
                   "cost_model::set_host_link: bandwidths must be positive, finite numbers of bytes/s, got ",
                   load_bytes_per_s, " and ", backup_bytes_per_s);
    io_.load_bytes_per_s[std::size_t(tier::host)] = load_bytes_per_s;
    io_.backup_bytes_per_s = backup_bytes_per_s;
    set_ |= host_set;
  }

  /**
   * @brief This model with the rates `other` was given through `set_file_tier`, `set_remote_tier`
   *        and `set_host_link` (the others unchanged). A controller given an empty model (the
   *        default `controller_options`) fills it from its geometry this way, keeping what the
   *        engine measured and set on it.
   */
  [[nodiscard]] cost_model with_rates_set_on(cost_model const& other) const
  {
    cost_model m = *this;
    constexpr auto f = std::size_t(tier::file), r = std::size_t(tier::remote), h = std::size_t(tier::host);
    if (other.set_ & file_set) { m.set_file_tier(other.io_.load_bytes_per_s[f], other.io_.store_bytes_per_s[f]); }
    if (other.set_ & remote_set) {
      m.set_remote_tier(other.io_.load_bytes_per_s[r], other.io_.store_bytes_per_s[r], other.io_.load_latency_s[r]);
    }
    if (other.set_ & host_set) { m.set_host_link(other.io_.load_bytes_per_s[h], other.io_.backup_bytes_per_s); }
    return m;
  }

 private:
  /// The PCIe leg of a record tier's bytes: from the host staging into the device pool, one
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
  static constexpr unsigned file_set = 1, remote_set = 2, host_set = 4;
  unsigned set_ = 0;  // which of the setters gave this model its rates (`with_rates_set_on`)
};

}  // namespace strata
