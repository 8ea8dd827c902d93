#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# On a machine with an NVIDIA GPU (sm_90): build everything, run the whole test suite (the [gpu]
# tests included), compute-sanitizer memcheck on a quick pass of the [gpu] tests, the GPU example,
# and the GPU benchmarks. Results and logs go to $OUT (default: build-gpu/results).
# STRATA_BUILD_TARGETS limits what is built (default: all; when set, `tests` runs the [gpu] tests
# only). STRATA_BUILD_DIR names the build folder (default build-gpu); with STRATA_PREBUILT=1 the
# script builds nothing and runs what that folder holds (binaries built on a like machine and carried
# over: nvcc under a sandboxed device machine can take longer than a call's limit).
# STRATA_CTEST_ARGS adds arguments to ctest (e.g. -E test_gpu_assisted). Every step runs under a
# time limit (STRATA_STEP_TIMEOUT seconds, default 300; ctest: 150 per test) so that a hung copy
# shows up as a failure with its log instead of eating the machine.
#
#   scripts/gpu.sh [tests] [memcheck] [bench-quick] [bench] [engine] [engine-quick] [probe] [interference]
#                  (default: tests memcheck bench-quick)
#
# `engine` runs benchmarks/gpu/engine_loop.cu (cache_controller on the GPU beside cuBLAS layers: load
# bandwidth through the controller vs one contiguous copy, and TTFT of a cached 32K-token document vs
# load + compute); `engine-quick` a small run of it. The device machine gets the tree without .git:
# pass STRATA_COMMIT.
set -uo pipefail
for arg in "$@"; do
  case $arg in -h | --help) sed -n '3,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
done
cd "$(dirname "$0")/.."
out=${OUT:-build-gpu/results}
mkdir -p "$out"
steps=${*:-tests memcheck bench-quick}
gen=""
command -v ninja >/dev/null 2>&1 && gen="-G Ninja"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv || true
  echo "commit ${STRATA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo "unknown (no .git: pass STRATA_COMMIT)")}"
  date -u
} >"$out/machine.txt" 2>&1
build=${STRATA_BUILD_DIR:-build-gpu}
if [ -z "${STRATA_PREBUILT:-}" ]; then
  cmake -S . -B "$build" $gen -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 >"$out/build.log" 2>&1 &&
    cmake --build "$build" -j "$(nproc)" --target ${STRATA_BUILD_TARGETS:-all} >>"$out/build.log" 2>&1
  status=$?
  tail -n 30 "$out/build.log"
  [ $status -eq 0 ] || exit $status
fi

rc=0
limit=${STRATA_STEP_TIMEOUT:-300}
labels=""
[ -n "${STRATA_BUILD_TARGETS:-}${STRATA_PREBUILT:-}" ] && labels="-L gpu"
for step in $steps; do
  echo "== $step ($(date -u +%T))"

  case $step in
    tests)
      timeout "$limit" ctest --test-dir "$build" $labels ${STRATA_CTEST_ARGS:-} --output-on-failure --timeout 150 -j "${STRATA_CTEST_JOBS:-1}" 2>&1 | tee "$out/tests.log" | tail -n 25
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      timeout 120 ./$build/examples/gpu_layerwise_load 2>&1 | tee -a "$out/tests.log" || rc=1
      ;;
    memcheck)
      for t in tests/test_gpu_assisted tests/test_dma tests/test_staged tests/test_pinned_pool tests/test_sm_partition \
        tests/test_descriptor_ring tests/test_checks tests/test_submit_thread tests/test_controller_gpu \
        examples/engine_loop_gpu; do
        STRATA_GPU_TEST_QUICK=1 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 \
          ./$build/$t 2>&1 | tail -n 4 | tee -a "$out/tests.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      done
      ;;
    bench-quick)  # exits 1 if a repetition moved wrong bytes
      timeout "$limit" ./$build/benchmarks/gpu/bench_transfer --quick 2>&1 | tee "$out/bench_transfer.md" | tail -n 60
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      ;;
    bench)
      timeout "$limit" ./$build/benchmarks/gpu/bench_transfer 2>&1 | tee "$out/bench_transfer.md" | tail -n 80
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      ;;
    engine | engine-quick)  # exits non-zero if a KV word read back was wrong
      timeout "$limit" ./$build/benchmarks/gpu/bench_engine_loop $([ "$step" = engine-quick ] && echo --quick) 2>&1 |
        tee "$out/engine_loop.md" | tail -n 40
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      ;;
    probe) ./$build/benchmarks/gpu/bench_copy_probe 2>&1 | tee "$out/bench_copy_probe.md" ;;
    interference) ./$build/benchmarks/gpu/bench_interference 2>&1 | tee "$out/bench_interference.md" | tail -n 80 ;;
    *) echo "unknown step $step" >&2; rc=2 ;;
  esac
done
exit $rc
