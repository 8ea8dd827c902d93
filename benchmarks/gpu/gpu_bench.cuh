// SPDX-License-Identifier: Apache-2.0
// Shared by the GPU benchmarks: timing with CUDA events, medians, thread CPU time, output.
#pragma once

#include <strata/cuda.cuh>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

namespace strata::bench {

inline double median(std::vector<double> v)
{
  if (v.empty()) { return 0; }
  std::sort(v.begin(), v.end());
  std::size_t const n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// CPU seconds the calling thread has used.
inline double thread_cpu_seconds()
{
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

/// Milliseconds between two recorded events.
inline double elapsed_ms(cudaEvent_t a, cudaEvent_t b)
{
  float ms = 0;
  STRATA_CUDA_TRY(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

/// A CSV file under $OUT (or the working directory), plus echo of a markdown table to stdout.
class report {
 public:
  report(std::string const& name, std::string const& header) : header_{header}
  {
    char const* out = std::getenv("OUT");
    std::string path = (out != nullptr ? std::string{out} + "/" : std::string{}) + name;
    csv_.open(path);
    csv_ << header << "\n";
  }
  void row(std::string const& line)
  {
    csv_ << line << "\n";
    csv_.flush();
  }

 private:
  std::string header_;
  std::ofstream csv_;
};

}  // namespace strata::bench
