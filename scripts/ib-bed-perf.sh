#!/usr/bin/env bash
# ib-bed-perf.sh — one measuring run in the soft-RoCE bed (scripts/ib-bed.sh), two
# guests, one rank each, all in one boot:
#   1. the fabric's own limit: perftest's ib_send_lat and ib_write_bw between the guests'
#      rxe0 (the bed's -p hook: guest 1 serves, guest 0 dials until it answers);
#   2. REPS repetitions of an all-reduce sweep by libcoll over COLL_TRANSPORT=ib and by
#      the MPI peer over the same rxe (MPICH 5 from its wheel, ch4:ucx, UCX_NET_DEVICES=
#      rxe0:1, UCX_RNDV_SCHEME=put_zcopy; scripts/ib-bed-perf-rank.sh), interleaved, their
#      order swapped each time;
#   3. the table: medians per size of each, their ratio, perftest beside them
#      (scripts/ib-bed-table.py).
# Everything is emulated (TCG CPUs, QEMU's UDP wire): only ratios within one run mean
# anything (docs/ib-bed.md).
#
# usage: scripts/ib-bed-perf.sh [-r REPS] [-o DIR] [BUILD_DIR] [-- SWEEPS...]
#   -r REPS     repetitions of each library (default 3)
#   -o DIR      keep every guest's output here (default: a temporary folder)
#   BUILD_DIR   where coll-bench and bench/peers were built (default: build)
#   SWEEPS      one word per sweep of coll-bench / mpi_coll_bench flags (default: 8 B to
#               32 KiB and 64 KiB with 50 and 20 calls a size, 1, 4 and 16 MiB with 2: a
#               small call's time on this wire varies 10x from call to call)
# The MPI peer comes from bench/peers/get_wheels.sh (PEERS_DIR, default
# /opt/libcoll/peers); without it only libcoll and perftest run.  Must never: run beside
# another benchmark (the machine has two cores), or run unbounded (-t bounds the bed).
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
reps=3 keep=""
while getopts "r:o:h" o; do
  case $o in
    r) reps=$OPTARG ;;
    o) keep=$OPTARG ;;
    *) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
build=build
if [ $# -gt 0 ] && [ "$1" != "--" ]; then build=$1; shift; fi
[ "${1:-}" = "--" ] && shift
sweep=("$@")
[ ${#sweep[@]} -gt 0 ] ||
  sweep=("-b 8 -e 32K -f 8 -n 50 -w 5" "-b 64K -e 64K -n 20 -w 2" "-b 1M -e 16M -f 4 -n 2 -w 1")
bench=$(readlink -f "$build/bench/coll-bench") || { echo "no $build/bench/coll-bench" >&2; exit 2; }
peers=${PEERS_DIR:-/opt/libcoll/peers}
mpi=$(readlink -f "$build/bench/peers/mpi_coll_bench.mpich5" 2>/dev/null || true)
mpiexec=$peers/mpich-5.0.2/bin/mpiexec.hydra
if [ -z "$mpi" ] || [ ! -x "$mpiexec" ]; then
  echo "ib-bed-perf: no MPICH 5 peer ($build/bench/peers/mpi_coll_bench.mpich5, $mpiexec):" \
    "run bench/peers/get_wheels.sh and rebuild; measuring libcoll and perftest only" >&2
  mpi=none
fi
# ib_send_lat (8 B, 64 KiB) then ib_write_bw (64 KiB, 1 MiB), few iterations (the wire moves
# ~15 MB/s); perftest's server exits after one test, so guest 1 serves each in turn and
# guest 0 retries its dial until the server listens (bounded: 600 tries, ~2 min, longer
# than a server that hangs after its test takes to be killed by its 90 s timeout).
hook='exec >>/run/bed/perf-g$BED_GUEST.txt 2>&1
for t in "ib_send_lat -s 8 -n 500" "ib_send_lat -s 65536 -n 100" "ib_write_bw -s 65536 -n 200" \
  "ib_write_bw -s 1048576 -n 40"; do
  if [ "$BED_GUEST" = 1 ]; then timeout 90 $t -d rxe0 -x 1 -F
  else
    for i in $(seq 600); do timeout 90 $t -d rxe0 -x 1 -F 10.78.0.2 && break; sleep 0.2; done
  fi
done'
out=${keep:-$(mktemp -d)}
mkdir -p "$out"
[ -n "$keep" ] || trap 'rm -rf "$out"' EXIT
limit=$((180 + reps * 600))
"$src/scripts/ib-bed.sh" -k 2 -n 1 -t "$limit" -o "$out" -p "$hook" -- \
  "$src/scripts/ib-bed-perf-rank.sh" "$reps" "$bench" "$mpi" "$mpiexec" -- "${sweep[@]}" \
  >"$out/bed.txt" 2>&1
rc=$?
python3 "$src/scripts/ib-bed-table.py" "$out" || rc=${rc:-1}
[ $rc = 0 ] || { echo "ib-bed-perf: the bed exited with $rc; its output:" >&2; tail -40 "$out/bed.txt" >&2; }
exit $rc
