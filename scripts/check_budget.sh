#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The kernel folder's budget (docs/DESIGN.md "Budget"): what ships is what runs.
#   1. No environment variable is read under src/cuda/ (getenv, secure_getenv, environ): a kernel or a schedule is
#      chosen by the dispatch table and the host rules, never by the environment.
#   2. The sm90 attention kernels (src/cuda/attention/sm90/: mqa_decode and sparse_mqa) instantiate at most
#      MLA_SM90_ATTENTION_KERNELS kernels, counted from the host stubs nvcc emits for every instantiated __global__
#      function (nm of the family's objects in the build tree; skipped in a build without CUDA).
# Usage: scripts/check_budget.sh SOURCE_DIR [BUILD_DIR]. Exit 1 names what is over budget.
set -euo pipefail
SRC=${1:-$(dirname "$0")/..}
BUILD=${2:-}
BUDGET_KERNELS=46
bad=0
reads=$(grep -rnE '\b(secure_getenv|getenv)\s*\(|\benviron\b' "$SRC/src/cuda" || true)
if [ -n "$reads" ]; then
  echo "environment reads under src/cuda/ (budget 0):"
  echo "$reads"
  bad=1
fi
if [ -n "$BUILD" ]; then
  objs=$(find "$BUILD" -path '*attention/sm90*' -name '*.o' 2>/dev/null || true)
  if [ -n "$objs" ] && command -v nm >/dev/null; then
    # shellcheck disable=SC2086
    kernels=$(nm -C $objs | grep -E ' [TtWw] ' | grep -oE 'decode_sm90_[a-z0-9_]*kernel<.*>\(CUtensorMap_st' | sort -u)
    n=$(printf '%s\n' "$kernels" | grep -c . || true)
    echo "sm90 attention kernels instantiated: $n (budget $BUDGET_KERNELS)"
    if [ "$n" -gt "$BUDGET_KERNELS" ]; then
      printf '%s\n' "$kernels"
      bad=1
    fi
  fi
fi
[ $bad = 0 ] && echo "budget ok"
exit $bad
