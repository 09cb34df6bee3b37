#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# compute-sanitizer over the whole GPU test binary (issue 14: "the GPU suite stays compute-sanitizer
# clean: memcheck, racecheck, initcheck"), within a time budget per tool, with a summary that names
# every report's test, kind and source (a kernel of ours, NCCL, a CUDA API call) and the tests the
# budget left out. scripts/gpu_check.sh's `sanitize` step runs fixed subsets; this runs everything.
#
# Usage (on the GPU machine, after a build): scripts/gpu_sanitize.sh [tool ...]
#   tools: memcheck racecheck initcheck (default: all three, one after the other)
# Environment:
#   BUILD_DIR  build directory (default build-gpu); BIN the test binary (default $BUILD_DIR/bin/mla_gpu_tests)
#   FILTER     gtest filter (default '*')
#   EXCLUDE    gtest patterns to leave out, appended as FILTER's negative part (default none). Whole-suite
#              racecheck / initcheck do not finish in 150 s with 8 shards: run them with
#              EXCLUDE='LayerGraph.*:LayerGpu.*:LayerDcpGpu.*:DeepseekBlock*:PrefillAccuracyGpu.*:BlockOpsGpu.*'
#              and then FILTER set to those patterns with a larger BUDGET_S
#   SHARDS     processes per tool, run at once on the one GPU (gtest sharding; default 4)
#   BUDGET_S   seconds per tool (default 120): a shard still running then is stopped, and the summary
#              lists the test it was in and how many of its tests it did not reach
#   SANITIZER_ARGS  extra compute-sanitizer options (e.g. "--report-api-errors no" to leave out the
#              API-error reports and see the device-access ones alone)
#   OUT        log directory (default gpu-logs): sanitize_<tool>_<shard>.log, sanitize_summary.txt
# Exit status: 0 when every tool finished every test with no report and no failed test, 1 otherwise.
#
# Reading the summary: "api" reports are CUDA API calls that returned an error (NCCL probes driver
# entry points with cuGetProcAddress and reports nothing itself: those are listed under their
# library); "kernel" reports are device accesses and name the kernel. Each report must be read before
# it is called a false positive (docs/DEVELOPING.md "GPU sanitizers": the tool does not model every TMA /
# mbarrier case).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-gpu}
BIN=${BIN:-$BUILD_DIR/bin/mla_gpu_tests}
FILTER=${FILTER:-*}
SHARDS=${SHARDS:-4}
BUDGET_S=${BUDGET_S:-120}
LOG=${OUT:-gpu-logs}
TOOLS=${*:-memcheck racecheck initcheck}
mkdir -p "$LOG"
SUMMARY=$LOG/sanitize_summary.txt
[ -x "$BIN" ] || { echo "gpu_sanitize.sh: $BIN not found (build first: scripts/gpu_check.sh build)"; exit 1; }
command -v compute-sanitizer >/dev/null || PATH=$PATH:/usr/local/cuda/bin

# EXCLUDE: gtest patterns left out (':'-separated), e.g. the layer / graph / block cases that cost racecheck
# and initcheck minutes each, to run them in a call of their own (FILTER must then have no '-' part).
[ -n "${EXCLUDE:-}" ] && FILTER="$FILTER-$EXCLUDE"
# Test names of each shard, as gtest shards them: the i-th test that passes the filter runs in shard
# i % SHARDS (--gtest_list_tests ignores the sharding variables, so the split is made here).
"$BIN" --gtest_filter="$FILTER" --gtest_list_tests | awk '/^[^ ]/ {suite = $1} /^  / {print suite $1}' >"$LOG/all.tests"
for ((i = 0; i < SHARDS; ++i)); do
  awk -v n="$SHARDS" -v i="$i" '(NR - 1) % n == i' "$LOG/all.tests" >"$LOG/shard_$i.tests"
done
total=$(cat "$LOG"/shard_*.tests | wc -l)
{
  echo "gpu_sanitize.sh: $BIN, filter '$FILTER', $total tests in $SHARDS shards, budget ${BUDGET_S}s per tool"
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1
  compute-sanitizer --version 2>/dev/null | tail -1
} | tee "$SUMMARY"

