#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `mla run --checkpoint` on every backend present (docs/CLI.md, docs/BLOCK.md): the fixture checkpoints'
# blocks run the serving trace and every step is checked against the float64 CPU block (the run exits
# non-zero when a step breaks the bf16 rule, widened for fp8 / fp8_ds_mla caches by twice the cache's
# own error). The CPU part always runs; the CUDA part runs where a
# device is present (V3 fp8 and V2-Lite bf16, dense; --backend auto picks CUDA there) and is skipped,
# with a line saying so, elsewhere.
# Usage: tests/cli_block_test.sh path/to/mla path/to/tests/fixtures/block
set -u
mla=$1
fix=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
# run NAME WANT_DEVICE args...: the run passes and its JSON record names the device it ran on.
run() {
  local name=$1 want=$2; shift 2
  local out rc
  out=$("$mla" run --no-progress --steps 8 --json "$tmp/$name.json" "$@" 2>&1); rc=$?
  if [ $rc -ne 0 ]; then
    echo "FAIL: mla run $* -> exit $rc: $(echo "$out" | tail -4)"
    fails=$((fails + 1))
    return
  fi
  if ! grep -q "\"device\": \"$want\"" "$tmp/$name.json" || ! grep -q '"failed_steps": 0' "$tmp/$name.json"; then
    echo "FAIL: mla run $*: the record does not say device $want with 0 failed steps: $(tr -d '\n' <"$tmp/$name.json")"
    fails=$((fails + 1))
    return
  fi
  echo "ok: $name: $(echo "$out" | grep -E '^check' | head -1)"
}
run cpu_v3 cpu --backend cpu --checkpoint "$fix/v3_fp8" --layer 1
run cpu_v2lite cpu --backend cpu --checkpoint "$fix/v2lite_bf16" --layer 1
# Quantised caches: the bound adds twice the cache's own error (the twin against the f64-cache block).
run cpu_v3_fp8_cache cpu --backend cpu --checkpoint "$fix/v3_fp8" --layer 1 --cache fp8
run cpu_v2lite_ds_mla cpu --backend cpu --checkpoint "$fix/v2lite_bf16" --layer 1 --cache fp8_ds_mla

if "$mla" info --json | tr -d ' \n' | grep -q '"devices":\[\]'; then
  # No device: --backend cuda is refused with a message naming the option.
  out=$("$mla" run --backend cuda --checkpoint "$fix/v3_fp8" --layer 1 2>&1); rc=$?
  if [ $rc -eq 0 ] || [[ "$out" != *"--backend cuda"* ]]; then
    echo "FAIL: --backend cuda without a device -> exit $rc: $out"
    fails=$((fails + 1))
  fi
  echo "skipped: the CUDA block runs (no CUDA device)"
else
  run cuda_v3 cuda --backend cuda --checkpoint "$fix/v3_fp8" --layer 1
  run cuda_v3_chunky cuda --backend cuda --checkpoint "$fix/v3_fp8" --layer 1 --token-budget 37 --page-size 16
  run cuda_v2lite cuda --backend cuda --checkpoint "$fix/v2lite_bf16" --layer 1
  run cuda_v3_ds_mla cuda --backend cuda --checkpoint "$fix/v3_fp8" --layer 1 --cache fp8_ds_mla
  run cuda_v2lite_fp8 cuda --backend cuda --checkpoint "$fix/v2lite_bf16" --layer 1 --cache fp8
  run auto_v2lite cuda --backend auto --checkpoint "$fix/v2lite_bf16" --layer 1
fi
[ $fails -eq 0 ] && echo "cli_block_test: all passed" || echo "cli_block_test: $fails failure(s)"
exit $((fails > 0))
