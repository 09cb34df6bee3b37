#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One-call GPU verification of the DeepSeek block on CUDA (docs/BLOCK.md) on the device machine: build
# the GPU tests and the CLI, run the block tests (ops vs the CPU backend, the block vs transformers and
# the float64 CPU block), memcheck / racecheck on them, the SASS summary of the block's kernels and the
# block benchmark (`mla bench --ops ceilings,block`). Logs go to $OUT (or ./gpu-logs); each step is
# time-boxed so that the whole call stays under ~5 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${OUT:-gpu-logs}
mkdir -p "$LOG"
B=build-gpu
rc=0
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$LOG/gpu.txt"
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLA_WITH_PYTHON=OFF >"$LOG/cmake.log" 2>&1 || { tail -30 "$LOG/cmake.log"; exit 1; }
SECONDS=0
ninja -C $B -j16 mla_gpu_tests mla_cli >"$LOG/build.log" 2>&1 || { grep -E "error|FAILED" -A4 "$LOG/build.log" | head -60; exit 1; }
echo "build ok (${SECONDS} s)"
F=${BLOCK_FILTER:-'BlockOpsGpu*:DeepseekBlockGpu*:GemmGpu*'}
timeout ${TEST_TIMEOUT:-120} ./$B/bin/mla_gpu_tests --gtest_filter="$F" >"$LOG/tests.log" 2>&1 || rc=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[ +(OK|FAILED) +\]|tests? from .* ran|Failure|Expected|Which is|actual|  gemm_fp8|CUDA vs" \
  "$LOG/tests.log" | head -120
timeout ${MEM_TIMEOUT:-100} compute-sanitizer --tool memcheck --error-exitcode 9 ./$B/bin/mla_gpu_tests \
  --gtest_filter='BlockOpsGpu.*:DeepseekBlockGpu.V2LiteBf16*:DeepseekBlockGpu.V3Fp8*-BlockOpsGpu.GemmFp8BlockMatchesFloat64' \
  --gtest_brief=1 \
  >"$LOG/memcheck.log" 2>&1 || rc=1
echo "memcheck: $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$LOG/memcheck.log" | tr '\n' ' ')"
timeout 40 compute-sanitizer --tool racecheck --error-exitcode 9 ./$B/bin/mla_gpu_tests \
  --gtest_filter='BlockOpsGpu.ApplyRopeMatchesCpu:BlockOpsGpu.RmsNormMatchesCpu' --gtest_brief=1 \
  >"$LOG/racecheck.log" 2>&1 || rc=1
echo "racecheck: $(grep -E 'ERROR SUMMARY|RACE|PASSED|FAILED' "$LOG/racecheck.log" | head -5 | tr '\n' ' ')"
scripts/sass_summary.sh ./$B/bin/mla 'rms_norm|rope_kernel|quantize_kernel' >"$LOG/sass.txt" 2>&1; tail -8 "$LOG/sass.txt"
timeout ${BENCH_TIMEOUT:-90} ./$B/bin/mla bench --ops ceilings,block --json "$LOG/bench.json" 2>&1 \
  | tee "$LOG/bench.txt" || rc=1
exit $rc
