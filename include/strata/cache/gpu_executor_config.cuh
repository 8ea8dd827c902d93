// SPDX-License-Identifier: Apache-2.0
/**
 * @file cache/gpu_executor_config.cuh
 * @brief What a `gpu_executor` is configured with and reports: its settings (device, forced backend,
 *        cost tables, backends' tuning, streams), its transfer counts, and what `warm_up` measured.
 */
#pragma once

#include <strata/presets/h200.hpp>
#include <strata/transfer/choice.hpp>
#include <strata/transfer/dma_batch.cuh>
#include <strata/transfer/gpu_assisted.cuh>
#include <strata/transfer/staged.cuh>

#include <cuda/stream_ref>

#include <array>
#include <cstdint>
#include <optional>

namespace strata {

/// @brief Settings of a `gpu_executor` (defaults: the H200's measured costs, automatic choice).
struct gpu_executor_config {
  /// The device the executor copies on: its streams, backends, staging, submit and record threads
  /// live there, and it makes it current for each of its calls (the caller's current device is
  /// restored after). None: the device current when the executor is constructed.
  std::optional<int> device{};
  /// Use this backend for every transfer (tests, benchmarks); none: choose per transfer. A forced
  /// `staged` falls back to the choice for a direction without a record layout on either side.
  std::optional<gpu_backend> force{};
  /// Costs of each backend for loads (`copy_kind::load`), indexed by `gpu_backend`.
  std::array<transfer_option, gpu_backend_count> load_options = h200::load_options();
  /// Costs of each backend for backups and demotions (`copy_kind::background`).
  std::array<transfer_option, gpu_backend_count> copy_options = h200::copy_options();
  /// CPU microseconds per `dma_batch` descriptor (~0.5 on the H200's host): caps its bandwidth at
  /// `descriptor bytes / descriptor time`, which makes it lose on small blocks (a TP shard's 8 KiB
  /// blocks), and is its caller CPU cost when it runs on the engine's thread. The starting figure:
  /// the choice follows what enqueues then take (`descriptor_cost`: more while the engine's thread
  /// launches kernels of its own), and `warm_up` replaces it with the time measured alone.
  double dma_descriptor_us = 0.5;
  /// `transfer_situation::cpu_weight`: what a millisecond of the engine thread's CPU costs.
  double cpu_weight = 1;
  /// Let the automatic choice use `staged` for loads. It records every layer's event when the whole
  /// transfer ends, so a batch's layers cannot start under its own loads: off by default.
  bool staged_loads = false;
  /// Submit `dma_batch` transfers from a `submit_thread` (the engine's thread spends ~nothing); false:
  /// on the calling thread (~0.5 µs per descriptor, while the controller's lock is held).
  bool dma_submit_thread = true;
  gpu_assisted_config load_kernel = default_load_config;    ///< copy-kernel quota for loads
  gpu_assisted_config copy_kernel = default_backup_config;  ///< copy-kernel quota for backups, demotions
  dma_batch_config dma{};                                   ///< `dma_batch` tuning
  staged_config staged{};                                   ///< `staged` tuning
  /// Pinned staging of each record thread (loads, background copies: each has its own, allocated
  /// at its first use) for records moving between a record store (a file tier) and the device, in
  /// bytes: two halves alternate, so that the next chunk of records is read (or written) while the
  /// previous one crosses PCIe. A chunk holds at least one page (the staging grows to two pages).
  std::int64_t record_staging_bytes = std::int64_t{64} << 20;
  /// Stream the loads are issued on (e.g. an `sm_partition::copy_stream()`); none: the executor's
  /// own, at the highest stream priority. `dma_batch` copies made through the submit thread
  /// (`dma_submit_thread`) run on that thread's streams instead.
  std::optional<cuda::stream_ref> load_stream{};
  /// Stream backups and demotions are issued on; none: the executor's own, at the lowest priority.
  std::optional<cuda::stream_ref> copy_stream{};
};

/// @brief What `gpu_executor::warm_up` measured on this machine and put into its choice (0: not measured).
struct gpu_calibration {
  std::array<double, gpu_backend_count> load_gbps{};  ///< host -> device, consecutive pages, GB/s, by backend
  std::array<double, gpu_backend_count> copy_gbps{};  ///< device -> host, GB/s, by backend
  double dma_descriptor_us = 0;                       ///< host time per `dma_batch` descriptor (scattered pages)
};

/// @brief Transfers a `gpu_executor` issued, by kind (`copy_kind`) and backend (`gpu_backend`).
struct gpu_executor_stats {
  std::array<std::array<std::int64_t, gpu_backend_count>, 2> transfers{};  ///< [kind][backend]
  std::array<std::array<std::int64_t, gpu_backend_count>, 2> bytes{};      ///< [kind][backend]
  std::int64_t failed_submissions = 0;                                     ///< submissions refused
  /// What a `dma_batch` descriptor costs its enqueuing thread as observed now (`descriptor_cost`), µs.
  double dma_descriptor_us = 0;
};

}  // namespace strata
