#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One GPU call for the sm90 decode work (docs/design/attention_sm90.md): build, SASS / register check of the
# kernels, decode GPU tests (every variant), optional sanitizers, the issue-7 benchmark grid per variant.
# Steps run in this order: build sass test bench ab kernels profile sanitize.
# Usage on the device machine, from the repo root:
#   scripts/decode_sm90_check.sh [build] [sass] [test] [sanitize] [bench] [ab] [kernels] [profile]
# Logs go to $OUT (or ./gpu-logs). Env: TEST_FILTER, SAN_FILTER, RACE_FILTER (racecheck's own), SAN_TOOLS, BENCH_ARGS,
# BENCH_VARIANTS (`mla bench --variant` per grid run; "auto": the automatic choice), KERNEL_ARGS (bench rows, one
# per line, rerun with each sm90 kernel forced: --variant sm90_small / sm90_raw / sm90_seesaw / sm90_convert; a kernel that cannot
# run the row says so), PROFILE_ARGS (one shape under ncu), AB_A / AB_B / AB_ARGS / AB_ROUNDS (ab: each shape of
# AB_ARGS, one per line, timed with kernel choice A and B alternately for AB_ROUNDS rounds in one run; see
# scripts/ab_bench.sh), TEST_ENV (test, sanitize: an environment the tests run under; unset: none).
set -u
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"; B=build-gpu; rc=0
want() { [ $# -eq 0 ] || [[ " $ARGS " == *" $1 "* ]]; }
ARGS=" $* "
if [[ "$ARGS" == *" build "* ]]; then
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release >"$OUT/cmake.log" 2>&1 &&
    ninja -C $B -j16 ${BUILD_TARGETS:-mla_cli mla_gpu_tests} >"$OUT/build.log" 2>&1 || { grep -E 'error|FAILED' "$OUT/build.log" | head -40; exit 1; }
  echo "build ok"
fi
if [[ "$ARGS" == *" sass "* ]]; then
  # The kernels live in the instantiation files of each kernel folder (src/cuda/attention/sm90/*/instantiations/).
  : >"$OUT/sass.txt"; : >"$OUT/sass_summary.txt"; : >"$OUT/ptxas.txt"
  for O in $(find $B/CMakeFiles/mla_cuda.dir/src/cuda/attention/sm90 -path '*instantiations*' -name '*.cu.o' | sort); do
    cuobjdump -sass "$O" >>"$OUT/sass.txt" 2>&1
    scripts/sass_summary.sh "$O" decode_sm90 | tee -a "$OUT/sass_summary.txt"
  done
  if [ "${PTXAS:-1}" = 1 ]; then
    for f in src/cuda/attention/sm90/*/instantiations/*.cu; do
      echo "== $f" >>"$OUT/ptxas.txt"
      nvcc -std=c++20 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -O3 -Iinclude -Isrc -Xptxas -v \
        -c "$f" -o /tmp/d.o 2>&1 | grep -E "registers|spill|C7508|C751[45]" >>"$OUT/ptxas.txt"
    done
    cat "$OUT/ptxas.txt"
  fi
fi
if [[ "$ARGS" == *" test "* ]]; then
  echo "tests under: ${TEST_ENV:-}"
  env ${TEST_ENV:-} timeout ${TEST_TIMEOUT:-300} ./$B/bin/mla_gpu_tests --gtest_brief=1 \
    --gtest_filter="${TEST_FILTER:-*Decode*:*Ptx*}" >"$OUT/tests.log" 2>&1 || rc=1
  grep -E "tests? from .* ran" "$OUT/tests.log" | tail -1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED|tests ran" "$OUT/tests.log" | sort | uniq | head -30
  grep -B2 -A8 "Failure" "$OUT/tests.log" | head -60
fi
if [[ "$ARGS" == *" bench "* ]]; then
  for v in ${BENCH_VARIANTS:-auto portable}; do
    vargs=""; [ "$v" = auto ] || vargs="--variant $v"
    timeout 240 ./$B/bin/mla bench --ops ceilings,mqa_decode ${BENCH_ARGS:---grid issue7} $vargs \
      --json "$OUT/bench_$v.json" >"$OUT/bench_$v.txt" 2>&1 || rc=1
    grep -E "mqa_decode|b=|copy|gemm|FAILED" "$OUT/bench_$v.txt" | cut -c1-150
  done
fi
if [[ "$ARGS" == *" ab "* ]]; then  # two kernel choices A/B on single shapes, alternating on the same machine
  scripts/ab_bench.sh mqa_decode "b=" ./$B/bin/mla | tee "$OUT/ab.txt"
fi
if [[ "$ARGS" == *" kernels "* ]]; then  # the same shapes on each sm90 kernel, forced (in one run)
  while read -r args; do
    [ -z "$args" ] && continue
    for v in sm90_small sm90_raw sm90_seesaw sm90_convert; do
      timeout 60 ./$B/bin/mla bench --ops ceilings,mqa_decode $args --variant $v \
        2>&1 | grep -E "b=|copy|cannot" | cut -c1-150 | sed "s/^/$v: /"
    done
  done <<<"${KERNEL_ARGS:-}"
fi
if [[ "$ARGS" == *" profile "* ]] && command -v ncu >/dev/null; then  # kernel durations of one shape
  timeout 120 ncu -k regex:decode --metrics gpu__time_duration.sum,sm__cycles_active.avg,launch__grid_size --launch-skip 10 --launch-count 6 \
    ./$B/bin/mla bench --ops mqa_decode ${PROFILE_ARGS:---b 4 --s-q 1 --h-q 16 --s-k 1024} --iters 3 --warmup 10 \
    >"$OUT/ncu.txt" 2>&1; grep -E "decode|combine|duration|grid_size|cycles" "$OUT/ncu.txt" | cut -c1-140 | head -40
fi
if [[ "$ARGS" == *" sanitize "* ]]; then
  for tool in ${SAN_TOOLS:-memcheck racecheck initcheck}; do
    env ${TEST_ENV:-} timeout ${SAN_TIMEOUT:-200} compute-sanitizer --tool $tool --error-exitcode 9 ./$B/bin/mla_gpu_tests --gtest_brief=1 \
      --gtest_filter="$( [ $tool = racecheck ] && [ -n "${RACE_FILTER:-}" ] && echo "$RACE_FILTER" || echo "${SAN_FILTER:-*DecodeGpuSweep*bf16_page16_h16_sq8_sm90*:*DecodeGpuSweep*bf16_page64_h3_sq8_sm90*:*GarbageMetadata*}")" \
      >"$OUT/san_$tool.log" 2>&1; echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_$tool.log" | tail -1)"
  done
fi
exit $rc
