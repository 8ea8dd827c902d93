// SPDX-License-Identifier: Apache-2.0
/**
 * @file transfer/sm_partition.cuh
 * @brief Green contexts: the device's SMs split into a partition for strata's copy kernels and one
 *        for the engine's kernels, each with its own stream.
 *
 * The other way to keep copies and compute apart is the SM count target (`sms_left_for_compute` ->
 * `cublasSetSmCountTarget`): the copy kernels take their CTAs' SMs and the engine sizes its grids to
 * the rest. A partition enforces it for every kernel, the engine's own included, at the driver's
 * granularity (on sm_90 the driver may round a partition up, see `copy_sms()`).
 */
#pragma once

#include <strata/cuda.cuh>

#include <cuda.h>  // types only: the driver entry points are resolved at run time, not linked
#include <cudaTypedefs.h>

#include <type_traits>
#include <utility>

namespace strata {
namespace detail {

/// @brief The driver's green-context entry points, as the running driver offers them, each at
///        the ABI version its typedef names (so a later toolkit's signature change cannot slip in).
struct green_entry_points {
  PFN_cuDeviceGet_v2000 device_get{};
  PFN_cuDeviceGetDevResource_v12040 device_resource{};
  PFN_cuDevSmResourceSplitByCount_v12040 split_by_count{};
  PFN_cuDevResourceGenerateDesc_v12040 generate_desc{};
  PFN_cuGreenCtxCreate_v12040 create{};
  PFN_cuGreenCtxDestroy_v12040 destroy{};
  PFN_cuGreenCtxStreamCreate_v12050 stream_create{};
  PFN_cuStreamSynchronize_v2000 stream_synchronize{};
  PFN_cuStreamDestroy_v4000 stream_destroy{};
  PFN_cuGetErrorName_v6000 error_name{};
  PFN_cuStreamGetGreenCtx_v12040 stream_green_ctx{};  ///< optional: not part of `available()`

  [[nodiscard]] bool available() const noexcept
  {
    return device_get && device_resource && split_by_count && generate_desc && create && destroy && stream_create &&
           stream_synchronize && stream_destroy && error_name;
  }

  /// @brief Resolves the entry points once per process (all null where the driver lacks them).
  static green_entry_points const& get()
  {
    static green_entry_points const points = [] {
      green_entry_points p;
      auto resolve = [](char const* symbol, int version, auto& fn) {
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(driver_entry_point(symbol, version));
      };
      resolve("cuDeviceGet", 2000, p.device_get);
      resolve("cuDeviceGetDevResource", 12040, p.device_resource);
      resolve("cuDevSmResourceSplitByCount", 12040, p.split_by_count);
      resolve("cuDevResourceGenerateDesc", 12040, p.generate_desc);
      resolve("cuGreenCtxCreate", 12040, p.create);
      resolve("cuGreenCtxDestroy", 12040, p.destroy);
      resolve("cuGreenCtxStreamCreate", 12050, p.stream_create);
      resolve("cuStreamSynchronize", 2000, p.stream_synchronize);
      resolve("cuStreamDestroy", 4000, p.stream_destroy);
      resolve("cuGetErrorName", 6000, p.error_name);
      resolve("cuStreamGetGreenCtx", 12040, p.stream_green_ctx);
      return p;
    }();
    return points;
  }

  /// @brief Throws `strata::cuda_error` naming the driver call if it failed.
  void check(CUresult r, char const* call) const
  {
    if (r == CUDA_SUCCESS) { return; }
    char const* name = "unknown";
    if (error_name != nullptr) { (void)error_name(r, &name); }
    throw cuda_error(concat("strata: CUDA driver call ", call, " failed: ", name, " (", int(r), ")"));
  }
};

/// @brief The green context `stream` belongs to, or null (a plain stream, the legacy stream, or a
///        driver without green contexts).
inline CUgreenCtx green_context_of(cudaStream_t stream) noexcept
{
  auto const& api = green_entry_points::get();
  if (api.stream_green_ctx == nullptr || is_default_stream(stream)) { return nullptr; }
  CUgreenCtx ctx{};
  if (api.stream_green_ctx(reinterpret_cast<CUstream>(stream), &ctx) != CUDA_SUCCESS) { return nullptr; }
  return ctx;
}

/**
 * @brief An owned non-blocking stream at a given priority, in a given green context (its kernels
 *        run on that partition's SMs) or, for a null context, in the device's primary context.
 */
class context_stream {
 public:
  context_stream() = default;
  /// @throw strata::cuda_error if the stream cannot be created
  context_stream(CUgreenCtx ctx, int priority) : ctx_{ctx}, priority_{priority}
  {
    if (ctx == nullptr) {
      STRATA_CUDA_TRY(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority));
      return;
    }
    auto const& api = green_entry_points::get();
    STRATA_EXPECTS_AS(cuda_error, api.stream_create != nullptr && api.stream_destroy != nullptr,
                      "the CUDA driver has no cuGreenCtxStreamCreate");
    CUstream s{};
    api.check(api.stream_create(&s, ctx, CU_STREAM_NON_BLOCKING, priority), "cuGreenCtxStreamCreate");
    stream_ = reinterpret_cast<cudaStream_t>(s);
  }
  /// @brief A stream like `caller`: in its green context (if any), at `priority`.
  static context_stream like(cudaStream_t caller, int priority) { return {green_context_of(caller), priority}; }

