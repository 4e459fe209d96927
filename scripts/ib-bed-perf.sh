#!/usr/bin/env bash
# ib-bed-perf.sh — one short measuring run in the soft-RoCE bed (scripts/ib-bed.sh): two
# guests, the fabric's own limit first (perftest's ib_send_lat and ib_write_bw between
# the guests' rxe0, as the bed's -p hook: guest 1 serves, guest 0 dials until it answers),
# then coll-bench's all-reduce over COLL_TRANSPORT=ib across the same guests, 1 rank each,
# in the same boot.  Everything is emulated (TCG CPUs, QEMU's UDP wire): only the ratios
# within one run mean anything (docs/ib-bed.md).
#
# usage: scripts/ib-bed-perf.sh [BUILD_DIR] [-- extra coll-bench flags]
#   BUILD_DIR   where coll-bench was built (default: build)
# Prints perftest's and coll-bench's tables, prefixed by guest and rank.  Must never: run
# beside another benchmark (the machine has two cores), or run long (-t 240 bounds it).
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
bench=$(readlink -f "$build/bench/coll-bench") || { echo "no $build/bench/coll-bench" >&2; exit 2; }
# ib_send_lat (8 B, 64 KiB) then ib_write_bw (64 KiB, 1 MiB), few iterations (the wire moves
# ~15 MB/s); perftest's server exits after one test, so guest 1 serves
# each in turn and guest 0 retries its dial until the server listens (bounded).
hook='exec >>/run/bed/perf-g$BED_GUEST.txt 2>&1
for t in "ib_send_lat -s 8 -n 500" "ib_send_lat -s 65536 -n 100" "ib_write_bw -s 65536 -n 200" \
  "ib_write_bw -s 1048576 -n 40"; do
  if [ "$BED_GUEST" = 1 ]; then timeout 90 $t -d rxe0 -x 1 -F
  else
    for i in $(seq 100); do timeout 90 $t -d rxe0 -x 1 -F 10.78.0.2 && break; sleep 0.2; done
  fi
done'
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$src/scripts/ib-bed.sh" -k 2 -n 1 -t 240 -o "$out" -p "$hook" -e COLL_TRANSPORT=ib \
  -e COLL_TUNE_FILE=none -- "$bench" all_reduce -b 8 -e 16M -f 4 -n 5 -w 2 "$@"
rc=$?
for g in 0 1; do sed "s/^/[g$g perftest] /" "$out/perf-g$g.txt" 2>/dev/null; done
exit $rc
