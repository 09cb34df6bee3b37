#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Quick start, command 2: set up, build, and run the tests (CPU tests everywhere; GPU tests, label
# `gpu`, run on a machine with a CUDA device and skip with a message elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
# OpenMP threads that spin while waiting starve each other when processes share few cores (ctest -j,
# a busy machine): sleep instead. No cost on an idle machine (measured).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
./scripts/setup.sh
./scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j "$(nproc)" "$@"
