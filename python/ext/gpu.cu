// SPDX-License-Identifier: Apache-2.0
// The GPU controllers of the Python module (see gpu.hpp). Compiled by nvcc without nanobind.
#include "gpu.hpp"

#include <strata/cache/gpu_policies.cuh>
#include <strata/cache/remote_tier.hpp>
#include <strata/tier/pinned_host_pool.cuh>
#include <strata/transfer/dma_copy.cuh>

#include <mutex>
#include <type_traits>

#include "controller_impl.hpp"
#include "text.hpp"

namespace strata::python {
namespace {

struct gpu_hooks {
  static constexpr char const* name = "gpu";
  static cuda::stream_ref to_stream(std::uintptr_t stream) { return reinterpret_cast<cudaStream_t>(stream); }
  static bool wait_layer(gpu_executor const&, load_handle<transfer_handle> const& h, std::int64_t layer,
                         std::uintptr_t stream)
  { return strata::wait_layer(h, layer, to_stream(stream)); }
  static bool wait_after(prefill_result<transfer_handle> const& r, std::uintptr_t stream)
  { return strata::wait_after(r, to_stream(stream)); }
  static void set_activity(gpu_executor& e, int activity, double compute_ms)
  { e.set_activity(gpu_activity(activity), compute_ms); }
  static void synchronize(gpu_executor& e) { e.synchronize(); }
  template <class Tiers>
  static executor_calibration warm_up(gpu_executor& e, Tiers const& tiers)
  {
    gpu_calibration const c = e.warm_up(tiers);
    return {c.load_gbps, c.copy_gbps, c.dma_descriptor_us};
  }
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
    out.dma_descriptor_us = s.dma_descriptor_us;
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
  STRATA_EXPECTS(o.load_ctas > 0, "gpu_options: load_ctas must be positive, got ", o.load_ctas);
  c.device = o.device;
  c.load_kernel.ctas = o.load_ctas;
  c.staged_loads = o.staged_loads;
  c.dma_submit_thread = o.dma_submit_thread;
  c.cpu_weight = o.cpu_weight;
  if (o.load_stream != 0) { c.load_stream = cuda::stream_ref{reinterpret_cast<cudaStream_t>(o.load_stream)}; }
  if (o.copy_stream != 0) { c.copy_stream = cuda::stream_ref{reinterpret_cast<cudaStream_t>(o.copy_stream)}; }
  return c;
}

}  // namespace

std::unique_ptr<controller_api> make_gpu_controller(layer_first_table const& pool, std::int64_t host_pages,
                                                    controller_options const& options, gpu_options const& gpu,
                                                    file_store* file, keyed_store_api* remote)
{
  device_scope const on{gpu.device};  // the host tier's pinned memory and the executor belong to the pool's device
  pinned_pool_options pinned;
  pinned.allocation = gpu.registered_host_memory ? pinned_allocation::registered : pinned_allocation::host_alloc;
  kv_geometry const g = pool.geometry();
  if (remote != nullptr) {  // the store's face: no hiredis code here
    remote_tier<keyed_store_api> tier{*remote, g};
    if (file != nullptr) {
      using controller = cache_controller<
          gpu_policies<layer_first_table, strata_scheduler, file_store&, remote_tier<keyed_store_api>>>;
      return std::make_unique<controller_impl<controller, gpu_hooks>>(
          controller::tiers_type{device_pool<layer_first_table>{pool}, pinned_host_pool{g, host_pages, pinned}, *file,
                                 std::move(tier)},
          options, strata_scheduler{}, gpu_executor{executor_config(gpu)});
    }
    using controller =
        cache_controller<gpu_policies<layer_first_table, strata_scheduler, remote_tier<keyed_store_api>>>;
    return std::make_unique<controller_impl<controller, gpu_hooks>>(
        controller::tiers_type{device_pool<layer_first_table>{pool}, pinned_host_pool{g, host_pages, pinned},
                               std::move(tier)},
        options, strata_scheduler{}, gpu_executor{executor_config(gpu)});
  }
  if (file != nullptr) {
    using controller = cache_controller<gpu_policies<layer_first_table, strata_scheduler, file_store&>>;
    return std::make_unique<controller_impl<controller, gpu_hooks>>(
        controller::tiers_type{device_pool<layer_first_table>{pool}, pinned_host_pool{g, host_pages, pinned}, *file},
        options, strata_scheduler{}, gpu_executor{executor_config(gpu)});
  }
  using controller = cache_controller<gpu_policies<layer_first_table>>;
  return std::make_unique<controller_impl<controller, gpu_hooks>>(
      controller::tiers_type{device_pool<layer_first_table>{pool}, pinned_host_pool{g, host_pages, pinned}}, options,
      strata_scheduler{}, gpu_executor{executor_config(gpu)});
}

// --- the transfer backends one by one -----------------------------------------------------------

namespace {

class transfer_impl final : public gpu_transfer_api {
 public:
  transfer_impl(transfer_handle h, std::shared_ptr<void> backend) : h_{std::move(h)}, backend_{std::move(backend)} {}
  /// Waits for what it moves: the backend's buffers and the caller's arrays outlive the copy.
  ~transfer_impl() override
  {
    try {
      h_.synchronize();
    } catch (...) {  // a failed transfer: nothing more will land
    }
  }
  void wait_layer(std::int64_t layer, std::uintptr_t stream) const override
  { h_.wait_layer(layer, cuda::stream_ref{reinterpret_cast<cudaStream_t>(stream)}); }
  void wait(std::uintptr_t stream) const override { h_.wait(cuda::stream_ref{reinterpret_cast<cudaStream_t>(stream)}); }
  void synchronize() const override { h_.synchronize(); }
  [[nodiscard]] bool done() const override { return h_.done(); }

