#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One GPU call for the sm90 prefill work (docs/design/prefill_sm90.md, issue 9): build, SASS / register check of the
# kernel, prefill + layer GPU tests (every variant), sanitizers on the prefill tests, the issue-9 grid per
# variant, the layer bench with per-phase times; SM clock / power logged during the benchmarks.
# Usage on the device machine, from the repo root:
#   scripts/prefill_check.sh [build] [sass] [test] [bench] [ab] [layer] [ncu] [sanitize]   (run in this order)
# Logs go to $OUT (or ./gpu-logs). Env: BUILD_TARGETS (the unit tests run only when built), TEST_FILTER, SAN_FILTER, RACE_FILTER, BENCH_VARIANTS, BENCH_ARGS,
# AB_VARIANTS / AB_SHAPES (ab: lines "b s_q s_k h rounds [--non-causal]"; each round runs every variant
# once, the order rotated by one per round; each run's UTC start / end goes beside its row, to be read
# against clocks.csv), NCU_ARGS / NCU_VARIANTS (ncu: one profiled launch of that shape per variant).
set -u
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"; B=build-gpu; rc=0
ARGS=" $* "
has() { [[ "$ARGS" == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
if has build; then
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release >"$OUT/cmake.log" 2>&1 &&
    ninja -C $B -j16 ${BUILD_TARGETS:-mla_cli mla_gpu_tests mla_unit_tests} >"$OUT/build.log" 2>&1 || { grep -E 'error|FAILED' "$OUT/build.log" | head -40; exit 1; }
  echo "build ok"
fi
if has sass; then
  O=$B/CMakeFiles/mla_cuda.dir/src/cuda/attention/sm90/prefill/launch.cu.o
  cuobjdump -sass "$O" >"$OUT/sass.txt" 2>&1
  scripts/sass_summary.sh "$O" prefill_sm90 | tee "$OUT/sass_summary.txt"
  # wgmma waits per kernel: ptxas adds WARPGROUP.DEPBAR / ARRIVE where it serialises products (silently
  # for a branch with products in flight); equal counts across instantiations mean equal pipelines.
  awk '/Function : /{fn=$3} /HGMMA/{h[fn]++} /WARPGROUP.DEPBAR/{d[fn]++} /WARPGROUP.ARRIVE/{a[fn]++}
    END{for (f in h) printf "%s HGMMA=%d DEPBAR=%d ARRIVE=%d\n", substr(f,1,90), h[f], d[f], a[f]}' "$OUT/sass.txt" |
    tee -a "$OUT/sass_summary.txt"
  nvcc -std=c++20 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -O3 -Iinclude -Isrc -Xptxas -v \
    -c src/cuda/attention/sm90/prefill/launch.cu -o /tmp/p.o 2>&1 | grep -E "registers|spill|C7515|C7508" | tee "$OUT/ptxas.txt"
fi
if has test; then
  timeout ${TEST_TIMEOUT:-180} ./$B/bin/mla_gpu_tests --gtest_brief=1 \
    --gtest_filter="${TEST_FILTER:-*Prefill*:LayerGpu.*:LayerGraph.*}" >"$OUT/tests.log" 2>&1 || rc=1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran|^  (gpu|cpu|bf16ref|[0-9]+ elements)" "$OUT/tests.log" | head -40
  grep -B2 -A8 "Failure" "$OUT/tests.log" | head -60
  if [ -x ./$B/bin/mla_unit_tests ]; then
    timeout 120 ./$B/bin/mla_unit_tests --gtest_brief=1 >"$OUT/unit_tests.log" 2>&1 || rc=1
    grep -E "^\[  (PASSED|FAILED) |tests ran" "$OUT/unit_tests.log" | head -8
  fi
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
  # measures later rows at lower clocks): the variants back to back, order rotating per round.
  read -r -a vs <<<"${AB_VARIANTS:-sm90_1cta sm90_persist}"
  while read -r b s k h rounds nc; do
    [ -z "$b" ] && continue
    for ((r = 0; r < rounds; r++)); do
      for ((i = 0; i < ${#vs[@]}; i++)); do
        v=${vs[$(((i + r) % ${#vs[@]}))]}
        t0=$(date -u +%T.%3N)
        row=$(timeout 60 ./$B/bin/mla bench --ops mha_prefill --b $b --s-q $s --s-k $k --h-q $h $nc --iters 20 --variant $v 2>&1 |
          grep -E "^  (b=|equal)" | tr -s ' ' | tr '\n' '|')
        echo "$t0-$(date -u +%T.%3N) $v $row" | tee -a "$OUT/ab.txt"
      done
    done
  done <<<"${AB_SHAPES:-1 1024 1024 16 1
1 1024 1024 128 1
1 4096 4096 16 1
1 4096 4096 128 1
4 1024 1024 16 1
4 1024 1024 128 1
4 4096 4096 16 1
4 4096 4096 128 2
1 1024 8192 16 1 --non-causal
1 1024 8192 128 1 --non-causal
4 1024 8192 128 1 --non-causal
2 2048 2048 128 1}"
fi
if has layer; then
  timeout 200 ./$B/bin/mla bench --ops ceilings,layer --json "$OUT/bench_layer.json" >"$OUT/bench_layer.txt" 2>&1 || rc=1
  echo "== layer ($(date -u +%T))"; grep -E "^  [0-9b]|phases|FAILED" "$OUT/bench_layer.txt" | cut -c1-400
fi
if has ncu; then
  # One launch per variant under Nsight Compute at the GPU's own clock: speed of light, pipes, memory,
  # stall reasons.
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  for v in ${NCU_VARIANTS:-sm90_persist}; do
    timeout ${NCU_TIMEOUT:-100} $NCU --clock-control none -k regex:mha_prefill_sm90 -c 1 --section SpeedOfLight \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
      --section Occupancy ./$B/bin/mla bench --ops mha_prefill ${NCU_ARGS:---b 4 --s-q 4096 --s-k 4096 --h-q 128} \
      --iters 1 --warmup 0 --variant $v >"$OUT/ncu_$v.txt" 2>&1
    echo "== ncu $v rc=$? ($(date -u +%T))"
    grep -E "Frequency|Throughput|Pipe|Tensor|Hit Rate|Stall|Issued|Eligible|Duration|Busy" "$OUT/ncu_$v.txt" | head -40
  done
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
# The device returns few files: pack the logs (the tarball and the small summaries come back).
tar czf "$OUT/logs.tgz" -C "$OUT" --exclude logs.tgz . 2>/dev/null
exit $rc
