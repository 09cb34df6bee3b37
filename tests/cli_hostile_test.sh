#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Hostile command lines of `mla` (issue 14): each must fail fast with a non-zero exit and a message that
# names the option or command, never abort, corrupt the heap or silently mean "default".
# Usage: tests/cli_hostile_test.sh path/to/mla
set -u
mla=$1
run_mla=("$mla")  # how expect_fail runs it (under `timeout` where a hang is the failure looked for)
fails=0
expect_fail() {  # expect_fail "<text the message must contain>" args...
  local want=$1; shift
  local out rc
  out=$("${run_mla[@]}" "$@" 2>&1); rc=$?
  if [ $rc -eq 0 ] || [ $rc -ge 128 ] || [[ "$out" != *"$want"* ]]; then
    echo "FAIL: mla $* -> exit $rc, wanted a message with '$want', got: $(echo "$out" | tail -3)"
    fails=$((fails + 1))
  fi
}
expect_fail "unknown command 'frobnicate'" frobnicate
for opt in --steps --requests --max-context --token-budget --max-seqs --topk --check-samples --tp --page-size; do
  expect_fail "$opt" run --backend cpu "$opt" -1
done
expect_fail "--page-size" run --backend cpu --page-size 288230376151711744
expect_fail "--token-budget" run --backend cpu --token-budget 4611686018427387904
expect_fail "--requests" run --backend cpu --requests 99999999999
expect_fail "--max-context" run --backend cpu --max-context 7
expect_fail "--topk-source" run --backend cpu --sparse --topk-source bogus
expect_fail "--topk-source applies to --sparse" run --backend cpu --steps 1 --topk-source indexer
expect_fail "--sparse-prefill" run --backend cpu --sparse --sparse-prefill bogus
for f in v4 v41 v41_fp4; do  # DeepSeek-V4 records: only with a V4 model
  expect_fail "--cache $f: the V3 layer and block cannot read DeepSeek-V4 records" run --backend cpu --steps 1 --cache "$f"
done
expect_fail "--extra-cache is the format of DeepSeek-V4's compressed cache" run --backend cpu --steps 1 --extra-cache v4
expect_fail "a DeepSeek-V4 cache holds rows of 512" run --backend cpu --steps 1 --model v4-flash --cache fp8
expect_fail "--sparse, --topk, --topk-source, --dcp and --batch-invariant apply to the V3" run --backend cpu --model v4-flash --sparse
expect_fail "layer 9 is outside" run --backend cpu --steps 1 --model v4-flash --layer 9
expect_fail "--sparse-prefill applies to --sparse runs with the fp8_ds_mla cache" run --backend cpu --steps 1 --sparse-prefill separate
expect_fail "--sparse-prefill applies to --sparse runs with the fp8_ds_mla cache" run --backend cpu --sparse --cache bf16 --steps 1 --sparse-prefill mixed
expect_fail "--sparse-prefill separate cannot be combined with --dcp" run --backend cpu --sparse --dcp 2 --sparse-prefill separate
expect_fail "cannot open" run --backend cpu --steps 1 --json /nonexistent-dir/x.json
expect_fail "--dcp" run --backend cpu --dcp 0
expect_fail "--dcp" run --backend cpu --dcp 99999999999
expect_fail "--dcp 3: the layer's 16 query heads" run --backend cpu --dcp 3
expect_fail "--dcp-interleave 5 must divide --page-size 64" run --backend cpu --dcp 2 --dcp-interleave 5
expect_fail "--dcp runs the bare layer" run --backend cpu --dcp 2 --block
expect_fail "--out-quant" run --backend cpu --steps 1 --out-quant int8
expect_fail "--kv-scales" run --backend cpu --steps 1 --kv-scales sometimes
expect_fail "--kv-scales auto sets the one scale of the per-tensor fp8 cache" run --backend cpu --steps 1 --kv-scales auto
expect_fail "--out-quant and --kv-scales apply to the bare layer" run --backend cpu --steps 1 --block --out-quant fp8
expect_fail "--out-quant and --kv-scales apply to the bare layer" run --backend cpu --steps 1 --dcp 2 --out-quant nvfp4
expect_fail "--out-quant" bench --ops mha_prefill --out-quant fp8
if [ -w /dev/full ]; then  # the record is written after the run: a full disk is an error, not exit 0
  expect_fail "writing '/dev/full' failed" run --backend cpu --steps 2 --requests 2 --max-context 64 \
    --check-samples 0 --no-progress --json /dev/full
