#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Same-call A/B of two `mla` binaries over whole `mla bench` grids (docs/DEVELOPING.md "Performance claims"): for
# each grid, ROUNDS rounds alternate A and B (A B, B A, A B, ...: neither side always runs first), each writing
# --json; then one table per grid of every row's median time on each side, B / A, and the rows where B is slower
# than A by more than LIMIT (default 2%). Exit status 0 either way (a judgement, not a test).
# Usage (on the GPU machine): scripts/ab_grids.sh ROUNDS BIN_A BIN_B GRID [GRID ...]
#   GRID: a --grid name (issue7, issue8, issue9, v4) or any quoted `mla bench` arguments.
# Output: the tables on stdout and $OUT/ab_grids.txt (when OUT is set), the JSON files under ${AB_DIR:-ab-grids}.
set -uo pipefail
[ $# -ge 4 ] || { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 2; }
rounds=$1 a=$2 b=$3
shift 3
dir=${AB_DIR:-ab-grids}
mkdir -p "$dir"
report=${OUT:+$OUT/ab_grids.txt}
: >"${report:-/dev/null}"
g=0
for grid in "$@"; do
  g=$((g + 1))
  case "$grid" in
    issue7) args="--ops ceilings,mqa_decode --grid issue7" ;;
    issue8) args="--ops ceilings,sparse_mqa --grid issue8" ;;
    issue9) args="--ops ceilings,mha_prefill --grid issue9" ;;
    v4) args="--ops ceilings,sparse_mqa --grid v4" ;;
    *) args=$grid ;;
  esac
  for r in $(seq "$rounds"); do
    order="A B"
    [ $((r % 2)) = 0 ] && order="B A"
    for side in $order; do
      bin=$a
      [ $side = B ] && bin=$b
      # shellcheck disable=SC2086
      "$bin" bench $args --json "$dir/g${g}_${side}_$r.json" >"$dir/g${g}_${side}_$r.txt" 2>&1 ||
        echo "grid $g ($grid) side $side round $r failed: $(tail -2 "$dir/g${g}_${side}_$r.txt")"
    done
  done
  python3 - "$dir" "$g" "$rounds" "$grid" "${LIMIT:-2}" <<'EOF' | tee -a "${report:-/dev/null}"
import json, os, re, statistics, sys
d, g, rounds, grid, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
def load(side):
    runs = []
    for r in range(1, rounds + 1):
        p = os.path.join(d, f"g{g}_{side}_{r}.json")
        if os.path.exists(p):
            runs.append(json.load(open(p)))
    return runs
A, B = load("A"), load("B")
if not A or not B:
    print(f"grid {grid}: no results"); sys.exit(0)
def key(row):  # the shape without the variant tag (the two binaries may name their kernels differently)
    return (row["op"], re.sub(r"\s*\(x[0-9.]+\)", "", re.sub(r"\s*\[[^\]]*\]", "", row["config"])))
def times(runs):
    t, v = {}, {}
    for run in runs:
        for row in run.get("rows", []):
            t.setdefault(key(row), []).append(row["time_ms"])
            v[key(row)] = row.get("variant", "")
    return t, v
(ta, va), (tb, vb) = times(A), times(B)
meta = A[0]
print(f"== grid {grid}: {meta.get('device')} commit A {A[0].get('commit')} B {B[0].get('commit')} {meta.get('date')} "
      f"rounds {rounds}; copy {meta['ceilings']['copy_gbps']:.0f} GB/s, gemm {meta['ceilings']['gemm_tflops']:.0f} TFLOP/s")
print(f"{'op':<12} {'config':<58} {'A ms':>9} {'B ms':>9} {'B/A':>6}  B's kernel")
slower = []
for k in ta:
    if k not in tb:
        continue
    ma, mb = statistics.median(ta[k]), statistics.median(tb[k])
    ratio = mb / ma if ma > 0 else float("nan")
    flag = " <" if ratio > 1 + limit / 100 else ""
    print(f"{k[0]:<12} {k[1][:58]:<58} {ma:9.4f} {mb:9.4f} {ratio:6.3f}{flag:2}  {vb.get(k, '')}")
    if flag:
        slower.append((k, ratio))
print(f"rows slower by more than {limit}%: {len(slower)}" + "".join(
    f"\n  {k[0]} {k[1]}: {r:.3f}\n    A {' '.join(f'{t:.4f}' for t in ta[k])}\n    B {' '.join(f'{t:.4f}' for t in tb[k])}"
    for k, r in slower))
EOF
done
