#!/usr/bin/env bash
# ddp_perf.sh — the DDP measurements of lab/perf-log.md, in one session: tokens/s for
# N = 1, 2, 4 ranks over libcoll and Open MPI, overlap on vs --no-overlap, and the bucket
# sweep. Prints one summary line per run. Usage: ddp_perf.sh [build dir] (build-ddp).
# Model: 6 layers x 256 channels = 4.8 M parameters = 18.4 MiB of gradients; each rank
# trains batch 4 x seq 64 per step (a fixed per-rank batch: weak scaling).
set -euo pipefail
BUILD=${1:-build-ddp}
CLI="$BUILD/libtrain/coll-train"
MODEL="--layers 6 --channels 256 --heads 8 --seq 64 --batch 4 --eval-every 0 --quiet"
STEPS=${STEPS:-12}
run() { # label, args...
  local label=$1; shift
  local out
  out=$("$CLI" $MODEL --steps "$STEPS" "$@" 2>&1) || { echo "$label: FAILED: $out"; return; }
  local tok ddp
  tok=$(grep -o '[0-9]* tok/s' <<<"$out" | tail -1)
  ddp=$(grep '^ddp:' <<<"$out" | sed 's/.*per step after the first: //' || true)
  printf '%-34s %12s  %s\n' "$label" "$tok" "$ddp"
}
echo "== throughput (bucket 25 MiB, overlap on)"
run "N=1 (no DDP)"
run "N=1 ddp coll" --parallel ddp --ranks 1
run "N=2 ddp coll" --parallel ddp --ranks 2
run "N=2 ddp mpi" --parallel ddp --ranks 2 --backend mpi
run "N=4 ddp coll (oversubscribed)" --parallel ddp --ranks 4
run "N=4 ddp mpi (oversubscribed)" --parallel ddp --ranks 4 --backend mpi
echo "== overlap (N=2, bucket 5 MiB)"
for be in coll mpi; do
  run "N=2 $be overlap" --parallel ddp --ranks 2 --backend $be --bucket-mb 5
  run "N=2 $be --no-overlap" --parallel ddp --ranks 2 --backend $be --bucket-mb 5 --no-overlap
done
echo "== bucket sweep (N=2, libcoll, overlap on)"
for mb in 1 5 25 100; do
  run "N=2 coll bucket $mb MiB" --parallel ddp --ranks 2 --bucket-mb $mb
done
