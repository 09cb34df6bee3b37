#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fails when an #include crosses a layer the wrong way. The layers and what each may include are
# written once, below (docs/DEVELOPING.md "Layers"):
#
#   runtime (CUDA runtime wrapper) <- core <- cpu, cuda (backends) <- ops (front ends)
#     <- attention (src/layer), dist (communicators, DCP collectives) <- block (src/block, with io:
#     src/io on core) <- apps, bench
#
# A quoted include "dir/file" must start with a prefix the including file's layer allows; a quoted
# include without a '/' is a file of the same folder. Angle includes are checked only where a layer
# must not see a library at all (public headers: no fmt, no CUDA; core: no CUDA headers).
# Usage: scripts/check_layering.sh [root]   (default: the repository). Exit 1 with one line per
# violation, 0 when clean.
set -euo pipefail
root=${1:-"$(cd "$(dirname "$0")/.." && pwd)"}
cd "$root"

# folder | allowed quoted-include prefixes | forbidden angle-include prefixes
rules='
include/mla | mla/ | fmt/ cuda cublas
src/runtime | runtime/ mla/ |
src/core    | core/ runtime/ mla/ | cuda cublas
src/cpu     | cpu/ core/ mla/ | cuda cublas
src/cuda    | cuda/ core/ runtime/ mla/ |
src/cuda/attention/portable | cuda/attention/portable/ cuda/attention/combine/ cuda/attention/prefill_params.h cuda/common/ cuda/dispatch/ cuda/cuda_ops.h core/ runtime/ mla/ |
src/cuda/attention/sm90     | cuda/attention/sm90/ cuda/attention/combine/ cuda/attention/prefill_params.h cuda/common/ cuda/dispatch/ cuda/cuda_ops.h core/ runtime/ mla/ |
src/cuda/attention/combine  | cuda/attention/combine/ cuda/common/ core/ runtime/ mla/ |
src/ops     | ops/ core/ runtime/ mla/ cpu/cpu_ops.h cuda/cuda_ops.h cuda/dispatch/families.h | cuda cublas
src/layer   | layer/ ops/ core/ runtime/ mla/ | cuda cublas
src/dist    | dist/ core/ runtime/ mla/ |
src/io      | io/ core/ mla/ | cuda cublas
src/block   | block/ core/ mla/ | cuda cublas
apps        | mla/ core/ runtime/ |
bench       | mla/ core/ runtime/ cuda/ |
python/src  | mla/ | fmt/ cuda cublas
'
# python/src (the binding) sees only the public API.
# bench may include kernel headers: it is the kernel laboratory that times variants directly.
# Inside the attention family the arch levels stay apart: portable/ and sm90/ share only combine/, the
# op's parameters and cuda/common/; the op launchers one level up (src/cuda/attention/*.cpp) see both.

bad=0
while IFS='|' read -r dir allowed forbidden; do
  dir=$(echo "$dir" | xargs)
  [ -n "$dir" ] && [ -d "$dir" ] || continue
  while IFS= read -r line; do
    file=${line%%:*}
    rest=${line#*:}
    lineno=${rest%%:*}
    inc=${rest#*:}
    if [[ $inc =~ \#[[:space:]]*include[[:space:]]*\"([^\"]+)\" ]]; then
      path=${BASH_REMATCH[1]}
      [[ $path == */* ]] || continue
      ok=0
      for p in $allowed; do [[ $path == "$p"* ]] && { ok=1; break; }; done
      if [ $ok = 0 ]; then
        echo "$file:$lineno: includes \"$path\"; the $dir layer may include only: $allowed"
        bad=1
      fi
    elif [[ $inc =~ \#[[:space:]]*include[[:space:]]*\<([^\>]+)\> ]]; then
      path=${BASH_REMATCH[1]}
      for p in $forbidden; do
        if [[ $path == "$p"* ]]; then
          echo "$file:$lineno: includes <$path>; the $dir layer must not see <$p...>"
          bad=1
        fi
      done
    fi
  done < <(grep -rnE --include='*.h' --include='*.hpp' --include='*.cpp' --include='*.cu' --include='*.cuh' \
             --include='*.inc' '^[[:space:]]*#[[:space:]]*include' "$dir" | sort || true)
done <<< "$rules"
if [ $bad = 0 ]; then echo "layering: clean"; fi
exit $bad
