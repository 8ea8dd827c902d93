// SPDX-License-Identifier: Apache-2.0
// Thin compatibility layer over Catch2 2.13 (Debian 12) and Catch2 3 (the GPU machine).
#pragma once

#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#define STRATA_CATCH_VERSION 3
#else
#include <catch2/catch.hpp>
#define STRATA_CATCH_VERSION 2
namespace Catch {
using Detail::Approx;  // Catch2 3 spells it Catch::Approx
}
#endif

#include <string>

/**
 * Requires that the statements throw exception type `E` (or a subclass) whose message contains
 * `needle`. Another exception type propagates and fails the test.
 */
#define STRATA_REQUIRE_THROWS(E, needle, ...)                                         \
  do {                                                                                \
    bool strata_thrown_ = false;                                                      \
    try {                                                                             \
      (void)(__VA_ARGS__);                                                            \
    } catch (E const& strata_e_) {                                                    \
      strata_thrown_ = true;                                                          \
      INFO("message: " << strata_e_.what());                                          \
      CHECK(std::string(strata_e_.what()).find(needle) != std::string::npos);         \
    }                                                                                 \
    if (!strata_thrown_) { FAIL("expected " #E " containing \"" << needle << "\""); } \
  } while (0)
