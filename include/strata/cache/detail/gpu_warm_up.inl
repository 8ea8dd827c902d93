// SPDX-License-Identifier: Apache-2.0
/**
 * @file cache/detail/gpu_warm_up.inl
 * @brief `gpu_executor::warm_up`: the kernels loaded, the cost tables scaled to this machine's link.
 */
#pragma once

#include <strata/transfer/calibrate.cuh>

namespace strata {

template <class Tiers>
gpu_calibration gpu_executor::warm_up(Tiers const& tiers, std::int64_t scratch_bytes)
{
  state& st = *state_;
  std::lock_guard const serial{st.serial};  // no submission meanwhile: the backends and tables are ours
  synchronize();                            // and none in flight (the submit and record threads idle)
  device_scope const on{st.bound()};
  cuda_parts& cp = st.parts();
  using D = typename Tiers::template store_type<0>;
  using H = typename Tiers::template store_type<1>;
  if constexpr (addressable_store<D> && addressable_store<H>) {  // lazily loaded kernels, loaded now
    using DL = std::remove_cvref_t<decltype(std::declval<D const&>().layout())>;
    using HL = std::remove_cvref_t<decltype(std::declval<H const&>().layout())>;
    cudaFuncAttributes a{};
    STRATA_CUDA_TRY(cudaFuncGetAttributes(&a, detail::copy_blocks_kernel<HL, DL>));
    STRATA_CUDA_TRY(cudaFuncGetAttributes(&a, detail::copy_blocks_kernel<DL, HL>));
  }
  kv_geometry const g = tiers.geometry();
  std::int64_t const pages = std::max<std::int64_t>(2, scratch_bytes / g.page_bytes());
  pinned_buffer host(std::size_t(pages * g.page_bytes()));
  device_buffer dev(std::size_t(pages * g.page_bytes()));
  page_first const h{host.data(), g, pages};
  layer_first const d{dev.data(), g, pages};
  std::vector<page_pair> in_order, reversed;
  for (std::int64_t p = 0; p < pages; ++p) {
    in_order.push_back({p, p});
    reversed.push_back({p, pages - 1 - p});
  }
  layer_range const all = layer_range::all(g);
  std::span<page_pair const> const every{in_order}, half = every.first(in_order.size() / 2);
  copy_plan const scattered{h, d, std::span<page_pair const>{reversed}, all};
  // The rate a long transfer moves at: the extra bytes of the whole scratch over half of it, by
  // the extra time (a fixed start-up cost, the host describing the first copies, drops out).
  auto const marginal = [](auto& backend, auto const& whole, auto const& part, cudaStream_t s) {
    transfer_measurement const a = measure_transfer(backend, whole, s), b = measure_transfer(backend, part, s);
    if (a.gbps <= 0 || b.gbps <= 0) { return a.gbps; }
    double const ta = double(whole.bytes()) / a.gbps, tb = double(part.bytes()) / b.gbps;  // ns
    return ta > tb ? double(whole.bytes() - part.bytes()) / (ta - tb) : a.gbps;
  };
  gpu_calibration c;
  c.load_gbps[std::size_t(gpu_backend::gpu_assisted)] = marginal(
      std::get<gpu_assisted>(cp.load), copy_plan{h, d, every, all}, copy_plan{h, d, half, all}, cp.load_stream);
  c.load_gbps[std::size_t(gpu_backend::dma_batch)] =
      marginal(std::get<dma_batch>(cp.load), copy_plan{h, d, every, all}, copy_plan{h, d, half, all}, cp.load_stream);
  c.copy_gbps[std::size_t(gpu_backend::gpu_assisted)] = marginal(
      std::get<gpu_assisted>(cp.copy), copy_plan{d, h, every, all}, copy_plan{d, h, half, all}, cp.copy_stream);
  c.copy_gbps[std::size_t(gpu_backend::dma_batch)] =
      marginal(std::get<dma_batch>(cp.copy), copy_plan{d, h, every, all}, copy_plan{d, h, half, all}, cp.copy_stream);
  dma_batch_config plain_config = st.config.dma;  // one descriptor per run: what a descriptor costs
  plain_config.strided_runs = false;
  plain_config.on_enqueue = {};
  dma_batch plain{plain_config};
  transfer_measurement const s = measure_transfer(plain, scattered, cp.load_stream);
  c.dma_descriptor_us = s.runs > 0 ? s.enqueue_us / double(s.runs) : 0;

  auto const scale = [](transfer_option& o, double measured) {
    double const idle = o.gbps[std::size_t(gpu_activity::idle)];
    if (measured <= 0 || idle <= 0) { return; }
    for (double& rate : o.gbps) {
      rate *= measured / idle;
    }
  };
  for (auto [table, rates] :
       {std::pair{&st.config.load_options, &c.load_gbps}, {&st.config.copy_options, &c.copy_gbps}}) {
    (*rates)[std::size_t(gpu_backend::staged)] = 0;  // not measured: scaled as the copy engine it shares
    double const dma = (*rates)[std::size_t(gpu_backend::dma_batch)];
    double const dma_idle = (*table)[std::size_t(gpu_backend::dma_batch)].gbps[std::size_t(gpu_activity::idle)];
    scale((*table)[std::size_t(gpu_backend::gpu_assisted)], (*rates)[std::size_t(gpu_backend::gpu_assisted)]);
    scale((*table)[std::size_t(gpu_backend::dma_batch)], dma);
    if (dma_idle > 0) {
      double const staged_idle = (*table)[std::size_t(gpu_backend::staged)].gbps[std::size_t(gpu_activity::idle)];
      scale((*table)[std::size_t(gpu_backend::staged)], staged_idle * dma / dma_idle);
    }
  }
  if (c.dma_descriptor_us > 0) {
    st.config.dma_descriptor_us = c.dma_descriptor_us;
    st.dma_cost.reset(c.dma_descriptor_us);
  }
  return c;
}

}  // namespace strata
