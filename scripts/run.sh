#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Quick start, command 1: set up, build, and run the main job (`mla run` on the best backend present).
# Arguments go to `mla run` (see `build/bin/mla run --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
# OpenMP threads that spin while waiting starve each other when processes share few cores (ctest -j,
# a busy machine): sleep instead. No cost on an idle machine (measured).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
./scripts/setup.sh
./scripts/build.sh
exec "${BUILD_DIR:-build}/bin/mla" run "$@"