 private:
  transfer_handle h_;
  std::shared_ptr<void> backend_;
};

template <class B>
class copier_impl final : public gpu_copier_api {
 public:
  explicit copier_impl(std::shared_ptr<B> b) : b_{std::move(b)} {}
  [[nodiscard]] char const* name() const override { return B::name; }

  std::unique_ptr<gpu_transfer_api> copy(gpu_layout const& src, gpu_layout const& dst, std::span<page_pair const> pages,
                                         layer_range layers, std::uintptr_t stream, bool per_layer) override
  {
    return std::visit(
        [&](auto const& s, auto const& d) -> std::unique_ptr<gpu_transfer_api> {
          using S = std::decay_t<decltype(s)>;
          using D = std::decay_t<decltype(d)>;
          if constexpr (!std::is_same_v<S, page_first> && !std::is_same_v<D, page_first>) {
            throw invalid_argument(
                text("strata: ", B::name, ": one side of a copy must be page_first (the host tier's records)"));
          } else if constexpr (!requires(B& b, copy_plan<S, D> const& p, cuda::stream_ref st,
                                         std::span<cudaEvent_t const> ev) { b.enqueue(p, st, ev); }) {
            throw invalid_argument(text("strata: ", B::name,
                                        " does not move this pair of layouts (staged: "
                                        "records, page_first, on one side; the other in device memory)"));
          } else {
            copy_plan<S, D> const plan{s, d, pages, layers};
            // A backend is not thread-safe (its descriptor ring, its events) and Python calls this
            // without the GIL: one copy at a time.
            std::lock_guard lock{m_};
            validate(plan);  // a refused plan binds nothing
            // The copy runs on the stream's device (a default stream: the current device's), the one
            // the backend's buffers were made on at its first copy.
            auto const raw = reinterpret_cast<cudaStream_t>(stream);
            int device = current_device();
            if (!detail::is_default_stream(raw)) { STRATA_CUDA_TRY(cudaStreamGetDevice(raw, &device)); }
            STRATA_EXPECTS(device_ < 0 || device == device_, B::name, ": this copier works on device ", device_,
                           " (its first copy's); the stream given is device ", device, "'s");
            device_scope const on{device};
            transfer_handle h =
                strata::submit(*b_, plan, cuda::stream_ref{raw}, per_layer ? completion::per_layer : completion::whole);
            device_ = device;
            return std::make_unique<transfer_impl>(std::move(h), b_);
          }
        },
        src, dst);
  }

 private:
  std::shared_ptr<B> b_;
  std::mutex m_;
  int device_ = -1;  // set by the first copy
};

class pinned_pool_impl final : public pinned_pool_api {
 public:
  pinned_pool_impl(kv_geometry const& g, std::int64_t pages, pinned_pool_options o) : pool_{g, pages, o} {}
  [[nodiscard]] std::byte* data() const override { return pool_.layout().page_data(0); }
  [[nodiscard]] std::int64_t pages() const override { return pool_.num_pages(); }
  [[nodiscard]] kv_geometry geometry() const override { return pool_.geometry(); }

 private:
  pinned_host_pool pool_;
};

}  // namespace

std::unique_ptr<gpu_copier_api> make_gpu_copier(copier_kind kind, int ctas)
{
  switch (kind) {
    case copier_kind::gpu_assisted:
      return std::make_unique<copier_impl<gpu_assisted>>(
          std::make_shared<gpu_assisted>(gpu_assisted_config{ctas, default_load_config.threads}));
    case copier_kind::dma_batch:
      return std::make_unique<copier_impl<dma_batch>>(std::make_shared<dma_batch>());
    case copier_kind::staged:
      return std::make_unique<copier_impl<staged>>(std::make_shared<staged>());
    case copier_kind::dma_copy:
      return std::make_unique<copier_impl<dma_copy>>(std::make_shared<dma_copy>());
  }
  throw invalid_argument(
      text("strata: gpu_copier: unknown backend ", int(kind), " (0 gpu_assisted, 1 dma_batch, 2 staged, 3 dma_copy)"));
}

std::unique_ptr<pinned_pool_api> make_pinned_pool(kv_geometry const& geometry, std::int64_t pages, bool registered)
{
  geometry.validate();
  STRATA_EXPECTS(pages > 0, "pinned_host_pool: pages must be positive, got ", pages);
  pinned_pool_options o;
  o.allocation = registered ? pinned_allocation::registered : pinned_allocation::host_alloc;
  o.chunk_bytes = pages * geometry.page_bytes();  // one chunk: one page_first array
  return std::make_unique<pinned_pool_impl>(geometry, pages, o);
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
