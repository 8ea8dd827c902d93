#!/usr/bin/env bash
# Builds and runs strata's whole test suite.
#
#   0. scripts/format.sh --check: the sources are formatted with the pinned clang-format.
#   1. build/       the default configuration: every test, example and benchmark builds; the CUDA
#                   parts too when nvcc is found. ctest runs all tests; [gpu] tests skip without a GPU.
#   2. build-asan/  host-only, with AddressSanitizer and UndefinedBehaviorSanitizer: the [cpu] tests.
#   3. build-tsan/  host-only, with ThreadSanitizer: the cache controller's tests (polling, evicting
#                   and record threads), the file store's and the keyed file store's transfers from
#                   several threads, the remote store's batches from several threads and through a
#                   failover, the controller over the remote tier (its lookups and copies on the
#                   store's threads).
#   The remote tier's tests start Redis servers (Debian's redis-server, installed here) on loopback
#   ports and stop them on every exit path.
#   4. the Python package (python/, scripts/test_python.sh): built, installed with pip, its pytest
#      suite and example; PyTorch and transformers are not installed for it here (set
#      STRATA_PYTHON_TORCH=1 to install them and run the transformers tests too; STRATA_SKIP_PYTHON=1
#      skips the step).
#   5. the engines' plug-ins (scripts/test_engines.sh): SGLang's HiCache backend, tested with SGLang's own
#      classes (SGLang installed with --no-deps, PyTorch when missing; STRATA_SKIP_ENGINES=1 skips it).
#
# Extra arguments go to both ctest runs (e.g. -R host_copy).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
strata_require_packages cmake make g++ catch2 libbenchmark-dev pkg-config libhiredis-dev redis-server redis-tools
jobs=$(strata_jobs)

scripts/format.sh --check

cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_REQUIRE_REDIS=ON
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs" "$@"

cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DSTRATA_ENABLE_CUDA=OFF -DSTRATA_SANITIZE=ON -DSTRATA_REQUIRE_REDIS=ON \
  -DSTRATA_BUILD_BENCHMARKS=OFF -DSTRATA_BUILD_EXAMPLES=OFF
cmake --build build-asan -j "$jobs"
ctest --test-dir build-asan --output-on-failure -j "$jobs" -L cpu -E '^package' "$@"

# 3. build-tsan/: the cache controller's concurrent calls, and the file store's transfers from
#    several threads, under ThreadSanitizer.
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_ENABLE_CUDA=OFF -DSTRATA_SANITIZE_THREAD=ON -DSTRATA_REQUIRE_REDIS=ON \
  -DSTRATA_BUILD_BENCHMARKS=OFF -DSTRATA_BUILD_EXAMPLES=OFF -DSTRATA_BUILD_TOOLS=OFF
cmake --build build-tsan -j "$jobs" --target test_controller test_file_store test_keyed_file_store test_redis_store test_controller_remote
ctest --test-dir build-tsan --output-on-failure -R '^test_controller$'
STRATA_TEST_QUICK=1 build-tsan/tests/test_file_store '[threads]'
STRATA_TEST_QUICK=1 build-tsan/tests/test_keyed_file_store '[threads]'
STRATA_TEST_QUICK=1 build-tsan/tests/test_redis_store '[threads]'
build-tsan/tests/test_controller_remote

# 4. The Python binding.
if [ "${STRATA_SKIP_PYTHON:-0}" != 1 ]; then
  STRATA_PYTHON_REDIS=${STRATA_PYTHON_REDIS:-ON} STRATA_PYTHON_TORCH=${STRATA_PYTHON_TORCH:-0} scripts/test_python.sh
fi

# 5. The engines' plug-ins, with the engines' own classes.
if [ "${STRATA_SKIP_PYTHON:-0}" != 1 ] && [ "${STRATA_SKIP_ENGINES:-0}" != 1 ]; then
  scripts/test_engines.sh
fi
