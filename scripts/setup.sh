#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the Debian packages mla builds against (idempotent; skips what is present).
# Needs root or sudo. The CUDA toolkit is not installed here: CUDA is used when /usr/local/cuda exists.
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config libfmt-dev libcli11-dev nlohmann-json3-dev
      libdlpack-dev libgtest-dev libgmock-dev libbenchmark-dev libomp-dev libopenblas-dev
      python3-dev pybind11-dev python3-numpy python3-pytest
      python3-venv  # ctest python.wheel: the wheel installed into a fresh virtual environment
      clang libclang-rt-14-dev)  # scripts/sanitize.sh, scripts/fuzz.sh: clang 14 with ASan/UBSan and libFuzzer
# The Python package's torch tests (custom ops, the compat modules, torch tensors) need python3-torch
# (CPU, 1.13): about 1.6 min to install on a 2-core machine (measured); MLA_SETUP_TORCH=0
# skips it and those tests skip with a reason.
[ "${MLA_SETUP_TORCH:-1}" = 1 ] && PKGS+=(python3-torch)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "[setup] installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "[setup] all packages present"
fi
