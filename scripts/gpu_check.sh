#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The whole GPU check (docs/DEVELOPING.md "The GPU check"): run on the GPU machine from a clean checkout
# before any issue that touches GPU code is resolved, and on a machine of two or four GPUs whenever DCP
# code changed. Parts, in order (default: all of the required ones):
#   build   configure and build everything (library, CLI, tests, Python package) into build-gpu
#   unit    the CPU unit tests (mla_unit_tests)
#   gpu     every GPU test case (mla_gpu_tests, all GPUs visible: the DCP cases run at W = min(GPUs, 4))
#   pytest  the whole pytest suite with the machine's torch (torch ops, torch.compile, CUDA graphs, compat,
#           DCP processes at every GPU count present)
#   dcp     per GPU count W in {2, 4} that the machine has: the DCP GPU tests with W GPUs visible (the full
#           gpu part already ran them at the largest W), `mla run --backend cuda --dcp W` as threads and as
#           processes, and the DCP pytest cases of that W
#   run     `mla run --backend cuda` dense and sparse (the serving trace against the float64 oracle), and the
#           DeepSeek block with fp8 prefill (`--block --cache fp8_ds_mla --fp8-prefill`) against its float64 twin
# Optional parts (named explicitly): sanitize (memcheck / racecheck / initcheck over the kernel families at
# small sizes), bench (`mla bench --json`), wheel (`pip wheel` of the checkout, fat by default, installed into a
# fresh virtual environment that sees the machine's torch; its architectures, its links, and the whole pytest
# suite against the installed package).
# Usage: scripts/gpu_check.sh [parts...]. A part that fails prints FAIL and the script goes on; the exit
# status is non-zero when any part failed. One summary line per part at the end (also in summary.txt). Logs
# go to $GPU_CHECK_LOGS (default gpu-logs); under the device tool, $OUT gets summary_<parts>.txt and one archive
# of the logs per call. Parts can be split across calls of a warm machine: the build stays in build-gpu.
set -uo pipefail
cd "$(dirname "$0")/.."
PARTS=${*:-build unit gpu pytest dcp run}
LOG=$(realpath -m "${GPU_CHECK_LOGS:-gpu-logs}")
B=${BUILD_DIR:-build-gpu}
mkdir -p "$LOG"
export PATH=$PATH:/usr/local/cuda/bin
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/$B/python
# Never NVLink multicast on the lent machines (their fabric refuses it).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
JOBS=$(nproc)
GPUS=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
SUMMARY="$LOG/summary.txt"
: >"$SUMMARY"
failed=0
has() { [[ " $PARTS " == *" $1 "* ]]; }
# record PART STATUS DETAIL SECONDS
record() {
  local line
  line=$(printf '%-28s %-4s %s (%ss)' "$1" "$2" "$3" "$4")
  echo "== $line"
  echo "$line" >>"$SUMMARY"
  [ "$2" = PASS ] || failed=1
}
# gtest_counts LOG: "N passed, M skipped, K failed" from a gtest log.
gtest_counts() {
  local p s f
  p=$(grep -oE '^\[  PASSED  \] [0-9]+' "$1" | grep -oE '[0-9]+$' | tail -1)
  s=$(grep -oE '^\[  SKIPPED \] [0-9]+' "$1" | grep -oE '[0-9]+$' | tail -1)
  f=$(grep -oE '^ *[0-9]+ FAILED TESTS?' "$1" | grep -oE '[0-9]+' | tail -1)
  echo "${p:-0} passed, ${s:-0} skipped, ${f:-0} failed"
}
# gtest PART LOG [env...] -- args: runs the GPU test binary, records the counts.
gtest() {
  local part=$1 log=$2 t0=$SECONDS
  shift 2
  # Line-buffered, so that a run stopped at its time limit still names the test it was in.
  timeout "${GTEST_TIMEOUT:-540}" stdbuf -oL -eL env "$@" >"$log" 2>&1
  local rc=$?
  local st=PASS
  [ $rc = 0 ] || st=FAIL
  local detail
  detail="$(gtest_counts "$log"), exit $rc"
  [ $rc = 124 ] && detail="$detail, timed out in $(grep -E '^\[ RUN +\]' "$log" | tail -1 | sed -E 's/^\[ RUN +\] //')"
  record "$part" $st "$detail" $((SECONDS - t0))
  [ $st = PASS ] || grep -E '^\[  FAILED  \] [A-Za-z]|Failure$' "$log" | head -20
}
# gtest_shards PART LOG N cmd...: the GPU test binary as N gtest shards at once (one GPU runs the suite's many
# small cases faster side by side), each under GTEST_TIMEOUT with its own log LOG.I; LOG gets them all, the
# counts are summed, a stopped shard names the test it was in.
gtest_shards() {
  local part=$1 log=$2 n=$3 t0=$SECONDS i
  shift 3
  local pids=()
  for ((i = 0; i < n; i++)); do
    GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i timeout "${GTEST_TIMEOUT:-540}" stdbuf -oL -eL "$@" >"$log.$i" 2>&1 &
    pids+=($!)
  done
  local rc=0 r p=0 s=0 f=0 cp cs cf stopped=""
  for ((i = 0; i < n; i++)); do
    wait "${pids[$i]}"
    r=$?
    [ $rc = 0 ] && rc=$r
    read -r cp _ cs _ cf _ <<<"$(gtest_counts "$log.$i" | tr -d ,)"  # "N passed M skipped K failed"
    p=$((p + cp)) s=$((s + cs)) f=$((f + cf))
    [ $r = 124 ] && stopped="$stopped shard $i timed out in $(grep -E '^\[ RUN +\]' "$log.$i" | tail -1 | sed -E 's/^\[ RUN +\] //');"
  done
  cat "$log".[0-9]* >"$log"
  local st=PASS
  [ $rc = 0 ] || st=FAIL
  record "$part" $st "$p passed, $s skipped, $f failed ($n shards), exit $rc${stopped:+,$stopped}" $((SECONDS - t0))
  [ $st = PASS ] || grep -E '^\[  FAILED  \] [A-Za-z]|Failure$' "$log" | head -20
}
# pytest_run PART LOG args...: records pytest's last line.
pytest_run() {
  local part=$1 log=$2 t0=$SECONDS
  shift 2
  timeout "${PYTEST_TIMEOUT:-1200}" "${PYTEST_PYTHON:-python3}" -m pytest -q -p no:cacheprovider -rs "$@" >"$log" 2>&1
  local rc=$? st=PASS
  [ $rc = 0 ] || st=FAIL
  record "$part" $st "$(tail -1 "$log"), exit $rc" $((SECONDS - t0))
  [ $st = PASS ] || grep -E "^FAILED|Error" "$log" | head -20
}
# cli PART LOG args...: `mla` with a time limit; passes on exit 0.
cli() {
  local part=$1 log=$2 t0=$SECONDS
  shift 2
  timeout "${RUN_TIMEOUT:-300}" ./$B/bin/mla "$@" >"$log" 2>&1
  local rc=$? st=PASS
  [ $rc = 0 ] || st=FAIL
  record "$part" $st "$(grep -E 'PASSED|FAILED|passed|failed' "$log" | tail -1 | cut -c1-90), exit $rc" $((SECONDS - t0))
  [ $st = PASS ] || tail -15 "$log"
}
# first_gpus N: CUDA_VISIBLE_DEVICES for the first N GPUs.
first_gpus() { seq -s, 0 $(($1 - 1)); }

