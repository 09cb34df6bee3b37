#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One-call GPU verification on the device machine (build there, then tests, sanitizers, benchmarks,
# the main job). Usage: scripts/gpu_check.sh [steps...] with steps among
#   build tests sanitize bench run   (default: all). Logs go to $OUT (when set) or ./gpu-logs.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${OUT:-gpu-logs}
mkdir -p "$LOG"
STEPS=${*:-build tests sanitize bench run}
B=build-gpu
rc=0
has() { [[ " $STEPS " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$LOG/gpu.txt"
git rev-parse --short HEAD 2>/dev/null | tee "$LOG/commit.txt"
if has build; then
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release >"$LOG/cmake.log" 2>&1 || { tail -30 "$LOG/cmake.log"; exit 1; }
  ninja -C $B -j16 >"$LOG/build.log" 2>&1 || { grep -E "error|FAILED" "$LOG/build.log" | head -40; exit 1; }
  echo "build ok"
fi
if has tests; then
  # The binaries directly (one process each): ctest would start one process per test case.
  ./$B/bin/mla_gpu_tests --gtest_brief=1 >"$LOG/gpu_tests.log" 2>&1 || rc=1
  grep -E "^\[  (PASSED|FAILED|SKIPPED)|tests? from .* ran" "$LOG/gpu_tests.log" | tail -12
  ./$B/bin/mla_unit_tests --gtest_brief=1 >"$LOG/unit_tests.log" 2>&1 || rc=1
  grep -E "^\[  (PASSED|FAILED)|ran\." "$LOG/unit_tests.log" | tail -5
fi
# Sanitizers on every kernel family at small sizes (the exhaustive and multi-GB cases are left out:
# they take minutes under instrumentation). Each tool is time-boxed.
MEM_FILTER=${MEM_FILTER:-'Formats/WriteCacheGpu.*page16*:Formats/GatherGpu.*:GatherGpuEdge.*:DecodeGpu.*:PrefillGpu.*:All/PrefillGpuVariant.*:All/PrefillGpuSweep.*/h3_*:SparseGpu.*:MergeGpu*:TopkGpuEdge.*:LayerGpu.*:LayerGraph.*:DecodeSplitsGpu.*:All/DecodeGpuSweep.*page16_h16_*:All/DecodeGpuSweep.*page64_h128_sq2_*:Ptx*:GemmGpu*:BmmGpu*:WriteCacheGpuEdge.NarrowRowsMatchCpu-DecodeGpu.LongContextManySplits:LayerGpu.WorkspaceBoundCoversRandomPlans'}
RACE_FILTER=${RACE_FILTER:-'DecodeGpu.NonCausalNarrowValues:DecodeGpu.StridedAndUnalignedViews:PrefillGpu.UnalignedViews:All/PrefillGpuVariant.*sm90:SparseGpu.FlatWorkspaceStridedIndices:MergeGpu.Shapes:GatherGpuEdge.*:Formats/WriteCacheGpu.*page16_i64*:TopkGpuEdge.*:LayerGpu.SmallMixedDenseAllFormats:LayerGraph.DecodeOnly*:All/DecodeGpuSweep.*bf16_page64_h16_sq1_sm90:All/DecodeGpuSweep.*bf16_page64_h128_sq2_sm90:PtxPipeline.*:PtxTma.*:PtxBarrier.*'}
if has sanitize; then
  for tool in memcheck racecheck initcheck; do
    filter=$RACE_FILTER
    [ $tool = memcheck ] && filter=$MEM_FILTER
    timeout ${SANITIZE_TIMEOUT:-150} compute-sanitizer --tool $tool --error-exitcode 9 ./$B/bin/mla_gpu_tests \
      --gtest_filter="$filter" --gtest_brief=1 >"$LOG/sanitize_$tool.log" 2>&1
    status=$?
    [ $status = 0 ] || rc=1
    echo "$tool (exit $status): $(grep -E 'ERROR SUMMARY|tests? from .* ran|PASSED|FAILED' "$LOG/sanitize_$tool.log" | tr '\n' ' ')"
  done
fi
if has bench; then
  ./$B/bin/mla bench --json "$LOG/bench.json" 2>&1 | tee "$LOG/bench.txt" || rc=1
fi
if has run; then
  ./$B/bin/mla run --backend cuda 2>&1 | tail -25 | tee "$LOG/run_dense.txt"; [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  ./$B/bin/mla run --backend cuda --sparse 2>&1 | tail -25 | tee "$LOG/run_sparse.txt"; [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
exit $rc
