// SPDX-License-Identifier: Apache-2.0
/**
 * @file config.hpp
 * @brief Version, feature macros and the host/device annotation used by every strata header.
 */
#pragma once

/// @brief Major version; CMake reads the project version from these three lines.
#define STRATA_VERSION_MAJOR 0
/// @brief Minor version.
#define STRATA_VERSION_MINOR 1
/// @brief Patch version.
#define STRATA_VERSION_PATCH 0

/// @brief The version as one integer, `major * 10000 + minor * 100 + patch`.
#define STRATA_VERSION (STRATA_VERSION_MAJOR * 10000 + STRATA_VERSION_MINOR * 100 + STRATA_VERSION_PATCH)

/**
 * @brief 1 when the translation unit may use the CUDA runtime.
 *
 * The `strata::cuda` CMake target defines it to 1; nvcc defines `__CUDACC__`. Host-only code
 * (`strata::strata`) sees 0 and never includes a CUDA header.
 */
#ifndef STRATA_HAS_CUDA
#if defined(__CUDACC__)
#define STRATA_HAS_CUDA 1
#else
#define STRATA_HAS_CUDA 0
#endif
#endif

/**
 * @brief Marks functions callable from host and device code (layout arithmetic, plan indexing).
 *
 * Expands to nothing outside nvcc, so the same header compiles with g++ alone.
 */
#if defined(__CUDACC__)
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif
