#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Same-machine A/B of the working tree against other git refs: each ref becomes its own `mla` binary, built on
# the GPU machine from the working tree with that ref's versions of the changed files laid over it, and the
# binaries are timed in alternating rounds in one call (single `mla bench` rows move 3..8% between calls on the
# H200, so a claim needs both sides in the same run: docs/PERFORMANCE.md).
#
# Here, in a clone (the GPU machine gets no .git):
#   scripts/ab_refs.sh prepare [--paths "DIR ..."] NAME=REF [NAME=REF ...]
#     For each NAME, REF's contents of every file under the paths (default: src include bench apps) that differs
#     between REF and the working tree (committed or not) go to .carry/ab/NAME/<path>. Only files present on both
#     sides: an added or deleted file is named and refused (the build globs sources; lay such a change over by
#     hand). Then call the device tool with carry [".carry"].
# On the GPU machine, from the repo root (build dir $B, default build-gpu):
#   scripts/ab_refs.sh build          the working tree: mla_cli + mla_gpu_tests, the CLI copied to $B/mla_W
#   scripts/ab_refs.sh variants       for each .carry/ab/NAME: its files laid over, mla_cli rebuilt ($J jobs,
#                                     default 10), copied to $B/mla_NAME; the working tree's files put back
#                                     after each and W rebuilt at the end (run it in the background while the
#                                     tests run: mla_gpu_tests is not relinked)
# Or build the binaries here (no device time; a variant is 1..5 minutes of two cores) and carry them compressed;
# in one command (B_LOCAL, default build, is this machine's build dir):
#   scripts/ab_refs.sh local NAME=REF ...   each ref's mla and mla_gpu_tests, then W's, packed into .carry/bin
# or step by step:
#   B=build J=2 scripts/ab_refs.sh build; B=build J=2 NO_REBUILD=1 scripts/ab_refs.sh variants
#   B=build scripts/ab_refs.sh pack   $B/mla_* and $B/bin/mla_gpu_tests, xz-compressed, to .carry/bin (~5 MB each;
#                                     the call's carry is 64 MiB in all), then carry [".carry/bin"] and on the device.
#                                     $B/bin/mla_gpu_tests is taken as W's: a branch's test binary copied to
#                                     $B/mla_gpu_tests_NAME travels as that, so rebuild W's after building it.
#   scripts/ab_refs.sh unpack         them into $B (default build-gpu): $B/mla_NAME, $B/bin/mla_gpu_tests; fails
#                                     when a library they need is missing there (then build there as above).
#                                     Run the tests with MLA_FIXTURE_DIR=$PWD/tests/fixtures (built here, they
#                                     name this checkout's path).
#   Built here, they link the CUDA toolkit's libraries by their run path /usr/local/cuda/lib, and Debian's fmt 9,
#   OpenBLAS and libstdc++, which the GPU machine's Ubuntu has too.
#   scripts/ab_refs.sh bench ROUNDS "VARIANT ..." "SHAPE" ["SHAPE" ...]
#     VARIANT: NAME (W = the working tree) or NAME:VAR=VALUE[,VAR=VALUE] (that binary under those environment
#     variables; the kernels read none, so this is for deployment settings). SHAPE: the arguments of `mla bench`
#     for one row, e.g. "--ops mqa_decode --b 128 --h-q 128 --s-k 4096"; to compare kernels of one binary, force
#     one in the shape ("... --variant sm90_seesaw", or sm90_small / sm90_raw / portable), or a named set (@seesaw-bf16, @seesaw-codes,
#     @sparse-prefill: shape_set below). Rounds alternate the variants shape by shape; every timing goes to
#     $OUT/ab.log, and a table of each shape's times per variant (and their median) to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build-gpu}
CARRY=.carry/ab

