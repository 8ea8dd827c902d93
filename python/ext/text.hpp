// SPDX-License-Identifier: Apache-2.0
/**
 * @file python/ext/text.hpp
 * @brief The parts of a message streamed together, for the binding's errors and reprs (shared by
 *        the nanobind module and the CUDA part compiled without it).
 */
#pragma once

#include <sstream>
#include <string>

namespace strata::python {

/// @brief `args...` streamed into one string.
template <class... Args>
std::string text(Args const&... args)
{
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

}  // namespace strata::python
