#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds and runs strata's main demo: the simulator on a small long-document workload, comparing
# fifo, longest_prefix (SGLang's default) and strata. Extra arguments go to the simulator
# (see `scripts/demo.sh --help`); relative paths in them (--trace, --out) are relative to the folder
# the script is called from. With --out or --sweep, matplotlib is installed with pip when missing
# (best effort: without it the simulator writes the chart data and says how to draw it).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
(
  cd "$root"
  . scripts/lib.sh
  strata_require_packages cmake make g++
  cmake -S . -B build-demo -DCMAKE_BUILD_TYPE=Release -DSTRATA_ENABLE_CUDA=OFF \
    -DSTRATA_BUILD_TESTS=OFF -DSTRATA_BUILD_BENCHMARKS=OFF -DSTRATA_BUILD_EXAMPLES=OFF -DSTRATA_BUILD_TOOLS=ON >/dev/null
  cmake --build build-demo -j "$(strata_jobs)" --target simulate >/dev/null
)
for arg in "$@"; do
  case $arg in
    --out | --sweep)
      if command -v python3 >/dev/null 2>&1 && ! python3 -c 'import matplotlib' >/dev/null 2>&1; then
        echo "strata: installing matplotlib for the charts (python3 -m pip install matplotlib)" >&2
        python3 -m pip install --quiet matplotlib >&2 ||
          echo "strata: could not install matplotlib; the charts stay as CSV data" >&2
      fi
      break
      ;;
  esac
done
exec "$root/build-demo/tools/simulate/simulate" "$@"