prepare() {
  local paths="src include bench apps"
  if [ "${1:-}" = --paths ]; then paths=$2; shift 2; fi
  [ $# -gt 0 ] || { echo "prepare: name at least one NAME=REF" >&2; exit 2; }
  rm -rf "$CARRY" && mkdir -p "$CARRY"
  for spec in "$@"; do
    local name=${spec%%=*} ref=${spec#*=}
    [[ "$spec" == *=* && "$name" =~ ^[A-Za-z0-9_]+$ && "$name" != W ]] || {
      echo "prepare: '$spec' is not NAME=REF (NAME letters, digits, _; W is the working tree)" >&2; exit 2; }
    git rev-parse --verify -q "$ref^{commit}" >/dev/null || { echo "prepare: no commit '$ref'" >&2; exit 2; }
    local other
    # shellcheck disable=SC2086
    other=$(git diff --name-only --diff-filter=ADRC "$ref" -- $paths)
    [ -z "$other" ] || {
      echo "prepare: $name: files added, deleted or renamed against $ref:" >&2; echo "$other" >&2; exit 2; }
    local n=0
    # shellcheck disable=SC2086
    while read -r f; do
      [ -n "$f" ] || continue
      mkdir -p "$CARRY/$name/$(dirname "$f")"
      git show "$ref:$f" >"$CARRY/$name/$f"
      n=$((n + 1))
    done < <(git diff --name-only --diff-filter=M "$ref" -- $paths)
    echo "$name = $(git rev-parse --short "$ref"): $n files"
  done
  du -sh "$CARRY" | cut -f1 | sed 's/^/.carry\/ab: /'
}

build_w() {
  [ -f "$B/CMakeCache.txt" ] || cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release >/tmp/ab_cmake.log 2>&1
  ninja -C "$B" -j"${J:-16}" mla_cli mla_gpu_tests >/tmp/ab_build_W.log 2>&1 || {
    grep -E 'error|FAILED' /tmp/ab_build_W.log | head -30; exit 1; }
  cp "$B/bin/mla" "$B/mla_W"
  echo "built W ($SECONDS s)"
}

variants() {
  [ -d "$CARRY" ] || { echo "variants: no $CARRY (prepare here, then carry .carry)" >&2; exit 2; }
  local keep=/tmp/ab_keep_W
  for dir in "$CARRY"/*/; do
    local name
    name=$(basename "$dir")
    rm -rf "$keep" && mkdir -p "$keep"
    (cd "$dir" && find . -type f) >/tmp/ab_files
    while read -r f; do mkdir -p "$keep/$(dirname "$f")"; cp -p "$f" "$keep/$f"; cp "$dir/$f" "$f"; done </tmp/ab_files
    local ok=1 targets=mla_cli
    [ "${TESTS:-0}" = 1 ] && targets="mla_cli mla_gpu_tests"
    # shellcheck disable=SC2086
    ninja -C "$B" -j"${J:-10}" $targets >"/tmp/ab_build_$name.log" 2>&1 || ok=0
    while read -r f; do cp "$keep/$f" "$f"; done </tmp/ab_files  # new times: ninja rebuilds W's objects
    if [ $ok = 1 ]; then
      cp "$B/bin/mla" "$B/mla_$name"
      [ "${TESTS:-0}" = 1 ] && cp "$B/bin/mla_gpu_tests" "$B/mla_gpu_tests_$name"
      echo "built $name ($SECONDS s)"
    else echo "build of $name FAILED:"; grep -E 'error|FAILED' "/tmp/ab_build_$name.log" | head -20; fi
  done
  # The working tree's files are back with new times: rebuild, so that the build dir holds W again (a later ninja,
  # e.g. of the tests, must not link a variant's objects).
  # NO_REBUILD=1 skips it (~2 min of device time) when nothing is built after the variants: then $B's objects are
  # the last variant's, and mla_W is still the working tree's CLI.
  if [ "${NO_REBUILD:-0}" = 1 ]; then echo "W not rebuilt (NO_REBUILD=1): $B holds the last variant's objects"; return; fi
  ninja -C "$B" -j"${J:-10}" mla_cli >/tmp/ab_build_W2.log 2>&1 || true
  echo "rebuilt W ($SECONDS s)"
}

BIN=.carry/bin

# Here: every binary an A/B call needs, built on this machine and packed (no build on the device). For each
# NAME=REF its mla and mla_gpu_tests (REF's files under src include bench apps tests laid over the working tree),
# then the working tree's (W), then pack. B defaults to build here; J to 2.
local_all() {
  [ $# -gt 0 ] || { echo "local: name at least one NAME=REF" >&2; exit 2; }
  prepare --paths "src include bench apps tests" "$@"
  local f
  while read -r f; do rm -f "$f"; done < <(binaries)  # earlier binaries
  TESTS=1 NO_REBUILD=1 variants
  build_w  # W's objects and test binary again, after the variants'
  pack  # a trace binary: copy it to $B/mla_T afterwards and pack again (COMMIT stays)
  { git rev-parse --short HEAD; for spec in "$@"; do echo "${spec%%=*} = $(git rev-parse --short "${spec#*=}")"; done; } \
    >"$BIN/COMMIT"
}

# The copies this script made in $B: mla_NAME / mla_gpu_tests_NAME (executable files only: CMake writes
# mla_gpu_tests[1]_*.cmake beside them); one per line. `with_tests`: then W's bin/mla_gpu_tests too.
binaries() {
  local f
  for f in "$B"/mla_* ${1:+"$B/bin/mla_gpu_tests"}; do
    if [ -f "$f" ] && [ -x "$f" ]; then echo "$f"; fi
  done
}

pack() {
  mkdir -p "$BIN" && rm -f "$BIN"/*.xz  # COMMIT (local's note of the trees) stays
  local f n=0
  while read -r f; do
    xz -T0 -6 -c "$f" >"$BIN/$(basename "$f").xz"
    n=$((n + 1))
  done < <(binaries with_tests)
  [ $n -gt 0 ] || { echo "pack: no $B/mla_* nor $B/bin/mla_gpu_tests (build them first)" >&2; exit 2; }
  du -sh "$BIN" | cut -f1 | sed "s|^|$BIN: $n binaries, |"
}

unpack() {
  [ -d "$BIN" ] || { echo "unpack: no $BIN (pack here, then carry .carry/bin)" >&2; exit 2; }
  mkdir -p "$B/bin"
  local f name dst missing=0
  for f in "$BIN"/*.xz; do
    name=$(basename "$f" .xz)
    dst="$B/$name"
    [ "$name" = mla_gpu_tests ] && dst="$B/bin/$name"
    if command -v xz >/dev/null; then xz -dc "$f" >"$dst"
    else python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' "$f" >"$dst"; fi
    chmod +x "$dst"
    if ldd "$dst" | grep -q 'not found'; then
      echo "unpack: $name needs libraries this machine lacks:"; ldd "$dst" | grep 'not found'; missing=1
    fi
  done
  [ $missing = 0 ] || exit 1
  echo "unpacked: $(cd "$BIN" && for f in *.xz; do printf '%s ' "${f%.xz}"; done)"
}

# One row: the time (ms), kernel variant and config of the first row of SHAPE's op that `mla bench SHAPE` reports
# for VARIANT (from its --json), tab-separated; "-" for a run that reported none.
row() {
  local v=$1 shape=$2 name=${1%%:*} env=() json=/tmp/ab_row.json
  [[ "$v" == *:* ]] && IFS=, read -r -a env <<<"${v#*:}"
  rm -f "$json"
  # shellcheck disable=SC2086
  env "${env[@]}" timeout 60 "$B/mla_$name" bench $shape --json "$json" >/tmp/ab_row.log 2>&1 || true
  # The op's own row: `mla bench` reports the ceilings' rows first (op "ceiling: copy", ...) whatever --ops says.
  local op
  op=$(sed -n 's/.*--ops[ =]\([^ ]*\).*/\1/p' <<<"$shape")
  python3 -c 'import json, sys
try:
    r = [r for r in json.load(open(sys.argv[1]))["rows"] if r["op"] == sys.argv[2]][0]
    print("%.5f\t%s\t%s" % (r["time_ms"], r["variant"], r["config"]))
except Exception:
    print("-\t-\t-")' "$json" "$op"
}

# Named shape sets (SHAPE "@name"): the rows the seesaw kernel's A/Bs use.
shape_set() {
  case "$1" in
    @seesaw-bf16)  # dense bf16: h 128 s_k 4096 / 8192, s_q 2 h 128, h 64; b 4 h 16 (16 rows on the seesaw tile)
      printf '%s\n' "--ops mqa_decode --b 128 --h-q 128 --s-k 4096" "--ops mqa_decode --b 128 --h-q 128 --s-k 8192" \
        "--ops mqa_decode --b 128 --h-q 128 --s-q 2 --s-k 8192" "--ops mqa_decode --b 128 --h-q 64 --s-k 4096" \
        "--ops mqa_decode --b 4 --h-q 16 --s-k 1024" ;;
    @seesaw-codes)  # the code formats on the seesaw: crossover (h 128) and in-place (h 64), dense and sparse
      printf '%s\n' "--ops mqa_decode --b 128 --h-q 128 --s-k 4096 --format fp8" \
        "--ops mqa_decode --b 128 --h-q 64 --s-k 4096 --format fp8_ds_mla" \
        "--ops sparse_mqa --b 128 --h-q 128 --topk 2048 --format fp8_ds_mla" \
        "--ops sparse_mqa --b 128 --h-q 64 --topk 2048 --format fp8_ds_mla" ;;
    @sparse-prefill)  # issue 8's prefill row (GroupRows, bf16 rows)
      printf '%s\n' "--ops sparse_mqa --b 4096 --h-q 128 --topk 2048 --pool 8192 --format bf16 --iters 8" ;;
    @*) echo "bench: unknown shape set $1 (@seesaw-bf16, @seesaw-codes, @sparse-prefill)" >&2; exit 2 ;;
    *) printf '%s\n' "$1" ;;
  esac
}

