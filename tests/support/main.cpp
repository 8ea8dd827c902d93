// SPDX-License-Identifier: Apache-2.0
// Test runner shared by every test executable (Catch2 2 or 3).
//
// Built with STRATA_TEST_NEEDS_GPU, the runner exits with code 77 — which ctest reports as
// "skipped" — when no CUDA device is present, so GPU tests skip cleanly on CI.
#if __has_include(<catch2/catch_session.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

#include <cstdio>

#ifdef STRATA_TEST_NEEDS_GPU
#include <cuda_runtime_api.h>
#endif

int main(int argc, char** argv)
{
#ifdef STRATA_TEST_NEEDS_GPU
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: skipping GPU tests\n");
    return 77;
  }
#endif
  return Catch::Session().run(argc, argv);
}
