#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ctest install.consumer: installs the build BUILD into a fresh prefix under WORK, checks that nothing was
# installed outside it, then configures, builds and runs tests/consumer against it with find_package(mla).
# Usage: tests/consumer/run.sh SOURCE_DIR BUILD WORK [cmake args for the consumer, e.g. the compiler]
set -euo pipefail
src=$1 build=$2 work=$3
shift 3
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >"$work/install.log"
outside=$(grep -v "^$prefix/" "$build/install_manifest.txt" || true)
if [ -n "$outside" ]; then
  echo "cmake --install --prefix $prefix wrote outside the prefix:"
  echo "$outside"
  exit 1
fi
for f in include/mla/version.h include/mla/ops.h bin/mla; do
  [ -e "$prefix/$f" ] || { echo "missing from the install: $f"; exit 1; }
done
[ -n "$(find "$prefix" -path '*/cmake/mla/mla-config.cmake')" ] || { echo "missing from the install: mla-config.cmake"; exit 1; }
cmake -S "$src/tests/consumer" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" "$@" \
  >"$work/configure.log" || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$work/build/mla_consumer"