  context_stream(context_stream&& o) noexcept
      : stream_{std::exchange(o.stream_, nullptr)}, ctx_{std::exchange(o.ctx_, nullptr)}, priority_{o.priority_}
  {
  }
  context_stream& operator=(context_stream&& o) noexcept
  {
    std::swap(stream_, o.stream_);
    std::swap(ctx_, o.ctx_);
    std::swap(priority_, o.priority_);
    return *this;
  }
  context_stream(context_stream const&) = delete;
  context_stream& operator=(context_stream const&) = delete;
  /// @brief Destroys the stream (work already queued still runs; callers wait first where needed).
  ~context_stream()
  {
    if (stream_ == nullptr) { return; }
    if (ctx_ == nullptr) {
      STRATA_ASSERT_CUDA_SUCCESS(cudaStreamDestroy(stream_));
    } else {
      (void)green_entry_points::get().stream_destroy(reinterpret_cast<CUstream>(stream_));
    }
  }

  [[nodiscard]] cudaStream_t get() const noexcept { return stream_; }
  [[nodiscard]] CUgreenCtx context() const noexcept { return ctx_; }
  [[nodiscard]] int priority() const noexcept { return priority_; }
  /// @brief Whether this stream was made for (`ctx`, `priority`).
  [[nodiscard]] bool matches(CUgreenCtx ctx, int priority) const noexcept
  { return stream_ != nullptr && ctx == ctx_ && priority == priority_; }

 private:
  cudaStream_t stream_{};
  CUgreenCtx ctx_{};
  int priority_{};
};

}  // namespace detail

/**
 * @brief Two green contexts over disjoint SMs of one device: `copy_stream()` for strata's copy
 *        kernels (`gpu_assisted`, `staged` relays), `compute_stream()` for the engine's kernels.
 *
 * Memory is shared with the device's primary context: pools and plans work unchanged on either
 * stream, and events of one stream can be waited on by the other (`wait_layer`). Kernels launched on
 * `compute_stream()` never run on the copy partition's SMs; a library that sizes its grids from the
 * device's SM count (cuBLAS) should still be told `compute_sms()` (`cublasSetSmCountTarget`), or its
 * grids run an extra wave. Not copyable or movable: hold it by `std::optional` or a pointer.
 */
class sm_partition {
 public:
  /// @brief Whether the running driver offers green contexts with streams (CUDA 12.5 and later).
  [[nodiscard]] static bool supported() noexcept { return detail::green_entry_points::get().available(); }

