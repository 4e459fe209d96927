#!/bin/bash
# side_by_side_large.sh — the large-message table of docs/perf.md (issue 4): Open MPI and
# MPICH (malloc-tuned, bench/peers/mpi_coll_bench.*) against coll-bench with malloc'd
# buffers (-R 0) and coll_mem_alloc windows (-R 1), 2 and 4 ranks, all-reduce, all-gather
# and reduce-scatter at 64 and 256 MiB, interleaved per repetition; prints the table of
# medians and ratios, and keeps every run's output (and runs.txt, one line per
# measurement) in the directory it names.
# Usage: lab/scripts/side_by_side_large.sh [reps (default 3)] [build dir (default build)]
# Needs a build with the peers: ninja -C build builds bench/peers/mpi_coll_bench.openmpi
# and .mpich when meson found Open MPI and MPICH (scripts/setup.sh installs both).
set -u
cd "$(dirname "$0")/../.." || exit 1
exec /usr/bin/python3 bench/peers/side_by_side.py --preset large --reps "${1:-3}" \
  --build "${2:-build}" --placement both
