// SPDX-License-Identifier: Apache-2.0
/**
 * @file error.hpp
 * @brief The strata exception hierarchy and the checking macros.
 *
 * Bad input throws `strata::invalid_argument` before anything changes; failed CUDA calls throw
 * `strata::cuda_error` naming the call; failed allocations throw `strata::out_of_memory` with the
 * sizes asked and available. Destructors and `noexcept` paths never throw.
 */
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace strata {

/// @brief Base of every exception strata throws.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// @brief A caller passed a value the API does not accept; nothing was changed.
class invalid_argument : public error {
 public:
  using error::error;
};

/// @brief A CUDA runtime or driver call failed; the message names the call and the CUDA error.
class cuda_error : public error {
 public:
  using error::error;
};

/// @brief An allocation (device, pinned host, page slots) could not be satisfied.
class out_of_memory : public error {
 public:
  using error::error;
};

namespace detail {

/// @brief Streams every argument into one string (g++ 12 has no `std::format`).
/// @throw std::bad_alloc when memory runs out: a stream would swallow it and return the string
///        cut short (a file name, a descriptor: found with allocation failures injected)
template <class... Args>
[[nodiscard]] std::string concat(Args const&... args)
{
  std::ostringstream out;
  out.exceptions(std::ios::badbit | std::ios::failbit);
  (out << ... << args);
  return std::move(out).str();
}

}  // namespace detail
}  // namespace strata

/**
 * @brief Throws `strata::invalid_argument` built from the remaining arguments when `cond` is false.
 *
 * Use it at API boundaries, before any state changes:
 * `STRATA_EXPECTS(page < n, "page id ", page, " out of range [0, ", n, ")");`
 */
#define STRATA_EXPECTS(cond, ...)                                                                         \
  do {                                                                                                    \
    if (!(cond)) { throw ::strata::invalid_argument(::strata::detail::concat("strata: ", __VA_ARGS__)); } \
  } while (0)

/**
 * @brief Throws exception type `E` (a `strata::error`) built from the arguments when `cond` is false.
 */
#define STRATA_EXPECTS_AS(E, cond, ...)                                          \
  do {                                                                           \
    if (!(cond)) { throw E(::strata::detail::concat("strata: ", __VA_ARGS__)); } \
  } while (0)

/**
 * @brief Calls a CUDA runtime function and throws `strata::cuda_error` naming it if it fails.
 *
 * Defined here so that it reads the same everywhere; it expands only inside `.cuh` code, where the
 * CUDA runtime header is included.
 */
#define STRATA_CUDA_TRY(call)                                                                                  \
  do {                                                                                                         \
    cudaError_t const strata_status_ = (call);                                                                 \
    if (strata_status_ != cudaSuccess) {                                                                       \
      (void)cudaGetLastError();                                                                                \
      throw ::strata::cuda_error(::strata::detail::concat("strata: CUDA call ", #call,                         \
                                                          " failed: ", cudaGetErrorName(strata_status_), " (", \
                                                          cudaGetErrorString(strata_status_), ")"));           \
    }                                                                                                          \
  } while (0)

/**
 * @brief For destructors and `noexcept` paths: asserts a CUDA call succeeded in debug builds and
 *        ignores its result otherwise. Never throws.
 */
#ifdef NDEBUG
#define STRATA_ASSERT_CUDA_SUCCESS(call) \
  do {                                   \
    (void)(call);                        \
  } while (0)
#else
#include <cassert>
#define STRATA_ASSERT_CUDA_SUCCESS(call)       \
  do {                                         \
    cudaError_t const strata_status_ = (call); \
    assert(strata_status_ == cudaSuccess);     \
    (void)strata_status_;                      \
  } while (0)
#endif