fi
# The DeepSeek block (--checkpoint / --block): bad directories, files and combinations.
expect_fail "/nonexistent-dir/config.json: cannot open" run --backend cpu --checkpoint /nonexistent-dir
expect_fail "config.json" run --backend cpu --checkpoint /tmp
expect_fail "--block builds random weights" run --backend cpu --block --checkpoint /tmp
expect_fail "--layer" run --backend cpu --layer 3
expect_fail "--rank" run --backend cpu --block --model v2-lite --tp 2 --rank 2
if "$mla" info --json | tr -d ' \n' | grep -q '"devices":\[\]'; then  # the CUDA block needs a device
  expect_fail "--backend cuda" run --backend cuda --block
fi
fixture=$(cd "$(dirname "$0")" && pwd)/fixtures/block/v3_fp8
if [ -d "$fixture" ]; then
  expect_fail "no tensor 'model.layers.7" run --backend cpu --checkpoint "$fixture" --layer 7 --steps 1
  expect_fail "must divide" run --backend cpu --checkpoint "$fixture" --layer 1 --tp 4 --steps 1
fi
# --seed: a negative or too large seed is refused, not wrapped to 2^64 - 1 (issue 51).
expect_fail "--seed" run --backend cpu --steps 1 --seed -1
expect_fail "--seed" run --backend cpu --steps 1 --seed 18446744073709551616
expect_fail "--seed" run --backend cpu --steps 1 --seed +5
# Checkpoint directories that used to hang (a FIFO named as a shard) or escape as "unexpected failure"
# (a *.safetensors symlink loop); each must fail within the timeout with the entry named.
if [ -d "$fixture" ] && command -v mkfifo >/dev/null && command -v timeout >/dev/null; then
  tmp=$(mktemp -d)
  cp "$fixture/config.json" "$tmp/"
  mkfifo "$tmp/pipe.safetensors"
  sed 's/model-0000[0-9]-of-0000[0-9]\.safetensors/pipe.safetensors/' "$fixture/model.safetensors.index.json" \
    >"$tmp/model.safetensors.index.json"
  run_mla=(timeout 60 "$mla")
  expect_fail "not a regular file" run --backend cpu --checkpoint "$tmp" --layer 1 --steps 1
  rm "$tmp/model.safetensors.index.json" "$tmp/pipe.safetensors"
  ln -s loop.safetensors "$tmp/loop.safetensors"
  expect_fail "loop.safetensors is not a readable regular file" run --backend cpu --checkpoint "$tmp" --layer 1 --steps 1
  run_mla=("$mla")
  rm -rf "$tmp"
fi
# mla bench: every numeric option range-checked at parse time (before the CUDA check), unknown formats
# and grids named, --json opened before any work.
for opt in --iters --warmup --b --s-q --h-q --s-k --page --splits --device --topk --pool --extra-topk --extra-pool --dcp; do
  expect_fail "$opt" bench "$opt" -1