{
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
  # The device machine's copy can hold one commit's files under an older HEAD: the tree's fingerprint
  # (scripts/tree_fingerprint.sh, the same on any machine holding the same sources) says which sources ran.
  changed=$(git status --porcelain --untracked-files=no 2>/dev/null | wc -l)
  echo "commit ${MLA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}$([ "$changed" -gt 0 ] && echo " + $changed changed files")  tree $(scripts/tree_fingerprint.sh 2>/dev/null || echo unknown)  $(date -u '+%F %T') UTC  gpus $GPUS"
} | tee "$LOG/machine.txt"

if has build; then
  t0=$SECONDS
  if cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release >"$LOG/cmake.log" 2>&1 &&
     ninja -C $B -j"$JOBS" >"$LOG/build.log" 2>&1; then
    record build PASS "$(grep -E 'mla: (CUDA|Python|NCCL)' "$LOG/cmake.log" | tr '\n' ' ' | cut -c1-100)" $((SECONDS - t0))
  else
    record build FAIL "see build.log" $((SECONDS - t0))
    grep -E "error|FAILED" "$LOG/build.log" "$LOG/cmake.log" | head -30
    PARTS=""  # nothing else can run
  fi
fi
if has unit; then
  gtest unit "$LOG/unit.log" OMP_WAIT_POLICY=passive ./$B/bin/mla_unit_tests --gtest_brief=1
fi
if has gpu; then
  gtest_shards "gpu (W=$(( GPUS < 4 ? GPUS : 4 )))" "$LOG/gpu.log" "${GPU_SHARDS:-3}" ./$B/bin/mla_gpu_tests
fi
if has pytest; then
  pytest_run "pytest (GPUs $GPUS)" "$LOG/pytest.log" tests/python
