#!/usr/bin/env bash
# tune_busy.sh — how busy the tuner's measuring was (base/foreign.c), and what a table
# measured beside a busy loop does (lab/perf-log.md, 2026-11-30 21:00).
#   lab/scripts/tune_busy.sh shares N RUNS   one fresh measurement per run (COLL_TUNE_BUSY=100,
#                                            a throwaway cache); prints the foreign= of each
#   lab/scripts/tune_busy.sh table ROUNDS    a quiet 2- and 4-rank cache first; then, beside
#                                            `while :; do :; done` on CPU 1, per round and rank
#                                            count, a fresh measurement (COLL_TUNE_FILE=none),
#                                            the fixed defaults (COLL_TUNE=0) and the quiet cache
#                                            in turn: start-up seconds, then size:µs(row)
# BUILD (default build) is the meson build directory.  Not run by the suite: it loads a core.
set -eu
cd "$(dirname "$0")/../.."
build=${BUILD:-build}
tmp=$(mktemp -d)
hog=
cleanup() { [ -n "$hog" ] && kill "$hog" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
case ${1:-} in
shares)
  out=""
  for _ in $(seq "$3"); do
    rm -f "$tmp/cache"
    COLL_TUNE_BUSY=100 COLL_TUNE_FILE="$tmp/cache" "$build"/bench/coll-bench all_reduce \
      --ranks "$2" -b 8 -e 8 -n 1 -w 0 >/dev/null 2>&1
    out="$out $(sed 's/.*foreign=//' "$tmp/cache")"
  done
  echo "n=$2:$out" ;;
table)
  for n in 2 4; do
    COLL_TUNE_FILE="$tmp/quiet" "$build"/bench/coll-bench all_reduce --ranks $n -b 8 -e 8 -n 1 \
      -w 0 >/dev/null 2>&1
  done
  taskset -c 1 bash -c 'while :; do :; done' &
  hog=$!
  for r in $(seq "$2"); do
    for n in 2 4; do
      for src in busy defaults quiet; do
        case $src in
        busy) e="COLL_TUNE_FILE=none" ;;
        defaults) e="COLL_TUNE=0" ;;
        quiet) e="COLL_TUNE_FILE=$tmp/quiet" ;;
        esac
        s=$(date +%s.%N)
        row=$(env "$e" "$build"/bench/coll-bench all_reduce --ranks $n -b 8 -e 1M -f 128 -d float \
          -c 0 -z 1 -n 50 -w 5 2>&1 | awk '/^ +[0-9]/ {printf "%s:%s(%s) ", $1, $6, $NF}')
        echo "r$r n=$n $src $(echo "$(date +%s.%N) - $s" | bc | cut -c1-5)s $row"
      done
    done
  done ;;
*) sed -n 2,11p "$0" >&2; exit 2 ;;
esac