bench() {
  local rounds=$1 vars=$2
  shift 2
  local shapes=() line
  for a in "$@"; do
    shape_set "$a" >/dev/null || exit 2
    while IFS= read -r line; do shapes+=("$line"); done < <(shape_set "$a")
  done
  set -- "${shapes[@]}"
  mkdir -p "${OUT:-/tmp}"
  # This call's rows (the table below reads only them: shape numbers restart with every call), then appended to
  # $OUT/ab.log, which keeps every call's.
  local rows
  rows=$(mktemp)
  for r in $(seq "$rounds"); do
    local i=0
    for shape in "$@"; do
      i=$((i + 1))
      for v in $vars; do printf '%s\t%d\t%d\t%s\n' "$v" "$i" "$r" "$(row "$v" "$shape")" >>"$rows"; done
    done
  done
  cat "$rows" >>"${OUT:-/tmp}/ab.log"
  local i=0
  for shape in "$@"; do
    i=$((i + 1))
    echo "shape $i: $shape"
    for v in $vars; do
      awk -F'\t' -v v="$v" -v i="$i" '$1 == v && $2 == i {
          ts = ts " " $4; if ($4 != "-") x[++c] = $4 + 0; k = $5
        }
        END {
          for (a = 1; a <= c; a++) for (b = a + 1; b <= c; b++) if (x[b] < x[a]) { y = x[a]; x[a] = x[b]; x[b] = y }
          med = c ? (c % 2 ? x[(c + 1) / 2] : (x[c / 2] + x[c / 2 + 1]) / 2) : 0
          printf "  %-34s %s   median %.4f  [%s]\n", v, ts, med, k
        }' "$rows"
    done
  done
  rm -f "$rows"
}

cmd=${1:-}
shift || true
case "$cmd" in
  prepare) prepare "$@" ;;
  build) build_w ;;
  variants) variants ;;
  bench) bench "$@" ;;
  pack) pack ;;
  local) B=${B_LOCAL:-build} J=${J:-2} local_all "$@" ;;
  unpack) unpack ;;
  *) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 2 ;;
esac
