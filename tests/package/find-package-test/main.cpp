// A consumer of an installed strata: describe a model's cache and move a page on the CPU.
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
  bool const ok = dst.block(0, 5, 1).data[3] == src.block(1, 5, 1).data[3];
  std::printf("strata %d.%d.%d: %s\n", STRATA_VERSION_MAJOR, STRATA_VERSION_MINOR, STRATA_VERSION_PATCH,
              ok ? "ok" : "MISMATCH");
  return ok ? 0 : 1;
}
