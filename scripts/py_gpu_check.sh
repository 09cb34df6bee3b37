#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One-call check of the Python package on the device machine (docs/PYTHON.md): build the library and
# the package there (-j16), then the whole pytest suite with the machine's torch (CUDA cases included:
# custom ops under torch.compile, CUDA graph capture and replay, torch's op checker, compat on cuda),
# the Python benchmark, and the FlashMLA-API example script's full case list on cuda. Logs and bench JSON go to $OUT
# (when set) or ./gpu-logs. MLA_COMMIT names the commit when the tree is a copy without .git.
# Usage: scripts/py_gpu_check.sh [steps...], steps among  build pytest script bench  (default: all;
# scripts/py_indexer_gpu_check.sh runs them in another order beside the indexer's checks).
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${OUT:-gpu-logs}
mkdir -p "$LOG"
B=${BUILD_DIR:-build-gpu}
STEPS=${*:-build pytest script bench}
has() { [[ " $STEPS " == *" $1 "* ]]; }
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/$B/python
rc=0
if has build; then
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    echo "commit ${MLA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}  $(date -u +%F)"
    python3 -c "import sys, torch, numpy, pytest; print('python', sys.version.split()[0], 'torch', torch.__version__,
'cuda', torch.version.cuda, torch.cuda.is_available(), 'numpy', numpy.__version__, 'pytest', pytest.__version__)"
  } 2>&1 | tee "$LOG/env.txt"
  t0=$SECONDS
  mkdir -p $B  # build logs stay in $B (at most 8 files come back from the device)
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release >"$B/cmake.log" 2>&1 || { tail -30 "$B/cmake.log"; exit 1; }
  grep "mla: Python" "$B/cmake.log"
  ninja -C $B -j16 mla_python >"$B/build.log" 2>&1 || { grep -E "error|FAILED" "$B/build.log" | head -40; exit 1; }
  echo "build ok ($((SECONDS - t0)) s)"
  python3 -c "import mla; assert mla.built_with_cuda() and mla.cuda_device_count() > 0, 'mla without CUDA'" || exit 1
fi
if has pytest; then
  t0=$SECONDS
  timeout ${PYTEST_TIMEOUT:-900} python3 -m pytest -q -p no:cacheprovider -rs --durations=8 tests/python 2>&1 | tee "$LOG/pytest.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  echo "pytest ($((SECONDS - t0)) s)"
fi
if has script; then
  t0=$SECONDS
  timeout ${SCRIPT_TIMEOUT:-300} python3 examples/flash_mla_api_script.py --device cuda 2>&1 \
    | tee "$LOG/flash_mla_script.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  echo "flash_mla_api_script ($((SECONDS - t0)) s)"
fi
if has bench; then
  # One process per group (a crash loses one group only); faulthandler prints the Python stack of a crash.
  for group in dense sparse merge; do
    python3 -X faulthandler -m mla.bench --only $group --json "$LOG/py_bench_$group.json" 2>&1 | tee -a "$LOG/py_bench.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  done
  # `python3 -m mla.bench` loads the extension before torch (the order that aborted torch 2.11's import
  # until _mla.so stopped exporting libstdc++ functions, docs/PYTHON.md); on a crash, a native stack.
  if [ $rc != 0 ] && command -v cuda-gdb >/dev/null; then
    timeout 120 cuda-gdb -q -batch -ex run -ex bt --args python3 -m mla.bench --only merge >"$LOG/py_bench_gdb.txt" 2>&1
  fi
fi
echo "py_gpu_check exit $rc"
exit $rc
