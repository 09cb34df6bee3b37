#!/usr/bin/env bash
# Per-kernel SASS summary of a CUDA binary: counts of the instructions that tell which hardware path a
# kernel took (HGMMA/QGMMA = wgmma, HMMA = mma.sync, UTMALDG = TMA tile load, UBLKCP = bulk copy,
# USETMAXREG = setmaxnreg, SYNCS = mbarrier, UTMACCTL = tensor-map prefetch) and of local-memory accesses (LDL/STL: spills or
# run-time-indexed register arrays; should be 0 in hot kernels).
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
      if (op ~ /^(HGMMA|QGMMA|HMMA|UTMALDG|UBLKCP|USETMAXREG|LDL|STL|UTMACCTL)$/) { n[fn, op]++; seen[fn] = 1 }
      if (op ~ /^SYNCS/) { n[fn, "SYNCS"]++; seen[fn] = 1 }
    }
    seen[fn] = seen[fn] + 0
  }
  END {
    split("HGMMA QGMMA HMMA UTMALDG UBLKCP UTMACCTL USETMAXREG SYNCS LDL STL", ops, " ")
    for (f in seen) {
      line = substr(f, 1, 90)
      for (k = 1; k <= 10; k++) line = line " " ops[k] "=" (n[f, ops[k]] + 0)
      print line
    }
  }' | sort
