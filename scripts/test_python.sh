#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds and installs the Python package `strata` (python/, nanobind + scikit-build-core), then runs
# its pytest suite and the Python example. Installs what it needs with pip, quietly, only if missing.
#
#   scripts/test_python.sh                  # everything (torch + transformers for the HF tests)
#   STRATA_PYTHON_TORCH=0 scripts/test_python.sh    # skip installing torch / transformers
#   STRATA_PYTHON_CUDA=OFF scripts/test_python.sh   # without the GPU controller (ON: require it; default AUTO)
#   STRATA_PYTHON_REDIS=ON scripts/test_python.sh   # require the remote tier (hiredis; default AUTO)
#   PYTHON=python3.12 scripts/test_python.sh
#
# Exits non-zero when the build or a test fails, or when pytest collects no test.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
export PIP_DISABLE_PIP_VERSION_CHECK=1

have() { "$PYTHON" - "$@" <<'PY' 2>/dev/null
import importlib.metadata as md, sys
name, minimum = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
v = md.version(name)
if minimum:
    want = tuple(int(x) for x in minimum.split("."))
    got = tuple(int(x) for x in v.split("+")[0].split(".")[:len(want)] if x.isdigit())
    sys.exit(0 if got >= want else 1)
PY
}
need=()
have nanobind 3.1 || need+=("nanobind>=3.1,<4")
have scikit-build-core 0.10 || need+=("scikit-build-core>=0.10")
have numpy || need+=(numpy)
have pytest || need+=(pytest)
if [[ "${STRATA_PYTHON_TORCH:-1}" != 0 ]]; then
  have torch || need+=(torch)
  have transformers 5.0 || need+=("transformers>=5")
fi
if ((${#need[@]})); then
  echo "test_python: pip install ${need[*]}"
  "$PYTHON" -m pip install -q "${need[@]}"
fi

echo "test_python: building and installing ./python"
"$PYTHON" -m pip install -q --no-build-isolation ./python  # STRATA_PYTHON_CUDA: see pyproject.toml

echo "test_python: pytest"
set +e
(cd python/tests && "$PYTHON" -m pytest -q -rs -p no:cacheprovider .)
rc=$?
set -e
if ((rc == 5)); then
  echo "test_python: FAILED: pytest collected no tests"
  exit 1
elif ((rc != 0)); then
  echo "test_python: FAILED (pytest exit $rc)"
  exit "$rc"
fi

echo "test_python: examples/python/engine_loop.py"
"$PYTHON" examples/python/engine_loop.py --quick
if "$PYTHON" -c 'import torch, transformers' >/dev/null 2>&1; then
  echo "test_python: examples/python/transformers_cache.py"
  "$PYTHON" examples/python/transformers_cache.py
fi
echo "test_python: all passed"
