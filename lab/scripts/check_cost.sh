#!/usr/bin/env bash
# check_cost.sh — what COLL_CHECK=1 costs: all-reduce (float32 sum) at 8 B, 1 KiB and
# 64 MiB on 2 and 4 local ranks, COLL_CHECK=0 and =1 alternated run by run so that drift
# in the machine's load hits both alike.  Prints one line per run:
#   ranks size check rep time_out_of_place_us time_in_place_us load_average
# Usage: lab/scripts/check_cost.sh [BUILD_DIR]   (default build); summarise with min/median.
set -eu
cd "$(dirname "$0")/../.."
build=${1:-build}
for n in 2 4; do
  for sz in 8 1K 64M; do
    if [ $sz = 64M ]; then it="-n 3 -w 1"; reps=3; else it="-n 1000 -w 100"; reps=6; fi
    for rep in $(seq $reps); do
      for chk in 0 1; do
        t=$(COLL_CHECK=$chk "$build"/bench/coll-bench all_reduce --ranks $n -b $sz -e $sz $it -c 0 2>&1 | grep -E '^ +[0-9]' | awk '{print $6, $10}')
        echo "$n $sz $chk $rep $t $(cut -d' ' -f1 /proc/loadavg)"
      done
    done
  done
done
