#!/bin/bash
# ib-bed-perf-rank.sh — one guest's part of scripts/ib-bed-perf.sh, run by the bed as the
# rank program (one rank per guest, RANK/WORLD_SIZE/MASTER_ADDR from the bed): REPS
# repetitions of the same all-reduce sweep by libcoll (COLL_TRANSPORT=ib) and by the MPI
# peer (MPICH 5 from its wheel, ch4:ucx, UCX restricted to rxe0), their order swapped
# every repetition so that neither always runs first.  Both block on each call (coll-bench
# -z 1, as mpi_coll_bench does), so both time calls made inline by the caller.  Each run's table goes to
# stdout under a line "=== WHO rep R", which ib-bed-table.py reads.
#
# The MPI job is started the way a cluster without ssh starts it: hydra's manual
# launcher prints one proxy command per host; guest 0 runs its own and hands guest 1's
# over a TCP socket on the wire (busybox nc), where guest 1 waits for it.
#
# usage (by the bed): ib-bed-perf-rank.sh REPS COLL_BENCH MPI_BENCH MPIEXEC -- SWEEP...
#   SWEEP: one word per sweep, its flags the same for both (e.g. "-b 8 -e 64K -f 8 -n 50"):
#   small sizes need many calls to say anything on this wire, large ones cannot afford them
# Must never: run the two libraries at once (they share the emulated wire and 2 vCPUs),
# or wait unbounded (the bed's -t kills the guest; every wait here is counted).
set -uo pipefail
reps=$1 coll=$2 mpi=$3 mpiexec=$4
shift 4
[ "${1:-}" = "--" ] && shift
base=29500

run_coll() { # $1 rep, then the sweep's flags
  local rep=$1
  shift
  echo "=== libcoll rep $rep"
  local sw k=0
  for sw in "$@"; do
    # shellcheck disable=SC2086 # a sweep's flags are words
    MASTER_PORT=$((base + 200 * rep + k)) COLL_TRANSPORT=ib COLL_TUNE_FILE=none \
      timeout 300 "$coll" all_reduce $sw -z 1 || return 1
    k=$((k + 1))
  done
}

run_mpi() { # $1 rep, then the sweep's flags
  local rep=$1
  shift
  [ "$mpi" = none ] && return 0
  local sw k=0 rc=0
  for sw in "$@"; do
    # shellcheck disable=SC2086 # a sweep's flags are words
    mpi_job $((base + 200 * rep + 100 + 2 * k)) /run/tmp/hydra-$rep-$k.out "$rep" "$k" $sw || rc=1
    k=$((k + 1))
  done
  return $rc
}

mpi_job() { # PORT OUTFILE REP SWEEP_INDEX FLAGS...: one MPI job of one sweep
  local port=$1 out=$2 rep=$3 k=$4
  shift 4
  if [ "$RANK" != 0 ]; then
    # the launch line, then (after the job) guest 0's word that the job is over: a hydra
    # proxy may outlive its job, and this guest must be listening for the next
    # repetition's line by the time guest 0 sends it
    local cmd pp
    cmd=$(timeout 600 busybox nc -l -p "$port") || { echo "no launch line from guest 0"; return 1; }
    timeout 600 $cmd &
    pp=$!
    timeout 900 busybox nc -l -p $((port + 1)) >/dev/null
    kill "$pp" 2>/dev/null
    wait "$pp" 2>/dev/null
    return 0
  fi
  [ "$k" = 0 ] && echo "=== mpich5 rep $rep"
  # The peer's best settings here: UCX over rxe0 only (no tcp on eth0), and rendezvous by
  # RDMA WRITE (put_zcopy), as ib_write_bw moves data: with UCX's default (get_zcopy, RDMA
  # READ) a 2 MiB all-reduce took 9.6 s on the bed and 16 MiB did not end within 300 s;
  # with put_zcopy 0.3-0.8 s and 3.2-3.6 s.
  MPIR_CVAR_CH4_NETMOD=ucx UCX_NET_DEVICES=rxe0:1 UCX_RNDV_SCHEME=put_zcopy timeout 300 \
    "$mpiexec" -launcher manual -iface eth0 -hosts 10.78.0.1,10.78.0.2 -n 2 -ppn 1 \
    "$mpi" all_reduce "$@" >"$out" 2>&1 &
  local hp=$! i
  for i in $(seq 400); do grep -q HYDRA_LAUNCH_END "$out" && break; sleep 0.05; done
  local l0 l1
  l0=$(sed -n 's/^HYDRA_LAUNCH: \(.*--proxy-id 0.*\)/\1/p' "$out")
  l1=$(sed -n 's/^HYDRA_LAUNCH: \(.*--proxy-id 1.*\)/\1/p' "$out")
  tell "$port" "$l1"
  $l0 >/dev/null 2>&1 &
  local p0=$!
  wait "$hp"
  local rc=$?
  kill "$p0" 2>/dev/null
  wait "$p0" 2>/dev/null
  tell $((port + 1)) done
  grep -v '^HYDRA_LAUNCH' "$out"
  # hydra's manual launch ends with its own complaints and a non-zero status even when
  # the job ran; the job's own verdict is the table's last line
  grep -q "Out of bounds values : 0 OK" "$out" && return 0
  return $rc
}

# tell PORT LINE: guest 1 listens there (busybox nc -l); dial until it answers (bounded,
# ~2 min), write the line and close, so that its nc sees the end and exits
tell() {
  local i
  for i in $(seq 1200); do
    if exec 3<>"/dev/tcp/10.78.0.2/$1"; then
      echo "$2" >&3
      exec 3>&-
      return 0
    fi 2>/dev/null
    sleep 0.1
  done
  echo "guest 1 never listened on port $1"
  return 1
}

rc=0
for ((r = 1; r <= reps; r++)); do
  if ((r % 2)); then
    run_coll "$r" "$@" || rc=1
    run_mpi "$r" "$@" || rc=1
  else
    run_mpi "$r" "$@" || rc=1
    run_coll "$r" "$@" || rc=1
  fi
done
exit $rc
