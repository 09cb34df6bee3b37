#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One-call DCP device run (issue 13; nvidia-h200-x2), every step bounded so the whole call fits LIMIT
# seconds (default 280; with the machine start it needs ~330 s of x2 budget): build the CLI and the GPU tests (and the Python package with PY=1), the DCP GPU
# tests (every exchange), `mla bench --ops ceilings,dcp --dcp 2` (W = 1 vs 2; the three exchanges
# alternated), `mla run --backend cuda --dcp 2` as threads and as processes (--dcp-procs), the Python
# DCP tests (PY=1: NCCL between two processes), then memcheck in what is left. Logs in $OUT.
set -u
S=$(date +%s); el() { echo $(( $(date +%s) - S )); }
left() { echo $(( ${LIMIT:-280} - $(el) )); }
export PATH=$PATH:/usr/local/cuda/bin
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # KINDS.md: never NVLink multicast
nvidia-smi --query-gpu=name --format=csv,noheader | tr '\n' ' '; echo
PYOPT=-DMLA_WITH_PYTHON=OFF; TARGETS="mla_cli mla_gpu_tests"
if [ "${PY:-0}" = 1 ]; then PYOPT=-DMLA_WITH_PYTHON=ON; TARGETS="$TARGETS mla_python"; fi
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release $PYOPT >"$OUT/cmake.log" 2>&1 || { tail -20 "$OUT/cmake.log"; exit 1; }
grep -iE "nccl|python package" "$OUT/cmake.log"
ninja -C build-gpu -j16 $TARGETS >"$OUT/build.log" 2>&1; rc=$?
echo "build rc $rc at $(el)s"; [ $rc = 0 ] || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
timeout 60 ./build-gpu/bin/mla_gpu_tests --gtest_filter="${TESTS:-DcpGpu.*:CombineGpu.*:LayerDcpGpu.*}" --gtest_brief=1 >"$OUT/gpu_tests.log" 2>&1
echo "tests rc $? at $(el)s"; grep -E "FAILED|PASSED|SKIPPED|ran\.|Failure|Expected|Which is|exchange" "$OUT/gpu_tests.log" | head -20
t=$(( $(left) - 110 )); [ $t -gt 90 ] && t=90
if [ $t -gt 20 ]; then
  timeout $t ./build-gpu/bin/mla bench --ops ceilings,dcp --dcp 2 --iters ${ITERS:-15} >"$OUT/bench.log" 2>&1
  echo "bench rc $? (limit ${t}s) at $(el)s"; grep -v "^\s*$" "$OUT/bench.log" | tail -22
else echo "bench skipped (time)"; fi
# The trace through the group against the float64 oracle: ranks as threads, then as processes.
timeout 60 ./build-gpu/bin/mla run --backend cuda --dcp 2 --steps ${RUN_STEPS:-32} --no-progress >"$OUT/run_dcp.log" 2>&1
echo "run --dcp 2 (threads) rc $? at $(el)s"; grep -E "PASSED|FAILED|error|note: --dcp|^mixed|^decode" "$OUT/run_dcp.log" | head -6
timeout 60 ./build-gpu/bin/mla run --backend cuda --dcp 2 --dcp-procs --steps ${RUN_STEPS:-32} --no-progress >"$OUT/run_dcp_procs.log" 2>&1
echo "run --dcp 2 --dcp-procs rc $? at $(el)s"; grep -E "PASSED|FAILED|error|note: --dcp|dcp-procs|^mixed|^decode" "$OUT/run_dcp_procs.log" | head -6
if [ "${PY:-0}" = 1 ] && [ $(left) -gt 25 ]; then
  PYTHONPATH=build-gpu/python timeout $(( $(left) - 10 )) python3 -m pytest -q tests/python/test_dcp.py >"$OUT/pytest_dcp.log" 2>&1
  echo "pytest test_dcp.py rc $? at $(el)s"; tail -5 "$OUT/pytest_dcp.log"
fi
l=$(( $(left) - 5 )); [ $l -gt 120 ] && l=120
if [ $l -gt 25 ]; then
  timeout $l compute-sanitizer --tool memcheck --report-api-errors no ./build-gpu/bin/mla_gpu_tests \
    --gtest_filter='CombineGpu.*:DcpGpu.*' --gtest_brief=1 >"$OUT/memcheck.log" 2>&1
  echo "memcheck (limit ${l}s) rc $? at $(el)s"; grep -E "ERROR SUMMARY|PASSED|FAILED|ran\." "$OUT/memcheck.log" | tail -5
else echo "memcheck skipped (time)"; fi
