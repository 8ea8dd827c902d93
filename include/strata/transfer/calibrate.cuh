// SPDX-License-Identifier: Apache-2.0
/**
 * @file transfer/calibrate.cuh
 * @brief Measuring a backend on this machine: the rate a plan moves at and the host time its
 *        enqueue costs, for tables measured elsewhere (the H200's) to be put to the local link.
 */
#pragma once

#include <strata/cuda.cuh>
#include <strata/transfer/copy_plan.hpp>

#include <algorithm>
#include <chrono>
#include <span>
#include <vector>

namespace strata {

/// @brief What `measure_transfer` found (medians).
struct transfer_measurement {
  double gbps = 0;        ///< bytes of the plan over the device time of one copy, GB/s
  double enqueue_us = 0;  ///< host time of one `enqueue` call, µs
  std::int64_t runs = 0;  ///< contiguous runs of the plan (`for_each_run`): what DMA descriptors it takes
};

/**
 * @brief Times `plan` through `backend` on `stream`: one untimed copy first (it loads the kernels
 *        and warms the path), then `reps` timed ones, each waited for; the medians. The device
 *        time runs from an event recorded before the enqueue to one after it, so a backend whose
 *        copies wait for the host to describe them (DMA descriptors) is timed with that wait.
 * @throw strata::invalid_argument for fewer than one repetition; what the backend throws
 */
template <class Backend, kv_layout Src, kv_layout Dst>
transfer_measurement measure_transfer(Backend& backend, copy_plan<Src, Dst> const& plan, cudaStream_t stream,
                                      int reps = 3)
{
  STRATA_EXPECTS(reps >= 1, "measure_transfer: reps must be at least 1, got ", reps);
  validate(plan);
  cuda_event start{true}, stop{true};
  backend.enqueue(plan, stream, {});
  STRATA_CUDA_TRY(cudaStreamSynchronize(stream));
  std::vector<double> device_ms, host_us;
  for (int r = 0; r < reps; ++r) {
    STRATA_CUDA_TRY(cudaEventRecord(start.get(), stream));
    auto const t0 = std::chrono::steady_clock::now();
    backend.enqueue(plan, stream, {});
    auto const t1 = std::chrono::steady_clock::now();
    STRATA_CUDA_TRY(cudaEventRecord(stop.get(), stream));
    STRATA_CUDA_TRY(cudaEventSynchronize(stop.get()));
    float ms = 0;
    STRATA_CUDA_TRY(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    device_ms.push_back(double(ms));
    host_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  auto median = [](std::vector<double>& v) {
    std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  transfer_measurement m;
  double const ms = median(device_ms);
  m.gbps = ms > 0 ? double(plan.bytes()) / (ms * 1e-3) / 1e9 : 0;
  m.enqueue_us = median(host_us);
  for_each_run(plan, [&](copy_run const&) { ++m.runs; });
  return m;
}

}  // namespace strata