  /**
   * @param copy_sms SMs asked for the copy partition: the driver grants at least this many, rounded
   *        up to its partition granularity (`copy_sms()` says what it granted)
   * @param device CUDA device ordinal; -1: the current device
   * @param copy_priority, compute_priority priorities of the two streams (`cudaDeviceGetStreamPriorityRange`)
   * @throw strata::invalid_argument if `copy_sms` is not positive, or it (as the driver rounds it)
   *        leaves no SM to compute
   * @throw strata::cuda_error if the driver has no green contexts or a driver call fails
   */
  explicit sm_partition(int copy_sms, int device = -1, int copy_priority = 0, int compute_priority = 0)
  {
    STRATA_EXPECTS(copy_sms > 0, "sm_partition: copy_sms must be positive, got ", copy_sms);
    auto const& api = detail::green_entry_points::get();
    STRATA_EXPECTS_AS(cuda_error, api.available(),
                      "sm_partition: the CUDA driver has no green contexts with streams (needs CUDA 12.5 or later)");
    if (device < 0) { STRATA_CUDA_TRY(cudaGetDevice(&device)); }
    STRATA_CUDA_TRY(cudaInitDevice(device, 0, 0));  // the primary context, which the green ones share
    CUdevice dev{};
    api.check(api.device_get(&dev, device), "cuDeviceGet");
    CUdevResource all{};
    api.check(api.device_resource(dev, &all, CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource");
    STRATA_EXPECTS(unsigned(copy_sms) < all.sm.smCount, "sm_partition: copy_sms (", copy_sms,
                   ") must leave SMs to compute: the device has ", all.sm.smCount);
    CUdevResource copy{}, rest{};
    unsigned groups = 1;
    // Finest granularity first (SMs not co-scheduled on one cluster); drivers without the flag refuse it.
    CUresult r = api.split_by_count(&copy, &groups, &all, &rest, CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING,
                                    unsigned(copy_sms));
    if (r != CUDA_SUCCESS) {
      groups = 1;
      r = api.split_by_count(&copy, &groups, &all, &rest, 0, unsigned(copy_sms));
    }
    api.check(r, "cuDevSmResourceSplitByCount");
    STRATA_EXPECTS_AS(cuda_error, groups == 1, "sm_partition: cuDevSmResourceSplitByCount made ", groups, " groups of ",
                      copy_sms, " SMs, not one");
    STRATA_EXPECTS(rest.sm.smCount > 0, "sm_partition: the driver rounds a partition of ", copy_sms, " SMs up to ",
                   copy.sm.smCount, ", which leaves no SM to compute (device: ", all.sm.smCount, " SMs)");
    copy_sms_ = int(copy.sm.smCount);
    compute_sms_ = int(rest.sm.smCount);
    try {
      create(api, dev, copy, copy_priority, copy_ctx_, copy_stream_);
      create(api, dev, rest, compute_priority, compute_ctx_, compute_stream_);
    } catch (...) {
      release();
      throw;
    }
  }

  sm_partition(sm_partition const&) = delete;
  sm_partition& operator=(sm_partition const&) = delete;
  /// @brief Waits for the work queued on both streams, then destroys them and the contexts.
  ~sm_partition() { release(); }

  /// @brief Stream of the copy partition: pass it to `submit` for loads and backups.
  [[nodiscard]] cudaStream_t copy_stream() const noexcept { return reinterpret_cast<cudaStream_t>(copy_stream_); }
  /// @brief Stream of the rest of the device: the engine's kernels.
  [[nodiscard]] cudaStream_t compute_stream() const noexcept { return reinterpret_cast<cudaStream_t>(compute_stream_); }
  /// @brief SMs the driver granted to the copy partition (at least the count asked).
  [[nodiscard]] int copy_sms() const noexcept { return copy_sms_; }
  /// @brief SMs left to compute: pass it to `cublasSetSmCountTarget`.
  [[nodiscard]] int compute_sms() const noexcept { return compute_sms_; }

 private:
  static void create(detail::green_entry_points const& api, CUdevice dev, CUdevResource resource, int priority,
                     CUgreenCtx& ctx, CUstream& stream)
  {
    CUdevResourceDesc desc{};
    api.check(api.generate_desc(&desc, &resource, 1), "cuDevResourceGenerateDesc");
    api.check(api.create(&ctx, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate");
    api.check(api.stream_create(&stream, ctx, CU_STREAM_NON_BLOCKING, priority), "cuGreenCtxStreamCreate");
  }

  void release() noexcept
  {
    auto const& api = detail::green_entry_points::get();
    for (CUstream* s : {&copy_stream_, &compute_stream_}) {
      if (*s != nullptr) { (void)api.stream_synchronize(*s), (void)api.stream_destroy(*s), *s = nullptr; }
    }
    for (CUgreenCtx* c : {&copy_ctx_, &compute_ctx_}) {
      if (*c != nullptr) { (void)api.destroy(*c), *c = nullptr; }
    }
  }

  CUgreenCtx copy_ctx_{}, compute_ctx_{};
  CUstream copy_stream_{}, compute_stream_{};
  int copy_sms_ = 0, compute_sms_ = 0;
};

}  // namespace strata
