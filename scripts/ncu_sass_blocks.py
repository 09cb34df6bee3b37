#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Where a kernel's instructions and stall samples go, from an ncu source page.

Input: the CSV of `ncu -i REPORT --page source --csv --print-source sass` (plain or .gz), taken from a report
recorded with `--set full --import-source yes` (or at least the SourceCounters section). Prints
  * the executed instructions and warp-stall samples by opcode (the opcode's first token, predicate stripped);
  * the SASS split into runs of equal execution count (basic blocks, in address order), heaviest first: each
    run's length, its count (executions per warp summed over warps), its share of all executed instructions,
    its stall samples and its opcode mix.
A run whose count is (tiles x warps that execute it) names a per-tile phase; a two-instruction run with a huge
count is a barrier wait loop (SYNCS ... TRYWAIT + BRA). Used to profile the code-format kernel's ping-pong (docs/LAB.md).

Usage: scripts/ncu_sass_blocks.py SOURCE.csv[.gz] [BLOCKS=16]
"""
import collections
import csv
import gzip
import re
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as fh:
        rows = list(csv.reader(fh))
    head = next((i for i, r in enumerate(rows) if "Address" in r and "Source" in r), None)
    if head is None:
        sys.exit(f"{path}: no header with Address and Source columns (not an ncu source-page CSV)")
    h = rows[head]
    try:
        ia, isrc, iex = h.index("Address"), h.index("Source"), h.index("Instructions Executed")
    except ValueError as e:
        sys.exit(f"{path}: missing column ({e}); record with --set full --import-source yes")
    ist = next((i for i, c in enumerate(h) if c.startswith("Warp Stall Sampling (All")), None)

    def num(x):
        try:
            return int(float(x.replace(",", "")))
        except ValueError:
            return 0

    ins = []
    for r in rows[head + 1:]:
        if len(r) <= max(ia, isrc, iex):
            continue
        src = r[isrc].strip()
        m = re.match(r"(@!?U?P\w+\s+)?([A-Z0-9_]+)", src)
        op = m.group(2) if m else src.split()[0] if src else "?"
        ins.append((r[ia], src, op, num(r[iex]), num(r[ist]) if ist is not None else 0))
    total_ex = sum(x[3] for x in ins) or 1
    total_st = sum(x[4] for x in ins) or 1
    print(f"executed {total_ex}  stall samples {total_st}")
    by_ex, by_st = collections.Counter(), collections.Counter()
    for _, _, op, ex, st in ins:
        by_ex[op] += ex
        by_st[op] += st
    print("opcode        executed%  stall%")
    for op, ex in by_ex.most_common(24):
        print(f"  {op:12s} {100 * ex / total_ex:7.2f} {100 * by_st[op] / total_st:7.2f}")
    blocks, cur = [], []
    for x in ins:
        if cur and x[3] != cur[-1][3]:
            blocks.append(cur)
            cur = []
        cur.append(x)
    if cur:
        blocks.append(cur)
    blocks.sort(key=lambda b: -sum(x[3] for x in b))
    print("runs of equal count (heaviest first)")
    for b in blocks[:top]:
        ex = sum(x[3] for x in b)
        st = sum(x[4] for x in b)
        mix = collections.Counter(x[2] for x in b)
        print(f"  at {b[0][0]} len {len(b)} count {b[0][3]}: {100 * ex / total_ex:.1f}% executed, "
              f"{100 * st / total_st:.1f}% stalls")
        print("     " + " ".join(f"{k}:{v}" for k, v in mix.most_common(14)))


if __name__ == "__main__":
    main()
