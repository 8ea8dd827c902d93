// SPDX-License-Identifier: Apache-2.0
/**
 * @file cuda.cuh
 * @brief RAII owners of CUDA events, streams and allocations (as RMM ships `cuda_stream` and
 *        `device_buffer`): what strata's device parts use, public so that engines, examples and
 *        benchmarks need no `detail::`. Each owner is movable, not copyable; destructors never throw.
 */
#pragma once

#include <strata/config.hpp>
#include <strata/error.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace strata {

namespace detail {
/**
 * @brief The driver's `symbol` as of `version`, or null where the driver lacks it. The thread's
 *        CUDA error is cleared only if this query itself failed: an error the engine's own work
 *        left pending stays for the engine to find.
 */
inline void* driver_entry_point(char const* symbol, int version) noexcept
{
  void* f = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion(symbol, &f, version, cudaEnableDefault, &q) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return q == cudaDriverEntryPointSuccess ? f : nullptr;
}
}  // namespace detail

/// @brief An owned CUDA event (timing disabled unless asked): cheap to record and wait on.
class cuda_event {
 public:
  explicit cuda_event(bool timing = false)
  { STRATA_CUDA_TRY(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming)); }
  cuda_event(cuda_event&& o) noexcept : event_{std::exchange(o.event_, nullptr)} {}
  cuda_event& operator=(cuda_event&& o) noexcept
  {
    std::swap(event_, o.event_);
    return *this;
  }
  cuda_event(cuda_event const&) = delete;
  cuda_event& operator=(cuda_event const&) = delete;
  ~cuda_event()
  {
    if (event_ != nullptr) { STRATA_ASSERT_CUDA_SUCCESS(cudaEventDestroy(event_)); }
  }
  [[nodiscard]] cudaEvent_t get() const noexcept { return event_; }
  void record(cudaStream_t s) const { STRATA_CUDA_TRY(cudaEventRecord(event_, s)); }

 private:
  cudaEvent_t event_{};
};

/// @brief An owned non-blocking CUDA stream.
class cuda_stream {
 public:
  explicit cuda_stream(int priority = 0)
  { STRATA_CUDA_TRY(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority)); }
  cuda_stream(cuda_stream&& o) noexcept : stream_{std::exchange(o.stream_, nullptr)} {}
  cuda_stream& operator=(cuda_stream&& o) noexcept
  {
    std::swap(stream_, o.stream_);
    return *this;
  }
  cuda_stream(cuda_stream const&) = delete;
  cuda_stream& operator=(cuda_stream const&) = delete;
  ~cuda_stream()
  {
    if (stream_ != nullptr) { STRATA_ASSERT_CUDA_SUCCESS(cudaStreamDestroy(stream_)); }
  }
  [[nodiscard]] cudaStream_t get() const noexcept { return stream_; }

 private:
  cudaStream_t stream_{};
};

/// @brief Device memory from `cudaMalloc`; throws `strata::out_of_memory` naming the size.
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(std::size_t bytes) : bytes_{bytes}
  {
    if (bytes == 0) { return; }
    cudaError_t const e = cudaMalloc(&data_, bytes);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      std::size_t free = 0, total = 0;
      (void)cudaMemGetInfo(&free, &total);
      throw out_of_memory(detail::concat("strata: cudaMalloc of ", bytes, " bytes failed (", cudaGetErrorName(e), "); ",
                                         free, " of ", total, " bytes free"));
    }
  }
  device_buffer(device_buffer&& o) noexcept : data_{std::exchange(o.data_, nullptr)}, bytes_{std::exchange(o.bytes_, 0)}
  {
  }
  device_buffer& operator=(device_buffer&& o) noexcept
  {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  device_buffer(device_buffer const&) = delete;
  device_buffer& operator=(device_buffer const&) = delete;
  ~device_buffer()
  {
    if (data_ != nullptr) { STRATA_ASSERT_CUDA_SUCCESS(cudaFree(data_)); }
  }
  [[nodiscard]] std::byte* data() const noexcept { return static_cast<std::byte*>(data_); }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }

 private:
  void* data_{};
  std::size_t bytes_{};
};

/// @brief Pinned, device-mapped host memory from `cudaHostAlloc`; throws `strata::out_of_memory`.
class pinned_buffer {
 public:
  pinned_buffer() = default;
  explicit pinned_buffer(std::size_t bytes) : bytes_{bytes}
  {
    if (bytes == 0) { return; }
    cudaError_t const e = cudaHostAlloc(&data_, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      throw out_of_memory(
          detail::concat("strata: cudaHostAlloc of ", bytes, " pinned bytes failed (", cudaGetErrorName(e), ")"));
    }
  }
  pinned_buffer(pinned_buffer&& o) noexcept : data_{std::exchange(o.data_, nullptr)}, bytes_{std::exchange(o.bytes_, 0)}
  {
  }
  pinned_buffer& operator=(pinned_buffer&& o) noexcept
  {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  pinned_buffer(pinned_buffer const&) = delete;
  pinned_buffer& operator=(pinned_buffer const&) = delete;
  ~pinned_buffer()
  {
    if (data_ != nullptr) { STRATA_ASSERT_CUDA_SUCCESS(cudaFreeHost(data_)); }
  }
  [[nodiscard]] std::byte* data() const noexcept { return static_cast<std::byte*>(data_); }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }

 private:
  void* data_{};
  std::size_t bytes_{};
};

namespace detail {
/// @brief Whether `s` is a default stream (legacy or per-thread): not a handle of one device, but
///        the default stream of whichever device is current where it is used.
inline bool is_default_stream(cudaStream_t s) noexcept
{ return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread; }

/// @brief Throws `strata::invalid_argument` naming `who` unless `device` is a visible CUDA device.
inline void require_device(int device, char const* who)
{
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) { (void)cudaGetLastError(); }
  STRATA_EXPECTS(device >= 0 && device < count, who, ": CUDA device ", device, " does not exist (", count, " visible)");
}
}  // namespace detail

/**
 * @brief Makes `device` current on this thread for the scope, and the previous device current
 *        again at its end (as an engine expects its own device to stay current across strata's calls).
 *        Costs two driver queries when the device is already current, no switch.
 */
class device_scope {
 public:
  /// @throw strata::invalid_argument for a device that does not exist; strata::cuda_error when the switch fails
  explicit device_scope(int device)
  {
    detail::require_device(device, "device_scope");
    STRATA_CUDA_TRY(cudaGetDevice(&previous_));
    if (previous_ != device) {
      STRATA_CUDA_TRY(cudaSetDevice(device));
      switched_ = true;
    }
  }
  device_scope(device_scope const&) = delete;
  device_scope& operator=(device_scope const&) = delete;
  ~device_scope()
  {
    if (switched_ && cudaSetDevice(previous_) != cudaSuccess) { (void)cudaGetLastError(); }
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};

/// @brief The device current on this thread.
inline int current_device()
{
  int device = 0;
  STRATA_CUDA_TRY(cudaGetDevice(&device));
  return device;
}

/// @brief Multiprocessors of the current device.
inline int sm_count()
{
  int device = 0, sms = 0;
  STRATA_CUDA_TRY(cudaGetDevice(&device));
  STRATA_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

}  // namespace strata
