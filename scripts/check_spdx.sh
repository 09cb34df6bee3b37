#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Every source file of the repository carries the project's SPDX license line (LICENSE: Apache-2.0) in its
# first two lines (after a shebang). Usage: scripts/check_spdx.sh [repo root]. Lists offenders, exits 1 if any.
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
[ -f LICENSE ] || { echo "LICENSE is missing"; exit 1; }
bad=0
while IFS= read -r f; do
  case "$f" in
    tests/fixtures/*) continue ;;
    *.cpp|*.h|*.cu|*.cuh|*.inc|*.py|*.sh|*/CMakeLists.txt|CMakeLists.txt|.ci/run|*.cmake|*.cmake.in|*.pyi|*.toml) ;;
    *) continue ;;
  esac
  [ -f "$f" ] || continue
  head -2 "$f" | grep -q "SPDX-License-Identifier: Apache-2.0" || { echo "no SPDX line: $f"; bad=1; }
done < <(git ls-files 2>/dev/null || find . -type f -not -path './.git/*' -not -path './build*' | sed 's|^\./||')
exit $bad
