#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Formats strata's C++ and CUDA sources with the pinned clang-format (.clang-format needs 16 or
# later; CI pins one version so that formatting never depends on the machine).
#
#   scripts/format.sh           # format every tracked .hpp/.cuh/.cpp/.cu/.inl file in place
#   scripts/format.sh --check   # list the files that are not formatted; exit 1 if any
#
# The pinned clang-format comes from PyPI (`pip install clang-format==VERSION`) when the one on
# PATH is another version.
set -euo pipefail
cd "$(dirname "$0")/.."
version=23.1.5
PYTHON=${PYTHON:-python3}

tool=""
for candidate in clang-format "$("$PYTHON" -c 'import clang_format, os; print(os.path.join(os.path.dirname(clang_format.__file__), "data", "bin", "clang-format"))' 2>/dev/null || true)"; do
  if [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1 &&
    "$candidate" --version 2>/dev/null | grep -q "version $version"; then
    tool=$candidate
    break
  fi
done
if [ -z "$tool" ]; then
  echo "format: installing clang-format $version ($PYTHON -m pip install clang-format==$version)" >&2
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$PYTHON" -m pip install -q "clang-format==$version" >&2
  tool=$("$PYTHON" -c 'import clang_format, os; print(os.path.join(os.path.dirname(clang_format.__file__), "data", "bin", "clang-format"))')
fi

mapfile -t files < <(git ls-files '*.hpp' '*.cuh' '*.cpp' '*.cu' '*.inl')
if [ "${1:-}" = --check ]; then
  bad=()
  for f in "${files[@]}"; do
    "$tool" --style=file "$f" | cmp -s - "$f" || bad+=("$f")
  done
  if ((${#bad[@]})); then
    echo "format: not formatted with clang-format $version (run scripts/format.sh):" >&2
    printf '  %s\n' "${bad[@]}" >&2
    exit 1
  fi
  echo "format: ${#files[@]} files formatted"
else
  "$tool" -i --style=file "${files[@]}"
fi
