#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `mla run --dcp 2` as two processes started torchrun-style on one host, meeting through the TCP
# rendezvous (MASTER_ADDR / MASTER_PORT, no rendezvous path): both ranks exit 0 and rank 0's oracle check
# passes. Then a rank whose peer never comes fails within the timeout, naming the port.
# Usage: tests/cli_dcp_tcp_test.sh path/to/mla
set -u
mla=$1
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
run_rank() {  # run_rank RANK extra-env...
  local r=$1; shift
  env -u MLA_DCP_RENDEZVOUS -u MLA_NCCL_ID -u MLA_DCP_PORT RANK="$r" WORLD_SIZE=2 LOCAL_RANK="$r" \
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$((port - 1)) MLA_DCP_TIMEOUT_MS=60000 "$@" \
    "$mla" run --backend cpu --steps 8 --no-progress --dcp 2
}
run_rank 1 > "$out/rank1.txt" 2>&1 &
pid1=$!
run_rank 0 > "$out/rank0.txt" 2>&1
rc0=$?
wait $pid1
rc1=$?
fails=0
if [ $rc0 -ne 0 ] || [ $rc1 -ne 0 ] || ! grep -q "PASSED" "$out/rank0.txt" || ! grep -q "2 ranks as processes (socket group)" "$out/rank0.txt"; then
  echo "FAIL: TCP rendezvous run: rank 0 exit $rc0, rank 1 exit $rc1"
  tail -5 "$out/rank0.txt" "$out/rank1.txt"
  fails=$((fails + 1))
fi
# Rank 0 alone: the others never connect.
msg=$(run_rank 0 MLA_DCP_TIMEOUT_MS=500 2>&1); rc=$?
if [ $rc -eq 0 ] || [[ "$msg" != *"only 0 of the other ranks connected to port $port"* ]]; then
  echo "FAIL: absent rank 1 -> exit $rc: $(echo "$msg" | tail -2)"
  fails=$((fails + 1))
fi
[ $fails -eq 0 ] && echo "cli dcp tcp: all passed"
exit $fails
