#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Self-test of scripts/check_layering.sh: on copies of the tree, each planted wrong-way include must
# make the check fail and be named in its output; the unmodified copy must pass. Keeps the layering
# check from passing silently (e.g. after a rule or a folder name changes).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
check="$repo/scripts/check_layering.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0

fresh() {  # a clean copy of the checked folders in $work/t
  rm -rf "$work/t" && mkdir -p "$work/t"
  (cd "$repo" && cp -r include src apps bench "$work/t/")
}

fresh
if ! out=$("$check" "$work/t"); then echo "FAIL: the unmodified tree does not pass: $out"; fail=1; fi

# file to plant in | include line | text the report must contain
plants='
src/core/tensor.cpp|#include "cpu/cpu_ops.h"|src/core/tensor.cpp
src/cpu/gemm.cpp|#include "ops/validate.h"|src/cpu/gemm.cpp
src/layer/layer.cpp|#include "cuda/cuda_ops.h"|src/layer/layer.cpp
src/ops/attention.cpp|#include "cpu/attention_core.h"|src/ops/attention.cpp
include/mla/types.h|#include <fmt/format.h>|include/mla/types.h
src/core/types.cpp|#include <cuda_runtime.h>|src/core/types.cpp
apps/mla/main.cpp|#include "cuda/common/convert.cuh"|apps/mla/main.cpp
src/cuda/attention/portable/decode/launch.cu|#include "layer/layer_internal.h"|src/cuda/attention/portable/decode/launch.cu
src/cuda/attention/sm90/mqa_decode.cu|#include "cuda/attention/portable/decode/kernel.cuh"|src/cuda/attention/sm90/mqa_decode.cu
src/cuda/attention/portable/sparse/launch.cu|#include "cuda/attention/sm90/variant.h"|src/cuda/attention/portable/sparse/launch.cu
src/io/checkpoint.cpp|#include "ops/validate.h"|src/io/checkpoint.cpp
'
while IFS='|' read -r file line expect; do
  [ -n "$file" ] || continue
  fresh
  echo "$line" >> "$work/t/$file"
  if out=$("$check" "$work/t"); then
    echo "FAIL: planted '$line' in $file was not reported"; fail=1
  elif [[ $out != *"$expect"* ]]; then
    echo "FAIL: planted '$line' in $file; the report does not name it: $out"; fail=1
  fi
done <<< "$plants"
[ $fail = 0 ] && echo "layering self-test: every planted violation was caught"
exit $fail
