#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Hostile-input check (issue 14, docs/DEVELOPING.md "Hostile input"): builds mla with clang under
# AddressSanitizer + UndefinedBehaviorSanitizer (every target; any report aborts the test) together
# with the libFuzzer targets, then runs the CPU unit suite (`ctest -L unit`) and a short fuzz pass
# (`ctest -L fuzz`: MLA_FUZZ_CI_RUNS executions per target, fixed seed). CPU only (no CUDA, no Python
# package: an instrumented extension cannot load into a plain interpreter).
# Usage: scripts/sanitize.sh [extra cmake args]; BUILD_DIR (default build-sanitize), MLA_FUZZ_CI_RUNS.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-sanitize}
command -v clang++ >/dev/null || { echo "sanitize.sh: clang++ not found (scripts/setup.sh installs clang)"; exit 1; }
LAUNCHER=()
command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMLA_WITH_CUDA=OFF \
  -DMLA_WITH_PYTHON=OFF -DMLA_SANITIZE=address,undefined -DMLA_FUZZ=ON \
  -DMLA_FUZZ_CI_RUNS="${MLA_FUZZ_CI_RUNS:-20000}" "${LAUNCHER[@]}" "$@"
cmake --build "$BUILD_DIR" -j "$(nproc)"
# Leak checking stays on; OpenMP's thread pool lives until exit and is not reported as a leak.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
cd "$BUILD_DIR"
ctest --output-on-failure -j "$(nproc)" -L unit
ctest --output-on-failure -j "$(nproc)" -L fuzz