fi
if has dcp; then
  for w in 2 4; do
    [ "$GPUS" -ge $w ] || continue
    vis=$(first_gpus $w)
    if [ "$w" -lt "$GPUS" ] || ! has gpu; then  # the gpu part ran these at the largest W already
      gtest "dcp W=$w gtest" "$LOG/dcp${w}_gtest.log" CUDA_VISIBLE_DEVICES=$vis ./$B/bin/mla_gpu_tests \
        --gtest_filter='*Dcp*:PeerExchange*:CombineGpu*'
    fi
    CUDA_VISIBLE_DEVICES=$vis cli "dcp W=$w run threads" "$LOG/dcp${w}_run.log" run --backend cuda --dcp $w --no-progress
    CUDA_VISIBLE_DEVICES=$vis cli "dcp W=$w run processes" "$LOG/dcp${w}_procs.log" run --backend cuda --dcp $w \
      --dcp-procs --no-progress
    if [ "$w" -lt "$GPUS" ] || ! has pytest; then  # the pytest part ran the largest W's cases already
      CUDA_VISIBLE_DEVICES=$vis pytest_run "dcp W=$w pytest" "$LOG/dcp${w}_pytest.log" tests/python/test_dcp.py
    fi
  done
  [ "$GPUS" -ge 2 ] || record dcp PASS "one GPU: W = 1 ran in the gpu part; no multi-GPU DCP here" 0
fi
if has run; then
  cli "run dense" "$LOG/run_dense.log" run --backend cuda --no-progress
  cli "run sparse" "$LOG/run_sparse.log" run --backend cuda --sparse --no-progress
  # The DeepSeek block (V3 shapes, random fp8 weights) with fp8 prefill over fp8_ds_mla against its float64 twin.
  cli "run block fp8 prefill" "$LOG/run_block_fp8.log" run --backend cuda --block --cache fp8_ds_mla --fp8-prefill \
    --steps 16 --no-progress
  # The DeepSeek-V4.1 block (V4-Flash shapes, random fp8 weights, v41 + v41_fp4 caches) against its float64 twin.
  cli "run v4 block" "$LOG/run_v4.log" run --backend cuda --model v41-flash --steps 16 --no-progress
fi
if has sanitize; then
  MEM_FILTER=${MEM_FILTER:-'Formats/WriteCacheGpu.*page16*:Formats/GatherGpu.*:GatherGpuEdge.*:DecodeGpu.*:PrefillGpu.*:All/PrefillGpuVariant.*:All/PrefillGpuSweep.*/h3_*:SparseGpu.*:MergeGpu*:TopkGpuEdge.*:LayerGpu.*:LayerGraph.*:DecodeSplitsGpu.*:All/DecodeGpuSweep.*page16_h16_*:All/DecodeGpuSweep.*page64_h128_sq2_*:Ptx*:GemmGpu*:BmmGpu*:WriteCacheGpuEdge.*-DecodeGpu.LongContextManySplits:LayerGpu.WorkspaceBoundCoversRandomPlans'}
  RACE_FILTER=${RACE_FILTER:-'DecodeGpu.NonCausalNarrowValues:DecodeGpu.StridedAndUnalignedViews:PrefillGpu.UnalignedViews:All/PrefillGpuVariant.*sm90:SparseGpu.FlatWorkspaceStridedIndices:MergeGpu.Shapes:GatherGpuEdge.*:Formats/WriteCacheGpu.*page16_i64*:TopkGpuEdge.*:LayerGpu.SmallMixedDenseAllFormats:LayerGraph.DecodeOnly*:All/DecodeGpuSweep.*bf16_page64_h16_sq1_sm90:All/DecodeGpuSweep.*bf16_page64_h128_sq2_sm90:PtxPipeline.*:PtxTma.*:PtxBarrier.*'}
  for tool in memcheck racecheck initcheck; do
    filter=$RACE_FILTER
    [ $tool = memcheck ] && filter=$MEM_FILTER
    t0=$SECONDS
    timeout "${SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool $tool --error-exitcode 9 ./$B/bin/mla_gpu_tests \
      --gtest_filter="$filter" --gtest_brief=1 >"$LOG/sanitize_$tool.log" 2>&1
    st=$?
    res=PASS
    [ $st = 0 ] || res=FAIL
    record "sanitize $tool" $res "$(grep -E 'ERROR SUMMARY' "$LOG/sanitize_$tool.log" | tail -1), $(gtest_counts "$LOG/sanitize_$tool.log"), exit $st" $((SECONDS - t0))
  done
