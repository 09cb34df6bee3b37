#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Per-kernel SASS summary of a CUDA binary: counts of the instructions that tell which hardware path a
# kernel took (HGMMA/QGMMA = wgmma, HMMA = mma.sync, LDSM/STSM = ldmatrix/stmatrix, UTMALDG/UTMASTG =
# TMA tile load/store, UBLKCP = bulk copy, UTMAPF/UBLKPF = L2 prefetches, UTMACCTL = tensor-map
# prefetch, USETMAXREG = setmaxnreg, SYNCS = mbarrier; only those present are printed) and of
# local-memory accesses (LDL/STL, always printed: spills or run-time-indexed register arrays; should be 0
# in hot kernels).
# Usage: scripts/sass_summary.sh BINARY [REGEX on the mangled kernel name]   (needs cuobjdump)
set -euo pipefail
bin=$1
filter=${2:-.}
cuobjdump -sass "$bin" | awk -v filter="$filter" '
  /Function : / { fn = $3; next }
  fn != "" && fn ~ filter {
    for (i = 1; i <= NF; i++) {
      op = $i
      sub(/\..*/, "", op)
      if (op ~ /^(HGMMA|QGMMA|HMMA|UTMALDG|UTMASTG|UBLKCP|USETMAXREG|LDL|STL|UTMACCTL|UTMAPF|UBLKPF|STSM|LDSM)$/) { n[fn, op]++; seen[fn] = 1 }
      if (op ~ /^SYNCS/) { n[fn, "SYNCS"]++; seen[fn] = 1 }
    }
    seen[fn] = seen[fn] + 0
  }
  END {
    nops = split("HGMMA QGMMA HMMA LDSM STSM UTMALDG UTMASTG UBLKCP UTMAPF UBLKPF UTMACCTL USETMAXREG SYNCS", ops, " ")
    for (f in seen) {
      line = substr(f, 1, 90)
      for (k = 1; k <= nops; k++) if (n[f, ops[k]] > 0) line = line " " ops[k] "=" n[f, ops[k]]
      line = line " LDL=" (n[f, "LDL"] + 0) " STL=" (n[f, "STL"] + 0)
      print line
    }
  }' | sort
