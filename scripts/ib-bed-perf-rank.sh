#!/bin/bash
# ib-bed-perf-rank.sh — one guest's part of scripts/ib-bed-perf.sh, run by the bed as the
# rank program (one rank per guest, RANK/WORLD_SIZE/MASTER_ADDR from the bed): REPS
# repetitions of the same all-reduce sweep by libcoll (COLL_TRANSPORT=ib) and by the MPI
# peer (MPICH 5 from its wheel, ch4:ucx, UCX restricted to rxe0), their order swapped
# every repetition so that neither always runs first.  Each run's table goes to
# stdout under a line "=== WHO rep R", which ib-bed-table.py reads.
#
# The MPI job is started the way a cluster without ssh starts it: hydra's manual
# launcher prints one proxy command per host; guest 0 runs its own and hands guest 1's
# over a TCP socket on the wire (busybox nc), where guest 1 waits for it.
#
# usage (by the bed): ib-bed-perf-rank.sh REPS COLL_BENCH MPI_BENCH MPIEXEC -- ARGS...
#   ARGS: the sweep's flags, the same for both (-b -e -f -n -w)
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
  MASTER_PORT=$((base + 2 * rep)) COLL_TRANSPORT=ib COLL_TUNE_FILE=none \
    timeout 300 "$coll" all_reduce "$@"
}

run_mpi() { # $1 rep
  local rep=$1 port=$((base + 2 * $1 + 1)) out=/run/tmp/hydra-$1.out
  shift
  [ "$mpi" = none ] && return 0
  if [ "$RANK" != 0 ]; then
    local cmd
    cmd=$(timeout 120 busybox nc -l -p "$port") || { echo "no launch line from guest 0"; return 1; }
    # the proxy's output goes back to mpiexec on guest 0
    timeout 300 $cmd
    return
  fi
  echo "=== mpich5 rep $rep"
  MPIR_CVAR_CH4_NETMOD=ucx UCX_NET_DEVICES=rxe0:1 timeout 300 "$mpiexec" -launcher manual \
    -iface eth0 -hosts 10.78.0.1,10.78.0.2 -n 2 -ppn 1 "$mpi" all_reduce "$@" >"$out" 2>&1 &
  local hp=$! i
  for i in $(seq 400); do grep -q HYDRA_LAUNCH_END "$out" && break; sleep 0.05; done
  local l0 l1
  l0=$(sed -n 's/^HYDRA_LAUNCH: \(.*--proxy-id 0.*\)/\1/p' "$out")
  l1=$(sed -n 's/^HYDRA_LAUNCH: \(.*--proxy-id 1.*\)/\1/p' "$out")
  for i in $(seq 300); do echo "$l1" | busybox nc 10.78.0.2 "$port" 2>/dev/null && break; sleep 0.1; done
  $l0 >/dev/null 2>&1 &
  wait "$hp"
  local rc=$?
  grep -v '^HYDRA_LAUNCH' "$out"
  return $rc
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
