// SPDX-License-Identifier: Apache-2.0
// A consumer of an installed strata: describe a model's cache, move a page on the CPU, and run one
// request through the cache controller with the default host policies.
#include <strata/strata.hpp>

#include <cstdio>
#include <vector>

static_assert(STRATA_HAS_CUDA == 0, "strata::strata must not bring CUDA along");

int main()
{
  strata::kv_geometry const g = strata::models::llama31_8b.geometry(16, 2, 8);
  std::vector<std::byte> host(2 * g.page_bytes()), device(2 * g.page_bytes());
  for (std::size_t i = 0; i < host.size(); ++i) {
    host[i] = static_cast<std::byte>(i * 7);
  }
  strata::page_first const src{host.data(), g, 2};
  strata::layer_first const dst{device.data(), g, 2};
  strata::page_pair const pages[] = {{1, 0}};
  strata::host_copy{}.copy(
      strata::copy_plan{src, dst, std::span<strata::page_pair const>{pages}, strata::layer_range::all(g)});
  bool ok = dst.block(0, 5, 1).data[3] == src.block(1, 5, 1).data[3];

  // The cache controller with the default policies: two lines.
  std::vector<std::byte> pool(16 * g.page_bytes());  // the engine's KV pool (host memory here)
  using controller = strata::cache_controller<strata::cpu_policies<strata::layer_first>>;
  controller cache{
      controller::tiers_type{strata::device_pool{strata::layer_first{pool.data(), g, 16}}, strata::host_pool{g, 4}}};
  std::vector<std::int32_t> const prompt(40, 7);
  cache.submit({strata::request_id{1}, prompt, 0, 4, 0.0});
  auto const loads = cache.begin_loads(cache.schedule({}));
  if (loads.ran.size() != 1) { return 1; }
  (void)cache.finish_prefill(strata::request_id{1});
  cache.release(strata::request_id{1});
  ok = ok && cache.live_requests() == 0;
  std::printf("strata %d.%d.%d: %s\n", STRATA_VERSION_MAJOR, STRATA_VERSION_MINOR, STRATA_VERSION_PATCH,
              ok ? "ok" : "MISMATCH");
  return ok ? 0 : 1;
}
