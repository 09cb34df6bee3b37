#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Long fuzzing runs (docs/DEVELOPING.md "Hostile input"): builds the libFuzzer targets with clang,
# ASan and UBSan (as scripts/sanitize.sh) and runs each target for RUNS executions (default 10^6),
# one process per target at a time, printing each target's execution count and the time it took.
# A crash or contract violation stops the target and leaves the reproducer in
# $BUILD_DIR/fuzz-artifacts/; rerun it with `$BUILD_DIR/bin/fuzz/fuzz_<name> <file>`.
# Usage: scripts/fuzz.sh [target ...] (default: all); RUNS, JOBS (targets run at once, default 1),
# BUILD_DIR (default build-sanitize), CORPUS (a directory: keep each target's corpus in CORPUS/<name>).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-sanitize}
RUNS=${RUNS:-1000000}
LAUNCHER=()
command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMLA_WITH_CUDA=OFF \
  -DMLA_WITH_PYTHON=OFF -DMLA_SANITIZE=address,undefined -DMLA_FUZZ=ON "${LAUNCHER[@]}" >/dev/null
targets=("$@")
if ((${#targets[@]} == 0)); then
  for f in tests/fuzz/fuzz_*.cpp; do targets+=("$(basename "$f" .cpp | sed 's/^fuzz_//')"); done
fi
cmake --build "$BUILD_DIR" -j "$(nproc)" --target "${targets[@]/#/fuzz_}"
mkdir -p "$BUILD_DIR/fuzz-artifacts"
export OMP_NUM_THREADS=1
run_one() {
  local name=$1 corpus=() start log
  if [ -n "${CORPUS:-}" ]; then mkdir -p "$CORPUS/$name"; corpus=("$CORPUS/$name"); fi
  log="$BUILD_DIR/fuzz-artifacts/$name.log"
  start=$(date +%s)
  if "$BUILD_DIR/bin/fuzz/fuzz_$name" -runs="$RUNS" -len_control=0 -max_len=2048 -print_final_stats=1 \
      -artifact_prefix="$BUILD_DIR/fuzz-artifacts/$name-" "${corpus[@]}" >"$log" 2>&1; then
    echo "fuzz_$name: $(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$') executions," \
         "$(( $(date +%s) - start )) s, no crash ($(date -u +%F), $(git rev-parse --short HEAD))"
  else
    echo "fuzz_$name: FAILED after $(( $(date +%s) - start )) s; see $log"; tail -30 "$log"; return 1
  fi
}
fails=0
running=0
for t in "${targets[@]}"; do
  run_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "${JOBS:-1}" ]; then wait -n || fails=$((fails + 1)); running=$((running - 1)); fi
done
while [ "$running" -gt 0 ]; do wait -n || fails=$((fails + 1)); running=$((running - 1)); done
exit $fails
