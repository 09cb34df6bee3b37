#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One-call GPU verification of the lightning indexer (docs/INDEXER.md) on the device machine: build the
# GPU tests and the CLI, run the indexer / variant / PTX tests, memcheck and racecheck on them, the SASS
# summary of the indexer kernels, the indexer benchmarks (automatic and forced portable variant), and
# with FULL=1 the whole GPU suite. Logs go to $OUT (or ./gpu-logs). Each step is time-boxed.
# Usage: scripts/indexer_gpu_check.sh [steps...], steps among  build tests sanitize sass bench profile
# (default: all but profile; scripts/py_indexer_gpu_check.sh runs them beside the Python package's checks).
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${OUT:-gpu-logs}
mkdir -p "$LOG"
B=${BUILD_DIR:-build-gpu}
STEPS=${*:-build tests sanitize sass bench}
has() { [[ " $STEPS " == *" $1 "* ]]; }
rc=0
if has build; then
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$LOG/gpu.txt"
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release >"$LOG/cmake.log" 2>&1 || { tail -30 "$LOG/cmake.log"; exit 1; }
  ninja -C $B -j16 mla_gpu_tests mla_cli >"$LOG/build.log" 2>&1 || { grep -E "error|FAILED" -A4 "$LOG/build.log" | head -60; exit 1; }
  echo "build ok"
fi
if has tests; then
  F='*Indexer*:PtxSm80.*:Variants*'
  timeout 120 ./$B/bin/mla_gpu_tests --gtest_filter="$F" >"$LOG/tests.log" 2>&1 || rc=1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests? from .* ran|Failure|error|Expected|Which is|got " "$LOG/tests.log" | head -40
fi
if has sanitize; then
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 ./$B/bin/mla_gpu_tests \
    --gtest_filter='*Indexer*:PtxSm80.CpAsync4*' --gtest_brief=1 >"$LOG/memcheck.log" 2>&1 || rc=1
  echo "memcheck: $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$LOG/memcheck.log" | tr '\n' ' ')"
  timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 ./$B/bin/mla_gpu_tests \
    --gtest_filter='All/IndexerLogitsGpu.PrefillRaggedRanges/*:All/IndexerLogitsGpu.DecodeMatchesOracle/sm90_tma:IndexerTopkGpu.EqualsCpuOnSameLogits' --gtest_brief=1 \
    >"$LOG/racecheck.log" 2>&1 || rc=1
  echo "racecheck: $(grep -E 'ERROR SUMMARY|RACE|PASSED|FAILED' "$LOG/racecheck.log" | head -5 | tr '\n' ' ')"
fi
if has sass; then
  scripts/sass_summary.sh ./$B/bin/mla 'indexer' >"$LOG/sass.txt" 2>&1; cat "$LOG/sass.txt"
fi
if has bench; then
  timeout 90 ./$B/bin/mla bench --ops ceilings,indexer_logits,indexer_topk --json "$LOG/bench.json" 2>&1 \
    | tee "$LOG/bench.txt" || rc=1
  timeout 40 ./$B/bin/mla bench --ops ceilings,indexer_logits --variant portable 2>&1 | tee "$LOG/bench_portable.txt"
  # The cp.async kernel (sm90) on the same decode shapes, beside the TMA one (sm90_tma, automatic).
  timeout 40 ./$B/bin/mla bench --ops indexer_logits --variant sm90 2>&1 | tee "$LOG/bench_sm90.txt"
fi
if has profile; then
  # Nsight Compute on the decode logits (sm90_tma) at the target shape (b 64, s_k 128K): with --iters 3
  # each config launches the kernel ~8 times (warm-up + timed), so launch 19 is one of the 128K ones
  # (LaunchStats: grid 512 = one wave of 4 CTAs / SM, 256 tiles per CTA; 8K / 32K give 16 / 64). Write
  # few files to $OUT (the device call brings back only a handful): the ncu text stays in one file.
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [ -n "$NCU" ]; then
    timeout 150 "$NCU" --kernel-name regex:logits_tma --launch-skip 19 --launch-count 1 --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats \
      --section SchedulerStats --section SourceCounters ./$B/bin/mla bench --ops indexer_logits --iters 3 \
      >"$LOG/ncu_logits.txt" 2>&1 || echo "ncu exit $?"
    grep -E "Grid Size|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Warp Cycles Per Issued|Stall|Issued Ipc" \
      "$LOG/ncu_logits.txt" | head -30
  else
    echo "no ncu"
  fi
fi
if [ "${FULL:-0}" = 1 ]; then
  timeout 90 ./$B/bin/mla_gpu_tests --gtest_brief=1 >"$LOG/gpu_tests_all.log" 2>&1 || rc=1
  grep -E "^\[  (PASSED|FAILED)|tests? from .* ran" "$LOG/gpu_tests_all.log" | tail -12
fi
echo "indexer_gpu_check exit $rc"
exit $rc
