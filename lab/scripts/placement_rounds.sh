#!/usr/bin/env bash
# placement_rounds.sh — does the 2-rank all-reduce follow where the host put the two CPUs?
# Each round reads the spin round trip between CPUs 0 and 1 (pingpong_bench -m spin), runs
# libcoll's and Intel MPI's (preset 13) 1 MiB all-reduce, and reads the round trip again.
# One line per round:
#   rt_before_us rt_after_us libcoll_out_us libcoll_in_us impi_out_us impi_in_us
# Usage: lab/scripts/placement_rounds.sh [ROUNDS (default 10)] [BUILD_DIR (default build)]
# Needs Intel MPI's wheel under COLL_PEERS_DIR (default /opt/libcoll/peers; get_wheels.sh).
set -eu
cd "$(dirname "$0")/../.."
rounds=${1:-10}
build=${2:-build}
impi=${COLL_PEERS_DIR:-/opt/libcoll/peers}/impi-2021.19.0
rt() { "$build"/bench/peers/pingpong_bench -m spin -n 20000 | awk '$1 == "spin" {print $8}'; }
for _ in $(seq "$rounds"); do
  a=$(rt)
  l=$("$build"/bench/coll-bench all_reduce --ranks 2 -b 1M -e 1M -d float -c 0 -z 1 -n 1000 -w 100 2>&1 |
    awk '/^ +[0-9]/ {print $6, $10}')
  m=$(I_MPI_ADJUST_ALLREDUCE=13 I_MPI_FABRICS=shm "$impi"/bin/mpirun -np 2 \
    "$build"/bench/peers/mpi_coll_bench.impi all_reduce -s 1048576 -t 0.3 -n 5 -w 5 -c 0 2>&1 |
    awk '/^ +1048576/ {print $6, $10}')
  echo "$a $(rt) $l $m"
done