done
expect_fail "--iters" bench --iters 0
expect_fail "--iters" bench --iters 99999999999
expect_fail "--s-k" bench --s-k 4294967296
expect_fail "--b" bench --b 4611686018427387904
expect_fail "--page" bench --page 288230376151711744
expect_fail "--splits" bench --splits 65
expect_fail "--format" bench --format fp7
expect_fail "--extra-format" bench --extra-format fp7
expect_fail "--grid" bench --grid issue10
expect_fail "cannot open" bench --json /nonexistent-dir/x.json
# Options that matter only with another one are refused with a sentence, not ignored (issue 52).
expect_fail "--topk 5 applies to --sparse runs only" run --backend cpu --steps 1 --topk 5
expect_fail "--dcp-interleave 2 applies to a DCP group" run --backend cpu --steps 1 --dcp-interleave 2
expect_fail "--dcp-interleave 1 applies to a DCP group" run --backend cpu --steps 1 --dcp 1 --dcp-interleave 1
expect_fail "--dcp-procs needs --dcp N" run --backend cpu --steps 1 --dcp-procs
expect_fail "--batch-invariant cannot be combined with --dcp 2" run --backend cpu --steps 1 --dcp 2 --batch-invariant
expect_fail "--device 1 selects a CUDA device, and --backend cpu" run --backend cpu --steps 1 --device 1
expect_fail "--layer selects a layer of --checkpoint" run --backend cpu --block --layer 1
expect_fail "--layer and --rank select the block" run --backend cpu --steps 1 --rank 0
expect_fail "--sparse-prefill applies to --sparse runs" run --backend cpu --steps 1 --sparse-prefill auto
expect_fail "--topk-source applies to the bare layer" run --backend cpu --block --sparse --topk-source synthetic
expect_fail "--sparse-prefill applies to the bare layer" run --backend cpu --block --sparse --sparse-prefill mixed
expect_fail "--s-q shapes the single row that --b selects" bench --s-q 2
expect_fail "--non-causal applies to mha_prefill only, and --ops mqa_decode" bench --ops mqa_decode --b 4 --non-causal
expect_fail "--dcp applies to dcp only" bench --dcp 2
expect_fail "--trace applies to mqa_decode, sparse_mqa only" bench --ops mha_prefill --trace
expect_fail "--batch-invariant applies to mqa_decode, sparse_mqa only" bench --ops mha_prefill --batch-invariant
expect_fail "--b and --grid both choose the rows" bench --b 4 --grid issue7
expect_fail "--extra-topk shapes the single row that --b selects" bench --ops sparse_mqa --extra-topk 512
expect_fail "--extra-format shapes a DeepSeek-V4 row's extra cache: give --extra-topk too" bench --ops sparse_mqa --b 4 --extra-format v41_fp4
expect_fail "--extra-pool applies to sparse_mqa only" bench --ops mqa_decode --b 4 --extra-pool 64
expect_fail "--grid issue9 is a list of mha_prefill rows" bench --ops mqa_decode --grid issue9
expect_fail "--grid issue48 is a list of mqa_decode, sparse_mqa, layer rows" bench --ops mha_prefill,gemm --grid issue48
# Parse failures in the program's voice: what was given, what is accepted, where the help is; exit 3.
expect_fail "mla run: unknown option '--topkk' (did you mean --topk?)" run --topkk 5
expect_fail "see \`mla run --help\`" run --topkk 5
expect_fail "mla run accepts --backend, --device" run --frobnicate
expect_fail "unexpected argument 'extra'" run --backend cpu extra
expect_fail "mla bench: unknown option '--quik' (did you mean --quick?)" bench --quik
expect_fail "a command is required: run, info, bench"
expect_fail "mla: unknown option '--frob'" --frob
expect_fail "see \`mla run --help\`" run --steps
for args in "run --topkk 5" "bench --quik" "run --steps abc" "info --frob"; do
  # shellcheck disable=SC2086
  "$mla" $args >/dev/null 2>&1; rc=$?
  if [ $rc -ne 3 ]; then echo "FAIL: mla $args -> exit $rc, wanted 3 (the error code of mla)"; fails=$((fails + 1)); fi
done
# Range messages stay short (no 300-digit bounds).
out=$("$mla" run --backend cpu --steps 0 2>&1)
if [ ${#out} -gt 200 ]; then echo "FAIL: --steps 0 message is ${#out} characters"; fails=$((fails + 1)); fi
[ $fails -eq 0 ] && echo "cli hostile: all passed"
exit $fails
