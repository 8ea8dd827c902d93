#!/usr/bin/env bash
# Builds and runs strata's main demo: the simulator on a small long-document workload, comparing
# fifo, longest_prefix (SGLang's default) and strata. Extra arguments go to the simulator
# (see `scripts/demo.sh --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
strata_require_packages cmake make g++
cmake -S . -B build-demo -DCMAKE_BUILD_TYPE=Release -DSTRATA_ENABLE_CUDA=OFF \
  -DSTRATA_BUILD_TESTS=OFF -DSTRATA_BUILD_BENCHMARKS=OFF -DSTRATA_BUILD_EXAMPLES=ON >/dev/null
cmake --build build-demo -j "$(strata_jobs)" --target simulate >/dev/null
exec ./build-demo/examples/simulate "$@"
