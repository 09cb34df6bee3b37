#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A/B of two kernel choices on single shapes, alternating on the same machine (the `ab` step of
# decode_sm90_check.sh and sparse_sm90_check.sh). Usage: scripts/ab_bench.sh <op> <line regex> <mla binary>
# Env: AB_ARGS (one shape per line), AB_A / AB_B (each side's `mla bench --variant`: sm90_small, sm90_raw,
# sm90_seesaw or portable; empty: the automatic choice; defaults: A automatic, B sm90_seesaw), AB_ROUNDS.
# A forced kernel that cannot run a shape says so in its row.
set -u
op=$1; pattern=$2; mla=$3
variant_args() { if [ -n "$1" ]; then echo "--variant $1"; fi; }
a_args=$(variant_args "${AB_A:-}")
b_args=$(variant_args "${AB_B-sm90_seesaw}")
while read -r args; do
  [ -z "$args" ] && continue
  for r in $(seq "${AB_ROUNDS:-2}"); do
    # shellcheck disable=SC2086
    timeout 60 "$mla" bench --ops "$op" $args $a_args 2>&1 | grep -E "$pattern|cannot" | cut -c1-150 |
      sed "s/^/A r$r: /"
    # shellcheck disable=SC2086
    timeout 60 "$mla" bench --ops "$op" $args $b_args 2>&1 | grep -E "$pattern|cannot" | cut -c1-150 |
      sed "s/^/B r$r: /"
  done
done <<<"${AB_ARGS:-}"
