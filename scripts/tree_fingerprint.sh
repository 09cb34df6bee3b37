#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Prints a fingerprint of the source tree as it is on disk: a hash over the names and contents of every file git
# tracks or would track (not ignored), lab/ excluded. Two machines print the same fingerprint when they hold the
# same sources, whatever their git metadata says — the device machine receives the working tree, and its copy's
# HEAD can lag the commit whose files it holds (scripts/gpu_check.sh prints both). Run from the repository root.
set -euo pipefail
files=$(git ls-files --cached --others --exclude-standard -- . ':!lab' | LC_ALL=C sort -u | while IFS= read -r f; do
  [ -f "$f" ] && printf '%s\n' "$f"
done)
paste -d' ' <(printf '%s\n' "$files" | git hash-object --stdin-paths) <(printf '%s\n' "$files") | sha1sum | cut -c1-12