fi
if has bench; then
  t0=$SECONDS
  if ./$B/bin/mla bench --json "$LOG/bench.json" >"$LOG/bench.txt" 2>&1; then
    record bench PASS "bench.json" $((SECONDS - t0))
  else
    record bench FAIL "see bench.txt" $((SECONDS - t0))
  fi
fi

if has wheel; then
  # The machine's python3 may itself be a virtual environment (torch's): the fresh one sees its packages
  # through a .pth line, so that pip builds against, and the tests import, the machine's torch.
  W=${WHEEL_DIR:-/tmp/mla-wheel}
  rm -rf "$W" && mkdir -p "$W"
  t0=$SECONDS
  python3 -m venv "$W/venv" >"$LOG/wheel_build.log" 2>&1 || python3 -m venv --without-pip "$W/venv" >>"$LOG/wheel_build.log" 2>&1
  wpy=$W/venv/bin/python
  python3 -c 'import sys; print("\n".join(p for p in sys.path if p.endswith(("site-packages", "dist-packages"))))' \
    >"$("$wpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/machine_site.pth"
  wpip=("$wpy" -m pip)
  [ -x "$W/venv/bin/pip" ] || wpip=(python3 -m pip --python "$wpy")  # a venv without ensurepip
  if (unset PYTHONPATH; export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 CMAKE_BUILD_PARALLEL_LEVEL=$JOBS
      "${wpip[@]}" wheel --no-build-isolation --no-deps -w "$W/dist" --config-settings "build-dir=$W/build" \
        ${WHEEL_CMAKE_ARGS:+--config-settings "cmake.args=$WHEEL_CMAKE_ARGS"} . &&
      "${wpip[@]}" install --no-deps "$W"/dist/mla-*.whl) >>"$LOG/wheel_build.log" 2>&1; then
    record "wheel build" PASS "$(cd "$W/dist" && ls mla-*.whl) $(du -m "$W"/dist/mla-*.whl | cut -f1) MB" $((SECONDS - t0))
    so=$(cd "$W" && unset PYTHONPATH && "$wpy" -c 'import mla, glob, os, sys
assert mla.__file__.startswith(sys.prefix), mla.__file__
print(glob.glob(os.path.join(os.path.dirname(mla.__file__), "_mla*.so"))[0])')
    t0=$SECONDS
    {
      echo "extension: $so"
      echo "---- ldd"
      ldd "$so"
      echo "---- elf"
      cuobjdump --list-elf "$so"
      echo "---- ptx"
      cuobjdump --list-ptx "$so"
    } >"$LOG/wheel_archs.log" 2>&1
    sass=$(grep -oE '\.sm_[0-9]+a?\.' "$LOG/wheel_archs.log" | tr -d . | sort -u | tr '\n' ' ')
    ptx=$(grep -oE '\.(sm|compute)_[0-9]+a?\.ptx' "$LOG/wheel_archs.log" | sed -E 's/\.ptx//; s/^\.//' | sort -u | tr '\n' ' ')
    links=$(sed -n '/^---- ldd$/,/^---- elf$/p' "$LOG/wheel_archs.log" | grep -oE 'lib(cudart|cublas|cublasLt|nccl)[^ ]*' |
      sort -u | tr '\n' ' ')
    st=PASS
    grep -q 'libcudart' <<<"$links" && st=FAIL  # the runtime is linked statically
    [ "$GPUS" -gt 0 ] && ! grep -q 'sm_90a' <<<"$sass" && st=FAIL  # a GPU machine's wheel carries the Hopper kernels
    record "wheel archs" $st "sass: $sass ptx: $ptx links: $links" $((SECONDS - t0))
    # From outside the checkout, with no path into a build tree: the tests import the installed package.
    src=$PWD
    pushd "$W" >/dev/null
    saved_pythonpath=$PYTHONPATH
    unset PYTHONPATH
    PYTEST_PYTHON=$wpy pytest_run "wheel pytest (GPUs $GPUS)" "$LOG/wheel_pytest.log" "$src/tests/python"
    export PYTHONPATH=$saved_pythonpath
    popd >/dev/null
  else
    record "wheel build" FAIL "see wheel_build.log" $((SECONDS - t0))
    tail -20 "$LOG/wheel_build.log"
  fi
fi

echo "---- summary ($(cat "$LOG/machine.txt" | tail -1))"
cat "$SUMMARY"
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
  tag=$(echo "$PARTS" | tr -s ' ' '_')
  cp "$SUMMARY" "$OUT/summary_${tag:-none}.txt"
  tar czf "$OUT/logs_${tag:-none}.tgz" -C "$LOG" . 2>/dev/null
fi
exit $failed
