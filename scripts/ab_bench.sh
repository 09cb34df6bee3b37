#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One environment switch A/B on single shapes, alternating on the same machine (the `ab` step of
# decode_sm90_check.sh and sparse_sm90_check.sh). Usage: scripts/ab_bench.sh <op> <line regex> <mla binary>
# Env: AB_ARGS (one shape per line), AB_ENV (B's environment, e.g. MLA_DECODE_SM90_STAGE=ring), AB_ROUNDS.
set -u
op=$1; pattern=$2; mla=$3
while read -r args; do
  [ -z "$args" ] && continue
  for r in $(seq "${AB_ROUNDS:-2}"); do
    timeout 60 "$mla" bench --ops "$op" $args --variant sm90 2>&1 | grep -E "$pattern" | cut -c1-150 | sed "s/^/A r$r: /"
    env ${AB_ENV:-} timeout 60 "$mla" bench --ops "$op" $args --variant sm90 2>&1 | grep -E "$pattern" | cut -c1-150 |
      sed "s/^/B r$r: /"
  done
done <<<"${AB_ARGS:-}"
