# SPDX-License-Identifier: Apache-2.0
# Shared by scripts/demo.sh and scripts/test.sh: Debian packages, build folder, parallelism.

# strata_require_packages PKG...: installs the Debian packages that are missing when running as
# root, or says which to install and stops. Set STRATA_SKIP_PACKAGES=1 to skip the check (for
# systems whose dependencies do not come from Debian packages).
strata_require_packages() {
  [ "${STRATA_SKIP_PACKAGES:-0}" = 1 ] && return 0
  if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "strata: no dpkg here; make sure these are installed: $*" >&2
    return 0
  fi
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "strata: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  else
    echo "strata: missing Debian packages; run: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
}

# Parallel build jobs: every core (2 on the project's machines).
strata_jobs() { nproc 2>/dev/null || echo 2; }
