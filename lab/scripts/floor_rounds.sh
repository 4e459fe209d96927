#!/usr/bin/env bash
# floor_rounds.sh — the 2-rank all-reduce against the machine's floor, timed the same way.
# Each round reads the spin round trip between CPUs 0 and 1, then times at one size, back
# to back and in this order: exchange_bound -r -b out of place and in place (the floor,
# no library), libcoll's coll-bench, and Intel MPI's settings 8 and 13 through
# mpi_coll_bench.  Every figure is a mean over calls run back to back, as both benchmarks
# time a call.  One line per round:
#   rt_us probe_out probe_in libcoll_out libcoll_in impi8_out impi8_in impi13_out impi13_in
# Usage: lab/scripts/floor_rounds.sh SIZE_KIB [ROUNDS (default 8)] [BUILD_DIR (default build)]
# Needs Intel MPI's wheel under COLL_PEERS_DIR (default /opt/libcoll/peers; get_wheels.sh)
# and the probe built: cc -O2 -mavx512f -pthread lab/scripts/exchange_bound.c -o /tmp/exchange_bound
set -eu
cd "$(dirname "$0")/../.."
kib=$1
rounds=${2:-8}
build=${3:-build}
probe=${EXCHANGE_BOUND:-/tmp/exchange_bound}
impi=${COLL_PEERS_DIR:-/opt/libcoll/peers}/impi-2021.19.0
bytes=$((kib * 1024))
calls=$((1073741824 / bytes)) # about 1 GiB moved per figure
[ "$calls" -gt 20000 ] && calls=20000
rt() { "$build"/bench/peers/pingpong_bench -m spin -n 20000 | awk '$1 == "spin" {print $8}'; }
floor() { "$probe" "$kib" 64 8 "$calls" -r -b "$@" | awk '/^back to back/ {print $5}'; }
libcoll() {
  "$build"/bench/coll-bench all_reduce --ranks 2 -b "$bytes" -e "$bytes" -d float -c 0 -z 1 \
    -n "$calls" -w 20 2>&1 | awk '/^ +[0-9]/ {print $6, $10}'
}
impi() {
  I_MPI_ADJUST_ALLREDUCE=$1 I_MPI_FABRICS=shm "$impi"/bin/mpirun -np 2 \
    "$build"/bench/peers/mpi_coll_bench.impi all_reduce -s "$bytes" -t 0.3 -n 5 -w 5 -c 0 2>&1 |
    awk -v b="$bytes" '$1 == b {print $6, $10}'
}
for _ in $(seq "$rounds"); do
  echo "$(rt) $(floor) $(floor -i) $(libcoll) $(impi 8) $(impi 13)"
done
