#!/usr/bin/env bash
# ib-bed-hier.sh — the host-aware all-reduce against the flat ring in the soft-RoCE bed
# (scripts/ib-bed.sh): 2 guests x 2 ranks, shared memory inside a guest and ib (rxe) across
# (COLL_TRANSPORT unset: auto), in one boot.  Each rank runs the same sequence, so the
# ranks meet for every job on a port of its own: coll-bench all-reduce forced onto the ring
# then onto hier, twice, interleaved (64 KiB .. 4 MiB, float, checked), then one
# --explain at 1 MiB with the tuner measuring (its choice, the model's figures per link
# class, and the bytes each rank sent inside its guest and across, beside the flat ring's).
# Everything is emulated (TCG CPUs, QEMU's UDP wire): only ratios within one run mean
# anything (docs/ib-bed.md).
#
# usage: scripts/ib-bed-hier.sh [BUILD_DIR] [-- extra coll-bench flags]
# Must never: run beside another benchmark (the machine has two cores), or run long (-t
# bounds it).
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
bench=$(readlink -f "$build/bench/coll-bench") || { echo "no $build/bench/coll-bench" >&2; exit 2; }
extra="$*"
# One job per port: 29601.. (the bed's MASTER_PORT is 29500); COLL_TUNE=0 for the forced
# runs (nothing to choose), measured for the --explain.
rank='port=29600
for rep in 1 2; do
  for algo in ring hier; do
    port=$((port + 1))
    echo "== rep $rep COLL_ALGO=$algo"
    MASTER_PORT=$port COLL_ALGO=$algo COLL_TUNE=0 "$0" all_reduce -b 64K -e 4M -f 4 -n 5 -w 2 \
      -d float $1 || exit $?
  done
done
echo "== explain, auto"
MASTER_PORT=$((port + 1)) COLL_TUNE_FILE=none "$0" all_reduce --explain -b 1M -e 1M -n 3 -w 1 \
  -d float $1'
exec "$src/scripts/ib-bed.sh" -k 2 -n 2 -t 500 -e COLL_TIMEOUT_MS=120000 -- \
  /bin/bash -c "$rank" "$bench" "$extra"
