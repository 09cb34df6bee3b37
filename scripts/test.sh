#!/usr/bin/env bash
# Quick start, command 2: set up, build, and run the tests (CPU tests everywhere; GPU tests, label
# `gpu`, run on a machine with a CUDA device and skip with a message elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j "$(nproc)" "$@"
