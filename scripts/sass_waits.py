#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Each instruction of a kernel in a cubin with its scoreboard fields, without cuobjdump: which variable-latency
results it waits for, and which scoreboard its own result sets.

A sm_90 instruction is 16 bytes; the high 64-bit word's bits 41..61 are its control: stall cycles (41..44), yield
(45), the scoreboard its result sets when it completes (46..48, 7 = none), the one its source registers release
(49..51), and the mask of scoreboards it waits for before issuing (52..57). A wait on a scoreboard waits until every
instruction counted on it has completed, so two loads on one scoreboard are waited for together. The mnemonics come
from scripts/sm90_opcodes.json (the low 12 bits of the first word against cuobjdump -sass on the device; `--learn
DUMP...` rebuilds it from such dumps). Make the cubin as for scripts/cubin_sass_scan.py (docs/DEVELOPING.md "Code size
without the device").

Usage: scripts/sass_waits.py X.cubin KERNEL_SUBSTRING [FROM_HEX TO_HEX]
       scripts/sass_waits.py --learn DUMP.txt [DUMP.txt ...]
"""
import collections
import json
import os
import re
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cubin_sass_scan import text_sections  # noqa: E402

TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sm90_opcodes.json")


def learn(dumps):
    seen = collections.defaultdict(collections.Counter)
    for path in dumps:
        lines = open(path).read().split("\n")
        for i in range(len(lines) - 1):
            m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)[^;]*;\s*/\* (0x[0-9a-f]+) \*/", lines[i])
            if m:
                seen[int(m.group(2), 16) & 0xFFF][m.group(1)] += 1
    table = {f"{k:#05x}": v.most_common(1)[0][0] for k, v in sorted(seen.items())}
    with open(TABLE, "w") as fh:
        json.dump(table, fh, indent=0, sort_keys=True)
        fh.write("\n")
    print(f"{len(table)} opcodes into {TABLE}")


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--learn":
        return learn(sys.argv[2:])
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    table = {int(k, 16): v for k, v in json.load(open(TABLE)).items()}
    secs = text_sections(sys.argv[1])
    names = [n for n in secs if sys.argv[2] in n]
    if len(names) != 1:
        sys.exit(f"{len(names)} kernels match {sys.argv[2]!r}: {[n[:80] for n in names]}")
    code = secs[names[0]]
    lo = int(sys.argv[3], 16) if len(sys.argv) > 3 else 0
    hi = int(sys.argv[4], 16) if len(sys.argv) > 4 else len(code)
    for off in range(lo - lo % 16, min(hi + 16, len(code)), 16):
        w0, w1 = struct.unpack_from("<QQ", code, off)
        stall, wr, rd, wait = (w1 >> 41) & 0xF, (w1 >> 46) & 7, (w1 >> 49) & 7, (w1 >> 52) & 0x3F
        waits = ",".join(str(b) for b in range(6) if wait >> b & 1)
        print(f"{off:06x}  {table.get(w0 & 0xFFF, hex(w0 & 0xFFF)):10s} stall {stall:2d}  "
              f"sets {'-' if wr == 7 else wr}  frees {'-' if rd == 7 else rd}  waits [{waits}]")


if __name__ == "__main__":
    main()
