// SPDX-License-Identifier: Apache-2.0
// The main of the CPU benchmarks: 5 repetitions with aggregates only unless the command line says
// otherwise (the figures in docs/benchmarks.md are medians of 5).
#pragma once

#include <benchmark/benchmark.h>

#include <string>
#include <vector>

namespace strata::bench {

inline void run_benchmarks(int argc, char** argv)
{
  std::vector<char*> args(argv, argv + argc);
  std::string reps = "--benchmark_repetitions=5", agg = "--benchmark_report_aggregates_only=true";
  bool has_reps = false;
  for (int i = 1; i < argc; ++i) {
    has_reps = has_reps || std::string{argv[i]}.starts_with("--benchmark_repetitions");
  }
  if (!has_reps) {
    args.push_back(reps.data());
    args.push_back(agg.data());
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}

}  // namespace strata::bench
