// SPDX-License-Identifier: Apache-2.0
// The GPU controllers of the Python module (see gpu.hpp). Compiled by nvcc without nanobind.
#include "gpu.hpp"

#include <strata/cache/gpu_executor.cuh>

#include "controller_impl.hpp"

namespace strata::python {
namespace {

struct gpu_hooks {
  static constexpr char const* name = "gpu";
  static cudaStream_t to_stream(std::uintptr_t stream) { return reinterpret_cast<cudaStream_t>(stream); }
  static bool wait_layer(gpu_executor const&, load_handle<transfer_handle> const& h, std::int64_t layer,
                         std::uintptr_t stream)
  {
    return strata::wait_layer(h, layer, cuda::stream_ref{to_stream(stream)});
  }
  static void wait_after(prefill_result<transfer_handle> const& r, std::uintptr_t stream)
  {
    for (auto const& h : r.after) {
      if (h.valid() && !h.failed()) { h.wait(cuda::stream_ref{to_stream(stream)}); }
    }
  }
  static void set_activity(gpu_executor& e, int activity, double compute_ms)
  {
    e.set_activity(gpu_activity(activity), compute_ms);
  }
  static void synchronize(gpu_executor& e) { e.synchronize(); }
  static executor_stats stats(gpu_executor const& e)
  {
    gpu_executor_stats const s = e.stats();
    executor_stats out;
    for (std::size_t k = 0; k < 2; ++k) {
      for (std::size_t b = 0; b < gpu_backend_count; ++b) {
        out.transfers[k][b] = s.transfers[k][b];
        out.bytes[k][b] = s.bytes[k][b];
      }
    }
    out.failed_submissions = s.failed_submissions;
    return out;
  }
};

gpu_executor_config executor_config(gpu_options const& o)
{
  gpu_executor_config c;
  if (o.force) {
    STRATA_EXPECTS(*o.force >= 0 && *o.force < int(gpu_backend_count), "gpu_options: force must be 0 (gpu_assisted), ",
                   "1 (dma_batch) or 2 (staged), got ", *o.force);
    c.force = gpu_backend(*o.force);
  }
  c.staged_loads = o.staged_loads;
  c.dma_submit_thread = o.dma_submit_thread;
  c.cpu_weight = o.cpu_weight;
  c.load_stream = reinterpret_cast<cudaStream_t>(o.load_stream);
  c.copy_stream = reinterpret_cast<cudaStream_t>(o.copy_stream);
  return c;
}

}  // namespace

std::unique_ptr<controller_api> make_gpu_controller(layer_first_table const& pool, std::int64_t host_pages,
                                                    controller_options const& options, gpu_options const& gpu,
                                                    file_store* file)
{
  pinned_pool_options pinned;
  pinned.allocation = gpu.registered_host_memory ? pinned_allocation::registered : pinned_allocation::host_alloc;
  kv_geometry const g = pool.geometry();
  if (file != nullptr) {
    using controller = cache_controller<gpu_policies<layer_first_table, file_store&>>;
    return std::make_unique<controller_impl<controller, gpu_hooks>>(
        controller::tiers_type{device_pool<layer_first_table>{pool}, pinned_host_pool{g, host_pages, pinned}, *file},
        options, strata_scheduler{}, gpu_executor{executor_config(gpu)});
  }
  using controller = cache_controller<gpu_policies<layer_first_table>>;
  return std::make_unique<controller_impl<controller, gpu_hooks>>(
      controller::tiers_type{device_pool<layer_first_table>{pool}, pinned_host_pool{g, host_pages, pinned}}, options,
      strata_scheduler{}, gpu_executor{executor_config(gpu)});
}

int cuda_device_count() noexcept
{
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace strata::python
