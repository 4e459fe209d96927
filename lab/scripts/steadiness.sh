#!/usr/bin/env bash
# steadiness.sh — issue 44's steadiness check, and what a busy core does to the waits.
#
#   1. quiet: the issue's two commands (all-reduce float32, 64 MiB, 4 and 2 ranks,
#      out of place, blocking), each six times back to back, with the kernel's counts of
#      page faults, context switches and migrations (perf stat) beside each time;
#   2. busy: one `while :; do :; done` bound to CPU 1 (and killed at the end), then the
#      same calls with the build before base/backoff.c (OLD) and this one (NEW) run in
#      turn, REPS times, at 64 MiB and 1 MiB on 2 and 4 ranks and 64 KiB on 4, and Intel
#      MPI at its best setting of each row (polling on 2 ranks, wait mode on 4) beside them.
# Prints one line per run: part ranks size who rep time_us [counters].
# Usage: lab/scripts/steadiness.sh OLD_BUILD NEW_BUILD [REPS]   (NEW_BUILD also runs part 1)
set -eu
cd "$(dirname "$0")/../.."
old=$1 new=$2 reps=${3:-3}
P=${COLL_PEERS_DIR:-/opt/libcoll/peers}/impi-2021.19.0
t_of() { grep -E '^ +[0-9]+ ' | awk '{print $6}'; }
bench() { # build ranks size -> time of one run (out of place, us)
  local n=3 w=1
  case $3 in 64K) n=500 w=50 ;; 1M) n=50 w=5 ;; esac
  "$1"/bench/coll-bench all_reduce --ranks "$2" -b "$3" -e "$3" -d float -c 0 -z 1 -n $n -w $w 2>&1 | t_of
}
impi() { # ranks size -> Intel MPI's time (us)
  local env="I_MPI_FABRICS=shm I_MPI_ADJUST_ALLREDUCE=8"
  [ "$1" = 4 ] && env="I_MPI_FABRICS=shm I_MPI_WAIT_MODE=1 I_MPI_ADJUST_ALLREDUCE=10"
  env $env timeout 300 "$P"/bin/mpirun -np "$1" "$new"/bench/peers/mpi_coll_bench.impi all_reduce \
    -s "$2" -t 0.5 -n 3 -w 2 -c 0 2>&1 | t_of
}
for n in 4 2; do
  for rep in 1 2 3 4 5 6; do
    f=$(mktemp)
    t=$(perf stat -x, -e page-faults,context-switches,cpu-migrations -o "$f" \
      "$new"/bench/coll-bench all_reduce --ranks $n -b 64M -e 64M -d float -c 0 -z 1 -n 5 -w 2 2>&1 | t_of)
    echo "quiet $n 64M new $rep $t $(awk -F, '/^[0-9]/ {printf "%s=%s ", $3, $1}' "$f")"
    rm -f "$f"
  done
done
taskset -c 1 sh -c 'while :; do :; done' &
hog=$!
trap 'kill $hog 2>/dev/null; wait $hog 2>/dev/null' EXIT
for cfg in "2 64M" "4 64M" "2 1M" "4 1M" "4 64K"; do
  set -- $cfg
  for rep in $(seq "$reps"); do
    echo "busy $1 $2 old $rep $(bench "$old" "$1" "$2")"
    echo "busy $1 $2 new $rep $(bench "$new" "$1" "$2")"
    echo "busy $1 $2 impi $rep $(impi "$1" "$2")"
  done
done
