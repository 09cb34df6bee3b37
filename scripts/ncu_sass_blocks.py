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
Each run's line also names its top stall reasons (the stall_* columns of the page).
With --warps W (the warps that run a CTA's role code once: CTAs x warps of a role, e.g. 512 for 128 CTAs of one
warpgroup per role), it also prints the split of instructions and stall samples into run-once code (executed at
most 1.5 W times: prologue, epilogue, a first load), code run a few times (<= 4.5 W) and loop code: run-once code
runs at the pace of its first instruction fetches (docs/design/attention_sm90.md §6b).
It ends with the shared-memory instructions whose wavefronts exceed ncu's ideal (bank conflicts), heaviest first.

Usage: scripts/ncu_sass_blocks.py SOURCE.csv[.gz] [BLOCKS=16] [--warps W]
"""
import collections
import csv
import gzip
import re
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    args = sys.argv[1:]
    warps = 0
    if "--warps" in args:
        i = args.index("--warps")
        warps = int(args[i + 1])
        del args[i:i + 2]
    path = args[0]
    top = int(args[1]) if len(args) > 1 else 16
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
    reasons = [(i, c[len("stall_"):]) for i, c in enumerate(h) if c.startswith("stall_") and "Not Issued" not in c]
    iwf = h.index("L1 Wavefronts Shared") if "L1 Wavefronts Shared" in h else None
    iwi = h.index("L1 Wavefronts Shared Ideal") if "L1 Wavefronts Shared Ideal" in h else None

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
        why = collections.Counter({n: num(r[i]) for i, n in reasons if i < len(r) and num(r[i]) > 0})
        wf = (num(r[iwf]), num(r[iwi])) if iwf is not None and iwi is not None and iwi < len(r) else (0, 0)
        ins.append((r[ia], src, op, num(r[iex]), num(r[ist]) if ist is not None else 0, why, wf))
    total_ex = sum(x[3] for x in ins) or 1
    total_st = sum(x[4] for x in ins) or 1
    print(f"executed {total_ex}  stall samples {total_st}")
    by_ex, by_st = collections.Counter(), collections.Counter()
    for _, _, op, ex, st, _, _ in ins:
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
        why = collections.Counter()
        for x in b:
            why.update(x[5])
        print(f"  at {b[0][0]} len {len(b)} count {b[0][3]}: {100 * ex / total_ex:.1f}% executed, "
              f"{100 * st / total_st:.1f}% stalls" + (" (" + ", ".join(f"{k} {v}" for k, v in why.most_common(3)) + ")"
                                                       if why else ""))
        print("     " + " ".join(f"{k}:{v}" for k, v in mix.most_common(14)))
    if warps > 0:
        print(f"run-once / few / loop code (--warps {warps})")
        split = collections.OrderedDict((k, [0, 0, 0, collections.Counter()]) for k in ("once", "few", "loop"))
        for x in ins:
            if x[3] == 0:
                continue
            k = "once" if x[3] <= 1.5 * warps else "few" if x[3] <= 4.5 * warps else "loop"
            split[k][0] += 1
            split[k][1] += x[3]
            split[k][2] += x[4]
            split[k][3].update(x[5])
        for k, (n, ex, st, why) in split.items():
            print(f"  {k:5s} {n:6d} instructions, {100 * ex / total_ex:5.1f}% executed, {100 * st / total_st:5.1f}% stalls"
                  + ("  (" + ", ".join(f"{r} {v}" for r, v in why.most_common(4)) + ")" if why else ""))
    excess = sorted(((x[6][0] - x[6][1], x) for x in ins if x[6][0] > x[6][1]), key=lambda e: -e[0])
    if excess:
        wf = sum(x[6][0] for x in ins)
        ideal = sum(x[6][1] for x in ins)
        print(f"shared-memory wavefronts {wf} against {ideal} ideal; the instructions above their ideal:")
        for e, x in excess[:top]:
            print(f"  at {x[0]} +{e} ({x[6][0]} / {x[6][1]}, executed {x[3]}): {x[1][:70]}")


if __name__ == "__main__":
    main()
