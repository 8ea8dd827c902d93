// SPDX-License-Identifier: Apache-2.0
// Host code compiled by nvcc (no device needed): the file tier's checksum takes the same path as in
// a g++ translation unit. Engines' .cu files and the Python module's GPU part read the file tier.
#include "../support/catch.hpp"

#include <strata/tier/detail/crc32c.hpp>

#include <cstdint>
#include <random>
#include <vector>

TEST_CASE("nvcc's host code checksums records with the CPU's CRC-32C instruction", "[cpu][file_store]")
{
#if defined(__x86_64__)
  CHECK(strata::detail::crc32c_hardware() == bool(__builtin_cpu_supports("sse4.2")));
#endif
  CHECK(strata::detail::crc32c(0, "123456789", 9) == 0xE3069283U);  // the CRC-32C check value
  std::mt19937_64 rng{3};
  std::vector<unsigned char> v(100'000);
  for (auto& b : v) {
    b = static_cast<unsigned char>(rng());
  }
  for (std::size_t n : {std::size_t{0}, std::size_t{7}, std::size_t{24'577}, std::size_t{100'000}}) {
    CHECK(strata::detail::crc32c(0, v.data(), n) == ~strata::detail::crc32c_update_sw(~0U, v.data(), n));
  }
}
