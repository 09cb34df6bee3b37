#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Many-core fuzzing pass with prebuilt libFuzzer binaries (docs/DEVELOPING.md "Hostile input"): used to
# reach 10^6 executions per target on the GPU machine's 16 cores, where nothing is built.
#   scripts/fuzz_parallel.sh pack DIR   copies build-sanitize/bin/fuzz/fuzz_* (BUILD_DIR) without debug
#                                       info, the shared libraries they load and glibc's loader into
#                                       DIR/fuzzpack.tar.xz, with this script beside it
#   DIR/fuzz_parallel.sh run PLAN...    unpacks and runs; PLAN entries are name:workers (layer:7 ...)
# Each worker is one libFuzzer process (own seed, OMP_NUM_THREADS=1) sharing its target's corpus
# directory (libFuzzer reloads it, so workers build on each other's finds), running RUNS / workers
# executions (RUNS default 10^6) or until SECONDS (default 450) have passed. A worker that ends early
# frees its core for one more worker of the target furthest from RUNS. Results in OUT (default
# ./fuzz-out): summary.txt, per target the summed stat::number_of_executed_units of its workers and
# the workers that failed (crash, sanitizer report, FUZZ CONTRACT BROKEN); logs.tgz, every worker's
# log and reproducer (<name>-<worker>-crash-*). A target whose worker failed gets no more workers.
set -uo pipefail
cmd=${1:-}
shift || true
if [ "$cmd" = pack ]; then
  dir=${1:?usage: fuzz_parallel.sh pack DIR}
  bin=${BUILD_DIR:-build-sanitize}/bin/fuzz
  tmp=$(mktemp -d)
  mkdir -p "$tmp/bin" "$tmp/lib" "$tmp/glibc" "$dir"
  for f in "$bin"/fuzz_*; do objcopy --strip-debug "$f" "$tmp/bin/$(basename "$f")"; done
  for l in $(ldd "$bin"/fuzz_* | grep -o '=> /[^ ]*' | awk '{print $2}' | sort -u) /lib64/ld-linux-x86-64.so.2; do
    case $(basename "$l") in libc.so.*|libm.so.*|ld-linux*) cp -L "$l" "$tmp/glibc/" ;; *) cp -L "$l" "$tmp/lib/" ;; esac
  done
  tar -C "$tmp" -cf - bin lib glibc | xz -T2 -6 >"$dir/fuzzpack.tar.xz"
  cp "$0" "$dir/fuzz_parallel.sh"
  rm -rf "$tmp"
  ls -la "$dir"
  exit 0
fi
[ "$cmd" = run ] || { echo "usage: fuzz_parallel.sh pack DIR | run name:workers ..."; exit 2; }
cd "$(dirname "$0")"
OUT=${OUT:-$PWD/fuzz-out}
RUNS=${RUNS:-1000000}
end=$(($(date +%s) + ${SECONDS_BUDGET:-450}))
mkdir -p "$OUT" x corpus
tar -xJf fuzzpack.tar.xz -C x
# The binaries were linked on Debian 12; use its loader and libc when the host's do not fit.
if env LD_LIBRARY_PATH=x/lib x/bin/fuzz_dlpack -runs=1 >/dev/null 2>&1; then launcher=(env LD_LIBRARY_PATH=x/lib)
else launcher=(x/glibc/ld-linux-x86-64.so.2 --library-path x/lib:x/glibc); fi
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failure='CONTRACT BROKEN|ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:|ERROR: libFuzzer'
declare -A workers
names=()
start_worker() {  # name runs
  local name=$1 runs=$2 k=${workers[$1]:-0}
  workers[$name]=$((k + 1))
  mkdir -p "corpus/$name"
  "${launcher[@]}" "x/bin/fuzz_$name" -runs="$runs" -seed=$((1000 + 37 * k)) -max_total_time=$((end - $(date +%s))) \
    -len_control=0 -max_len=2048 -print_final_stats=1 -artifact_prefix="$OUT/$name-$k-" "corpus/$name" \
    >"$OUT/$name.$k.log" 2>&1 &
}
executed() {  # executions so far of a target's workers (their last "#N" or final count)
  local total=0 f n
  for f in "$OUT/$1".*.log; do
    # The final count (a crashing worker prints it twice), else the last progress line.
    n=$(grep -ao 'stat::number_of_executed_units: *[0-9]*' "$f" | tail -1 | grep -o '[0-9]*$')
    [ -n "$n" ] || n=$(grep -ao '^#[0-9]*' "$f" | tail -1 | tr -d '#')
    total=$((total + ${n:-0}))
  done
  echo $total
}
failed() { grep -qlE "$failure" "$OUT/$1".*.log 2>/dev/null; }
for entry in "$@"; do
  name=${entry%%:*}
  n=${entry##*:}
  names+=("$name")
  for ((i = 0; i < n; ++i)); do start_worker "$name" $(((RUNS + n - 1) / n)); done
done
while [ "$(jobs -rp | wc -l)" -gt 0 ]; do
  wait -n
  left=$((end - $(date +%s)))
  [ $left -lt 60 ] && continue
  best= best_frac=2000000
  for name in "${names[@]}"; do
    failed "$name" && continue  # its reproducer is saved; more workers would find the same
    frac=$(($(executed "$name") * 1000 / RUNS))
    [ $frac -lt $best_frac ] && { best=$name; best_frac=$frac; }
  done
  [ -n "$best" ] && [ $best_frac -lt 1000 ] && start_worker "$best" "$RUNS"
done
wait
{
  echo "fuzz_parallel.sh: $(nproc --all) cores, $(date -u +%FT%TZ), RUNS $RUNS"
  for name in "${names[@]}"; do
    bad=$(grep -lE "$failure" "$OUT/$name".*.log | wc -l)
    unfinished=$(grep -L 'stat::number_of_executed_units' "$OUT/$name".*.log | wc -l)
    echo "fuzz_$name: $(executed "$name") executions in ${workers[$name]} workers; workers with a failure: $bad; without final stats: $unfinished"
  done
} | tee "$OUT/summary.txt"
# One archive for the logs and reproducers (a device returns a limited number of files).
(cd "$OUT" && files=$(ls | grep -v -e '^summary.txt$' -e '^logs.tgz$') && [ -n "$files" ] && tar -czf logs.tgz $files && rm -f $files)