rc=0
for tool in $TOOLS; do
  start=$(date +%s)
  rm -f "$LOG"/reports_"${tool}"_*.txt
  pids=()
  for ((i = 0; i < SHARDS; ++i)); do
    GTEST_TOTAL_SHARDS=$SHARDS GTEST_SHARD_INDEX=$i timeout -k 10 "$BUDGET_S" \
      compute-sanitizer --tool "$tool" --error-exitcode 9 --print-limit 200 ${SANITIZER_ARGS:-} "$BIN" --gtest_filter="$FILTER" \
      >"$LOG/sanitize_${tool}_$i.log" 2>&1 &
    pids+=($!)
  done
  for ((i = 0; i < SHARDS; ++i)); do
    wait "${pids[$i]}"
    echo $? >"$LOG/sanitize_${tool}_$i.status"
  done
  echo "== $tool: $(($(date +%s) - start)) s" | tee -a "$SUMMARY"
  for ((i = 0; i < SHARDS; ++i)); do
    f=$LOG/sanitize_${tool}_$i.log
    status=$(cat "$LOG/sanitize_${tool}_$i.status")
    # Per shard: tests finished / failed, the test a stopped shard was in, tests not reached, and every
    # report as "kind | source | test".
    awk -v status="$status" -v listed="$(wc -l <"$LOG/shard_$i.tests")" -v shard="$i" -v reports="$LOG/reports_${tool}_$i.txt" '
      /^\[ RUN      \]/ { test = $4; running = 1; started++ }
      /^\[       OK \]/ { ok++; running = 0 }
      /^\[  SKIPPED \]/ && $5 ~ /^\(/ { skipped++; running = 0 }
      /^\[  FAILED  \]/ && $4 ~ /\./ && $5 ~ /^\(/ { failed++; fails = fails " " $4; running = 0 }
      /^========= ERROR SUMMARY:/ { summary = $4 " errors" }
      /^========= RACECHECK SUMMARY:/ { summary = summary " (" substr($0, 30) ")" }
      # A report opens with "========= <what>" (no indentation); its source follows on indented lines.
      /^========= [A-Z]/ && !/SUMMARY|COMPUTE-SANITIZER|Target application returned/ {
        flush(); kind = substr($0, 11); src = ""; rtest = test; api = (kind ~ /on CUDA API call|Program hit/); open_report = 1; next }
      open_report && /^=========     at / && src == "" && !api { src = $0; sub(/^=========     at /, "", src); sub(/\+0x[0-9a-f]+.*/, "", src) }
      open_report && /^=========                in / && api && (src == "" || src ~ /libcuda|libcudart/) {
        lib = $0; sub(/^=========                in /, "", lib); n = split(lib, parts, "/"); src = parts[n] }
      function flush() {
        if (!open_report) return
        k = kind; gsub(/ of size [0-9]+ bytes?/, "", k); gsub(/0x[0-9a-f]+/, "ADDR", k); gsub(/ \(error [0-9]+\)/, "", k)
        printf "%s | %s | %s\n", (api ? "api: " : "kernel: ") k, (src == "" ? "?" : src), (rtest == "" ? "(before the first test)" : rtest) >> reports
        open_report = 0
      }
      END {
        flush()
        state = status == 124 || status == 137 ? "STOPPED at the budget in " test : status == 0 ? "clean" : status == 9 ? "reports" : "exit " status
        printf "  shard %s: %s; %d of %d tests finished (%d skipped), %d failed%s; reports: %s%s\n", shard, state, ok + failed + skipped,
               listed, skipped, failed, fails, summary == "" ? "none counted" : summary,
               (status == 124 || status == 137) ? sprintf("; %d tests not reached", listed - started) : ""
      }' "$f" | tee -a "$SUMMARY"
    case $status in 0) ;; *) rc=1 ;; esac
  done
  if ! cat "$LOG"/reports_"${tool}"_*.txt >/dev/null 2>&1; then
    echo "  no reports" | tee -a "$SUMMARY"
  else
    echo "  reports by kind | source (count, first tests):" | tee -a "$SUMMARY"
    cat "$LOG"/reports_"${tool}"_*.txt | awk -F' \\| ' '
      { key = $1 " | " $2; n[key]++; if (!index(t[key], $3) && c[key]++ < 3) t[key] = t[key] " " $3 }
      END { for (k in n) printf "    %5d  %s  [%s ]\n", n[k], k, t[k] }' | sort -rn | head -40 | tee -a "$SUMMARY"
  fi
done
echo "summary: $SUMMARY" && exit $rc
