#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Configures and builds mla into ${BUILD_DIR:-build}. Extra arguments go to cmake's configure step
# (e.g. -DMLA_WITH_CUDA=OFF). Uses every core.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
elif [ $# -gt 0 ]; then
  cmake -S . -B "$BUILD_DIR" "$@"
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
