#!/usr/bin/env bash
# One-call DCP device run (issue 13; nvidia-h200-x2): build the CLI and the GPU tests, the DCP GPU
# tests, `mla bench --ops ceilings,dcp --dcp 2`, `mla run --dcp 2`, then memcheck (without API-error
# reports: NCCL's driver probing) in what is left of LIMIT seconds (default 230). Logs in $OUT.
set -u
S=$(date +%s); el() { echo $(( $(date +%s) - S )); }
export PATH=$PATH:/usr/local/cuda/bin
nvidia-smi --query-gpu=name --format=csv,noheader | tr '\n' ' '; echo
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLA_WITH_PYTHON=OFF >"$OUT/cmake.log" 2>&1 || { tail -20 "$OUT/cmake.log"; exit 1; }
grep -i "nccl" "$OUT/cmake.log"
ninja -C build-gpu -j16 mla_cli mla_gpu_tests >"$OUT/build.log" 2>&1; rc=$?
echo "build rc $rc at $(el)s"; [ $rc = 0 ] || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
./build-gpu/bin/mla_gpu_tests --gtest_filter='LayerDcpGpu.*:DcpGpu.*:CombineGpu.*' --gtest_brief=1 >"$OUT/gpu_tests.log" 2>&1
echo "tests rc $? at $(el)s"; grep -E "FAILED|PASSED|SKIPPED|ran\." "$OUT/gpu_tests.log" | tail -8
./build-gpu/bin/mla bench --ops ceilings,dcp --dcp 2 --iters 15 >"$OUT/bench.log" 2>&1
echo "bench rc $? at $(el)s"; grep -v "^\s*$" "$OUT/bench.log" | tail -16
# The trace through the group (mla run --dcp 2: NCCL, one GPU per rank) against the float64 oracle.
./build-gpu/bin/mla run --backend cuda --dcp 2 --steps ${RUN_STEPS:-64} --no-progress >"$OUT/run_dcp.log" 2>&1
echo "run --dcp 2 rc $? at $(el)s"; grep -E "PASSED|FAILED|error|^all " "$OUT/run_dcp.log" | head -5
left=$(( ${LIMIT:-230} - $(el) )); [ $left -gt 120 ] && left=120
if [ $left -gt 20 ]; then
  timeout $left compute-sanitizer --tool memcheck --report-api-errors no ./build-gpu/bin/mla_gpu_tests \
    --gtest_filter='CombineGpu.*:DcpGpu.*' --gtest_brief=1 >"$OUT/memcheck.log" 2>&1
  echo "memcheck (limit ${left}s) rc $? at $(el)s"; grep -E "ERROR SUMMARY|PASSED|FAILED|ran\." "$OUT/memcheck.log" | tail -5
  grep -E "^========= (Invalid|Program hit|Uninit|Out of)" "$OUT/memcheck.log" | sort | uniq -c | head
  grep -E "^=========     (at|Host Frame).*" "$OUT/memcheck.log" | sort | uniq -c | sort -rn | head -8
else echo "memcheck skipped (time)"; fi
