// SPDX-License-Identifier: Apache-2.0
/**
 * @file transfer/choice.hpp
 * @brief Choosing how to move a plan from measured costs and from what the GPU is doing.
 *
 * No mechanism wins everywhere (measured on the H200, see docs/benchmarks.md): SM copies reach the
 * link on any block size at no CPU cost but slow memory-bound decode; batched DMA costs the GPU
 * nearly nothing but a CPU thread, and collapses on small blocks. `choose_transfer` weighs each
 * option's measured bandwidth, interference and CPU time for the situation at hand.
 */
#pragma once

#include <strata/error.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <span>
#include <string>

namespace strata {

/// @brief The backends a `gpu_executor` chooses from (the order of its option tables).
enum class gpu_backend : std::uint8_t {
  gpu_assisted = 0,  ///< SM copy kernels (`default_load_config` for loads, `default_backup_config` for copies)
  dma_batch = 1,     ///< the copy engine through `cudaMemcpyBatchAsync` (from a `submit_thread` by default)
  staged = 2,        ///< whole records by the copy engine, relayed by a kernel (needs a record layout on one side)
};
/// @brief Number of `gpu_backend` values.
inline constexpr std::size_t gpu_backend_count = 3;
/// @brief Name of a backend, for reports.
constexpr char const* to_string(gpu_backend b) noexcept
{
  constexpr char const* names[] = {"gpu_assisted", "dma_batch", "staged"};
  return static_cast<std::size_t>(b) < gpu_backend_count ? names[static_cast<std::size_t>(b)] : "?";
}

/// @brief What the GPU is doing while a transfer runs.
enum class gpu_activity {
  idle,     ///< nothing: only the transfer's own speed matters
  prefill,  ///< compute-bound GEMMs (prefill): SM copies cost waves, DMA is nearly free
  decode,   ///< memory-bound decode steps: in-flight host reads from SMs slow them down
};

/// @brief Number of `gpu_activity` values, for per-activity tables.
inline constexpr std::size_t gpu_activity_count = 3;

/**
 * @brief Measured costs of one way of moving pages (a backend with its quota and split), for one
 *        block size class.
 */
struct transfer_option {
  std::string name;  ///< e.g. "gpu_assisted/2", "dma_batch/1024 (submit thread)", "split/0.5"
  /// Load bandwidth in GB/s while the GPU does each `gpu_activity` (index by the enum).
  double gbps[gpu_activity_count]{};
  /// Fractional slowdown of the concurrent compute for each activity (0.08 = 8% slower; idle: 0).
  double slowdown[gpu_activity_count]{};
  /// CPU milliseconds the engine's thread spends per GiB moved (0 with a submit thread).
  double caller_cpu_ms_per_gib = 0;
};

/// @brief The transfer to place.
struct transfer_situation {
  gpu_activity activity = gpu_activity::idle;  ///< what runs beside it
  double bytes = 0;                            ///< bytes to move
  double compute_ms = 0;                       ///< duration of the concurrent compute when alone (0 when idle)
  /// Milliseconds of delay each millisecond of the engine thread's CPU costs (1: the engine thread
  /// is on the critical path; 0: it has time to spare).
  double cpu_weight = 1;
};

/// @brief The prediction for one option.
struct transfer_prediction {
  double transfer_ms;  ///< bytes over the option's bandwidth beside the activity
  double compute_ms;   ///< the concurrent compute, slowed down
  double cpu_ms;       ///< the engine thread's CPU time
  double makespan_ms;  ///< time until both transfer and compute are done, plus weighted CPU time
};

/**
 * @brief Predicted makespan of `option` in `situation`:
 *        `max(bytes / gbps, compute_ms * (1 + slowdown)) + cpu_weight * cpu_ms`.
 * @throw strata::invalid_argument for a non-positive bandwidth, a negative slowdown or CPU cost, or
 *        a situation with negative bytes, compute time or CPU weight
 */
inline transfer_prediction predict(transfer_option const& option, transfer_situation const& situation)
{
  auto const a = static_cast<std::size_t>(situation.activity);
  STRATA_EXPECTS(a < gpu_activity_count, "predict: unknown gpu_activity ", a);
  STRATA_EXPECTS(situation.bytes >= 0 && situation.compute_ms >= 0 && situation.cpu_weight >= 0,
                 "predict: bytes, compute_ms and cpu_weight must not be negative (got ", situation.bytes, ", ",
                 situation.compute_ms, ", ", situation.cpu_weight, ")");
  STRATA_EXPECTS(option.gbps[a] > 0, "predict: option ", option.name, " has no positive bandwidth for activity ", a);
  STRATA_EXPECTS(option.slowdown[a] >= 0 && option.caller_cpu_ms_per_gib >= 0, "predict: option ", option.name,
                 " has a negative slowdown or CPU cost");
  transfer_prediction p{};
  p.transfer_ms = situation.bytes / (option.gbps[a] * 1e9) * 1e3;
  p.compute_ms = situation.compute_ms * (1 + option.slowdown[a]);
  p.cpu_ms = option.caller_cpu_ms_per_gib * situation.bytes / double(1 << 30);
  p.makespan_ms = (p.transfer_ms > p.compute_ms ? p.transfer_ms : p.compute_ms) + situation.cpu_weight * p.cpu_ms;
  return p;
}

/**
 * @brief Index of the option with the smallest predicted makespan (the first, on ties).
 * @throw strata::invalid_argument for an empty list, or what `predict` rejects
 */
inline std::size_t choose_transfer(std::span<transfer_option const> options, transfer_situation const& situation)
{
  STRATA_EXPECTS(!options.empty(), "choose_transfer: no options to choose from");
  std::size_t best = 0;
  double best_ms = std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < options.size(); ++i) {
    double const ms = predict(options[i], situation).makespan_ms;
    if (ms < best_ms) {
      best_ms = ms;
      best = i;
    }
  }
  return best;
}

