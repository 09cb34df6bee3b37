#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One GPU call for the sm90 sparse_mqa work (docs/design/attention_sm90.md): build (mla, mla_gpu_tests), SASS / register
# check of the sm90 kernels, the sparse + decode + NaN + sparse layer GPU tests (every variant), memcheck
# on the sparse tests, the issue-8 benchmark grid with the automatic choice of kernel (portable on a few rows).
# Usage on the device machine, from the repo root: scripts/sparse_sm90_check.sh [build] [sass] [test] [sanitize] [bench] [ab]
# Env EXTRA_TARGETS: more ninja targets (e.g. mla_unit_tests).
# Logs go to $LOGS (default $OUT, or ./gpu-logs; the device tool returns only a few files from $OUT, so
# point LOGS elsewhere and keep the summary this prints). Env: TEST_FILTER, SAN_FILTER, BENCH_ARGS, PORTABLE_ARGS,
# AB_A / AB_B / AB_ARGS / AB_ROUNDS (ab: each sparse_mqa shape of AB_ARGS, one per line, e.g. `--b 128 --h-q 16
# --topk 2048 --format fp8_ds_mla`, timed with kernel choice A and B (`mla bench --variant`, e.g. AB_B=sm90_raw)
# alternately for AB_ROUNDS rounds; see scripts/ab_bench.sh).
set -u
OUT=${LOGS:-${OUT:-gpu-logs}}; mkdir -p "$OUT"; B=build-gpu; rc=0
ARGS=" $* "
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
if [[ "$ARGS" == *" build "* ]]; then
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLA_WITH_PYTHON=OFF >"$OUT/cmake.log" 2>&1 &&
    ninja -C $B -j16 mla mla_gpu_tests ${EXTRA_TARGETS:-} >"$OUT/build.log" 2>&1 || { grep -E 'error|FAILED' "$OUT/build.log" | head -40; exit 1; }
  echo "build ok"
fi
if [[ "$ARGS" == *" sass "* ]]; then
  for O in $(find $B/CMakeFiles/mla_cuda.dir/src/cuda/attention/sm90 -path '*instantiations*' -name '*.cu.o' | sort); do
    f=$(echo "$O" | sed -E 's#.*/sm90/##; s#/instantiations/#_#; s#\.cu\.o$##')
    scripts/sass_summary.sh "$O" decode_sm90 | tee "$OUT/sass_$f.txt"
  done
fi
if [[ "$ARGS" == *" test "* ]]; then
  timeout ${TEST_TIMEOUT:-300} ./$B/bin/mla_gpu_tests --gtest_brief=1 \
    --gtest_filter="${TEST_FILTER:-*Sparse*:*Decode*:*NaN*:LayerGpu.*Sparse*:LayerGraph*:*Ptx*}" >"$OUT/tests.log" 2>&1 || rc=1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran|declined" "$OUT/tests.log" | sort | uniq -c | sort -rn | head -40
  # Failure details, the known decode NaN-rule failure of main (0067aba) last.
  grep -B2 -A12 "Failure" "$OUT/tests.log" | grep -v "^--$" | awk '/attention_nan_check/{skip=1} /layer_gpu_util|test_sparse|test_layer/{skip=0} !skip' | head -60
  grep -E "max error|rel_l2" "$OUT/tests.log" | head -20
fi
if [[ "$ARGS" == *" sanitize "* ]]; then
  for tool in ${SAN_TOOLS:-memcheck}; do
    timeout ${SAN_TIMEOUT:-150} compute-sanitizer --tool $tool --error-exitcode 9 ./$B/bin/mla_gpu_tests --gtest_brief=1 \
      --gtest_filter="${SAN_FILTER:-All/SparseGpuSweep.*page16_h*:All/SparseGpuSweep.*page1_h3_*:All/SparseGpuWidths.*topk192*:AttentionNaNGpu.Sparse*}" \
      >"$OUT/san_$tool.log" 2>&1; echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|tests ran|PASSED|FAILED' "$OUT/san_$tool.log" | tr '\n' ' ')"
  done
fi
if [[ "$ARGS" == *" bench "* ]]; then
  timeout ${BENCH_TIMEOUT:-200} ./$B/bin/mla bench --ops ceilings,sparse_mqa ${BENCH_ARGS:---grid issue8} \
    --json "$OUT/bench_sm90.json" >"$OUT/bench_sm90.txt" 2>&1 || rc=1
  grep -E "sparse_mqa|T=|copy|gemm|FAILED|rror" "$OUT/bench_sm90.txt" | cut -c1-170
  timeout 120 ./$B/bin/mla bench --ops sparse_mqa --variant portable ${PORTABLE_ARGS:---b 128 --h-q 128 --format fp8_ds_mla} \
    --json "$OUT/bench_portable.json" >"$OUT/bench_portable.txt" 2>&1 || rc=1
  grep -E "T=|FAILED|rror" "$OUT/bench_portable.txt" | cut -c1-170
fi
if [[ "$ARGS" == *" ab "* ]]; then  # two kernel choices A/B on single shapes, alternating on the same machine
  scripts/ab_bench.sh sparse_mqa "T=" ./$B/bin/mla | tee "$OUT/ab.txt"
fi
exit $rc
