#!/usr/bin/env bash
# Builds and runs strata's main demo.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
strata_require_packages cmake make g++
cmake -S . -B build-demo -DCMAKE_BUILD_TYPE=Release -DSTRATA_ENABLE_CUDA=OFF \
  -DSTRATA_BUILD_TESTS=OFF -DSTRATA_BUILD_BENCHMARKS=OFF -DSTRATA_BUILD_EXAMPLES=ON >/dev/null
cmake --build build-demo -j "$(strata_jobs)" --target layouts >/dev/null
exec ./build-demo/examples/layouts "$@"
