#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The engines' plug-ins (python/tests_engines/), tested with the engines' own classes: installs
# SGLang 0.5.23, vLLM 0.34.0 and LMCache 0.5.6 with --no-deps (the pure-Python modules their
# storage hooks import, pinned below, and PyTorch when missing), then runs the adapter tests.
# Needs the `strata` package installed (scripts/test_python.sh does it). A missing package is an
# install failure here, never a skipped test.
#
#   scripts/test_engines.sh
#   PYTHON=python3.12 scripts/test_engines.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
# SGLang builds its page-hash extension (C++, OpenSSL's SHA-256) with torch's cpp_extension on first use.
strata_require_packages g++ ninja-build libssl-dev
PYTHON=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1
pip() { "$PYTHON" -m pip install -q "$@"; }

# PyTorch (the engines' pool and storage classes are torch code). The CPU build of PyPI's wheel does not
# exist for Linux, so this is the CUDA wheel; it runs on the CPU.
"$PYTHON" -c 'import torch' 2>/dev/null || pip "torch==2.14.1"
# What SGLang's storage, pool and hash modules import, at SGLang's pins where it pins, installed
# without touching torch, transformers or numpy.
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
"$PYTHON" - >"$constraints" <<'PY'
import importlib.metadata as md
for name in ("torch", "numpy", "transformers"):
    try:
        print(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        pass
PY
"$PYTHON" -c 'import transformers' 2>/dev/null || pip -c "$constraints" "transformers>=5"
pip -c "$constraints" psutil pybase64 pillow starlette msgspec "pyzmq>=25.1.2" aiohttp dill \
  "apache-tvm-ffi==0.1.11" "sentencepiece==0.2.1" "compressed-tensors==0.18.0" gguf "prometheus-client>=0.20.0"
# vLLM's and LMCache's imports of their offloading modules (vLLM's scheduler-side utilities, LMCache's
# CPU kernels), at the versions tested.
pip -c "$constraints" "cachetools==8.0.3" "cbor2==6.3.0" "uvloop==0.23.0" "py-cpuinfo==9.0.0" \
  "llguidance==1.9.1" "xgrammar==0.2.9" "numba==0.68.1" "cloudpickle==3.1.3" "orjson==3.13.0" \
  "sortedcontainers==2.4.0" "cryptography==51.0.1" "ipython==9.19.1"
# The engines themselves (and torchvision, imported by SGLang's model configs), without their
# dependencies: SGLang's HiCache storage, vLLM's tiered offloading, LMCache's native_plugin adapter.
pip --no-deps "sglang==0.5.23" "torchvision==0.29.2" "vllm==0.34.0" "lmcache==0.5.6"

echo "test_engines: pytest python/tests_engines"
set +e
(cd python/tests_engines && "$PYTHON" -m pytest -q -rs -p no:cacheprovider -W ignore::UserWarning .)
rc=$?
set -e
if ((rc == 5)); then
  echo "test_engines: FAILED: pytest collected no tests"
  exit 1
elif ((rc != 0)); then
  echo "test_engines: FAILED (pytest exit $rc)"
  exit "$rc"
fi
echo "test_engines: all passed"
