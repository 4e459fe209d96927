#!/bin/bash
# side_by_side_large.sh — the large-message table of docs/perf.md (issue 4): Open MPI,
# MPICH (malloc-tuned, from ../shared/peers) and libcoll's coll-bench, malloc'd buffers
# (-R 0) and coll_mem_alloc windows (-R 1), interleaved per repetition.
# Prints one line per measurement: rep np collective size who busbw(GB/s).
# Usage: scripts/side_by_side_large.sh [reps] [build dir]   (peers: make -C ../shared/peers)
set -u
REPS=${1:-3}
B=${2:-build}/bench/coll-bench
P=${PEERS:-/tmp/peers/build}
export GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=17179869184
mpi() { # $1 flavour $2 np $3 op
  local run=mpirun.$1 extra=()
  [ "$1" = openmpi ] && extra=(--allow-run-as-root --oversubscribe -x GLIBC_TUNABLES)
  timeout 600 "$run" "${extra[@]}" -np "$2" "$P/mpi_coll_bench.$1" -o "$3" -s 64M,256M -t 1 2>/dev/null |
    awk '$1 ~ /^[0-9]+$/ && $1 >= 67108864 {print $1, $8}'
}
ours() { # $1 np $2 coll $3 register
  timeout 600 "$B" "$2" --ranks "$1" -b 64M -e 256M -f 4 -n 10 -w 2 -c 0 -z 1 -R "$3" 2>/dev/null |
    awk '$1 ~ /^[0-9]+$/ && $1 >= 67108864 {print $1, $8, $12, $NF}'
}
for rep in $(seq "$REPS"); do
  for np in 2 4; do
    for pair in "allreduce all_reduce" "allgather all_gather" "reduce_scatter reduce_scatter"; do
      set -- $pair
      mpi openmpi "$np" "$1" | sed "s/^/$rep $np $2 /; s/ \([0-9.]*\)$/ openmpi \1/"
      mpi mpich "$np" "$1" | sed "s/^/$rep $np $2 /; s/ \([0-9.]*\)$/ mpich \1/"
      ours "$np" "$2" 0 | awk -v r="$rep" -v n="$np" -v c="$2" '{print r, n, c, $1, "libcoll-malloc", $2, "inplace", $3, $4}'
      ours "$np" "$2" 1 | awk -v r="$rep" -v n="$np" -v c="$2" '{print r, n, c, $1, "libcoll-windows", $2, "inplace", $3, $4}'
    done
  done
done
