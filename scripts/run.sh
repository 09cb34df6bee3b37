#!/usr/bin/env bash
# Quick start, command 1: set up, build, and run the main job (`mla run` on the best backend present).
# Arguments go to `mla run` (see `build/bin/mla run --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh
exec "${BUILD_DIR:-build}/bin/mla" run "$@"
