#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Issues 10 and 12 in one device call (docs/PYTHON.md, docs/INDEXER.md): transformers' DeepseekV32
# indexer fixture generated in the background while one build makes the package, the GPU tests and the
# CLI; then the pytest suite (checking that fresh fixture too) and the FlashMLA-API script while the
# sanitizers run the indexer tests; then, alone on the GPU, the timed parts: indexer tests, SASS,
# indexer benchmarks, the Python benchmark, then an Nsight Compute profile of the decode logits. The device returns at most 8 files: logs and bench JSON are
# packed into $OUT/logs.tgz after each stage (and on exit); the fixture and its log lie in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
FINAL=${OUT:-$PWD/gpu-logs}
export OUT=/tmp/py_indexer_logs
rm -rf "$OUT" && mkdir -p "$OUT/fixture" "$OUT/indexer" "$FINAL"
export PYTHONPATH=$PWD/build-gpu/python SCRIPT_TIMEOUT=${SCRIPT_TIMEOUT:-150} PYTEST_TIMEOUT=${PYTEST_TIMEOUT:-200}
rc=0
pack() {
  tar -czf "$FINAL/logs.tgz" -C "$OUT" . 2>/dev/null
  cp -f "$OUT"/fixture/v32_indexer.npz "$OUT"/fixture/v32_indexer.log "$OUT"/fixture/hf_indexer_source.py "$FINAL"/ 2>/dev/null
  return 0
}
trap pack EXIT
t0=$SECONDS
stamp() { echo "== $1 ($((SECONDS - t0)) s)"; pack; }
python3 scripts/gen_indexer_fixture.py "$OUT/fixture/v32_indexer.npz" --source-out "$OUT/fixture/hf_indexer_source.py" \
  >"$OUT/fixture/gen.out" 2>&1 &
gen=$!
scripts/py_gpu_check.sh build || exit 1
OUT=$OUT/indexer scripts/indexer_gpu_check.sh build || exit 1
stamp build
wait $gen || rc=1
tail -3 "$OUT/fixture/gen.out"
OUT=$OUT/indexer scripts/indexer_gpu_check.sh sanitize >"$OUT/indexer/sanitize.out" 2>&1 &
san=$!
[ -f "$OUT/fixture/v32_indexer.npz" ] && export MLA_INDEXER_FIXTURE=$OUT/fixture/v32_indexer.npz
scripts/py_gpu_check.sh pytest script || rc=1
env -u MLA_INDEXER_FIXTURE python3 -m pytest -q -p no:cacheprovider -s tests/python/test_indexer_hf.py 2>&1 | grep -E "calc_diff|passed|failed"
stamp "pytest + script"
wait $san || rc=1
cat "$OUT/indexer/sanitize.out"
stamp sanitize
OUT=$OUT/indexer scripts/indexer_gpu_check.sh tests sass bench || rc=1
stamp "indexer tests + bench"
scripts/py_gpu_check.sh bench || rc=1
stamp "py bench"
OUT=$OUT/indexer scripts/indexer_gpu_check.sh profile
stamp profile
echo "py_indexer_gpu_check exit $rc"
exit $rc
