#!/usr/bin/env bash
# One GPU call for the sm90 prefill work (docs/PREFILL.md, issue 9): build, SASS / register check of the
# kernel, prefill + layer GPU tests (every variant), sanitizers on the prefill tests, the issue-9 grid per
# variant, the layer bench with per-phase times; SM clock / power logged during the benchmarks.
# Usage on the device machine, from the repo root:
#   scripts/prefill_check.sh [build] [sass] [test] [bench] [ab] [layer] [sanitize]   (run in this order)
# Logs go to $OUT (or ./gpu-logs). Env: TEST_FILTER, SAN_FILTER, RACE_FILTER, BENCH_VARIANTS, BENCH_ARGS.
set -u
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"; B=build-gpu; rc=0
ARGS=" $* "
has() { [[ "$ARGS" == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
if has build; then
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release >"$OUT/cmake.log" 2>&1 &&
    ninja -C $B -j16 mla_cli mla_gpu_tests mla_unit_tests >"$OUT/build.log" 2>&1 || { grep -E 'error|FAILED' "$OUT/build.log" | head -40; exit 1; }
  echo "build ok"
fi
if has sass; then
  O=$B/CMakeFiles/mla_cuda.dir/src/cuda/prefill_sm90/launch.cu.o
  cuobjdump -sass "$O" >"$OUT/sass.txt" 2>&1
  scripts/sass_summary.sh "$O" prefill_sm90 | tee "$OUT/sass_summary.txt"
  nvcc -std=c++20 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -O3 -Iinclude -Isrc -Xptxas -v \
    -c src/cuda/prefill_sm90/launch.cu -o /tmp/p.o 2>&1 | grep -E "registers|spill|C7515|C7508" | tee "$OUT/ptxas.txt"
fi
if has test; then
  timeout ${TEST_TIMEOUT:-180} ./$B/bin/mla_gpu_tests --gtest_brief=1 \
    --gtest_filter="${TEST_FILTER:-*Prefill*:LayerGpu.*:LayerGraph.*}" >"$OUT/tests.log" 2>&1 || rc=1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran|^  (gpu|cpu|bf16ref|[0-9]+ elements)" "$OUT/tests.log" | head -40
  grep -B2 -A8 "Failure" "$OUT/tests.log" | head -60
  timeout 120 ./$B/bin/mla_unit_tests --gtest_brief=1 >"$OUT/unit_tests.log" 2>&1 || rc=1
  grep -E "^\[  (PASSED|FAILED) |tests ran" "$OUT/unit_tests.log" | head -8
fi
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 250 >"$OUT/clocks.csv" 2>&1 &
SMI=$!
if has bench; then
  for v in ${BENCH_VARIANTS:-sm90 sm90_persist}; do
    timeout 200 ./$B/bin/mla bench --ops ceilings,mha_prefill ${BENCH_ARGS:---grid issue9 --iters 20} --variant $v \
      --json "$OUT/bench_$v.json" >"$OUT/bench_$v.txt" 2>&1 || rc=1
    echo "== $v ($(date -u +%T))"; grep -E "mha_prefill|b=|copy|gemm|FAILED" "$OUT/bench_$v.txt" | cut -c1-130
  done
fi
if has ab; then
  # Interleaved A/B per shape (the GPU power-throttles under sustained load: a whole grid per variant
  # measures later rows at lower clocks): sm90_1cta and sm90_persist back to back, order alternating.
  i=0
  while read -r b s k h nc; do
    vs="sm90_1cta sm90_persist"; [ $((i % 2)) = 1 ] && vs="sm90_persist sm90_1cta"; i=$((i + 1))
    for v in $vs; do
      timeout 60 ./$B/bin/mla bench --ops mha_prefill --b $b --s-q $s --s-k $k --h-q $h $nc --iters 20 --variant $v 2>&1 |
        grep -E "^  b=" | tee -a "$OUT/ab.txt"
    done
  done <<'SHAPES'
1 1024 1024 16
1 1024 1024 128
1 4096 4096 16
1 4096 4096 128
1 16384 16384 16
1 16384 16384 128
4 1024 1024 16
4 1024 1024 128
4 4096 4096 16
4 4096 4096 128
4 16384 16384 16
4 16384 16384 128
1 1024 8192 16 --non-causal
1 1024 8192 128 --non-causal
4 1024 8192 16 --non-causal
4 1024 8192 128 --non-causal
2 2048 2048 128
1 2048 4096 128 --non-causal
SHAPES
fi
if has layer; then
  timeout 200 ./$B/bin/mla bench --ops ceilings,layer --json "$OUT/bench_layer.json" >"$OUT/bench_layer.txt" 2>&1 || rc=1
  echo "== layer ($(date -u +%T))"; grep -E "^  [0-9b]|phases|FAILED" "$OUT/bench_layer.txt" | cut -c1-400
fi
kill $SMI 2>/dev/null
if has sanitize; then
  MEM=${SAN_FILTER:-'PrefillGpu.*:All/PrefillGpuVariant.*:All/PrefillGpuSweep.*h3_*:All/PrefillGpuSweep.*h128_causal_sm90*'}
  RACE=${RACE_FILTER:-'All/PrefillGpuVariant.*sm90*:All/PrefillGpuSweep.*h3_*sm90*'}
  for tool in memcheck racecheck; do
    filter=$MEM; [ $tool = racecheck ] && filter=$RACE
    timeout ${SAN_TIMEOUT:-90} compute-sanitizer --tool $tool --error-exitcode 9 ./$B/bin/mla_gpu_tests --gtest_brief=1 \
      --gtest_filter="$filter" >"$OUT/san_$tool.log" 2>&1
    s=$?; [ $s = 0 ] || rc=1
    echo "$tool rc=$s $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|tests ran|PASSED|FAILED' "$OUT/san_$tool.log" | tr '\n' ' ' | cut -c1-300)"
  done
fi
exit $rc