/**
 * @brief What a DMA descriptor costs the thread that enqueues it, as observed: a batched DMA's rate
 *        on small blocks is capped by it (`gpu_executor_config::dma_descriptor_us`), and it grows
 *        when that thread contends with the engine's own kernel launches for the driver (a
 *        launch-heavy eager forward; a CUDA-graph engine launches little). Starts at the configured
 *        (or calibrated) figure; each window of at least `window` descriptors moves the estimate a
 *        quarter of the way to the window's mean; each choice that did not use DMA (`relax`) moves
 *        it 1/16 of the way back to the configured figure, so a backend once slowed by a busy engine
 *        thread is tried again, and measured again, after a few dozen transfers. Thread-safe.
 */
class descriptor_cost {
 public:
  /// @throw strata::invalid_argument for a non-positive figure or window
  explicit descriptor_cost(double configured_us, std::int64_t window = 256)
      : configured_{configured_us}, us_{configured_us}, window_{window}
  {
    STRATA_EXPECTS(configured_us > 0 && window > 0, "descriptor_cost: the figure and the window must be positive (got ",
                   configured_us, ", ", window, ")");
  }
  /// @brief `descriptors` enqueued in `host_us` of the enqueuing thread's time.
  void observe(std::int64_t descriptors, double host_us)
  {
    if (descriptors <= 0 || !(host_us >= 0)) { return; }
    std::lock_guard lock{m_};
    pending_descriptors_ += descriptors;
    pending_us_ += host_us;
    if (pending_descriptors_ >= window_) {
      us_ += (pending_us_ / double(pending_descriptors_) - us_) / 4;
      pending_descriptors_ = 0;
      pending_us_ = 0;
    }
  }
  /// @brief A choice that did not use DMA: the estimate moves back toward the configured figure.
  void relax()
  {
    std::lock_guard lock{m_};
    us_ += (configured_ - us_) / 16;
  }
  /// @brief A new configured figure (a calibration): the estimate starts from it.
  void reset(double configured_us)
  {
    std::lock_guard lock{m_};
    configured_ = us_ = configured_us;
    pending_descriptors_ = 0;
    pending_us_ = 0;
  }
  /// @brief The current estimate, µs per descriptor.
  [[nodiscard]] double us() const
  {
    std::lock_guard lock{m_};
    return us_;
  }

 private:
  mutable std::mutex m_;
  double configured_, us_;
  std::int64_t window_;
  std::int64_t pending_descriptors_ = 0;
  double pending_us_ = 0;
};

}  // namespace strata
