#!/bin/bash
# ib-bed-guest.sh — what one guest of the InfiniBand test bed does once ib-bed-init.sh has
# switched into the host's (read-only) root: brings up its NIC with 10.78.0.(G+1)/24, adds
# a soft-RoCE device (rxe0) on it and waits, bounded, for its port to be ACTIVE with a
# RoCE v2 GID; runs the job's guest hook (BED_PRE, e.g. netem); starts this guest's ranks
# with the env-based init (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), each
# under a kill timeout, its output in /run/bed/gG/rankR.out and its exit status in
# rankR.rc; records what RDMA resources are left (`rdma resource show qp|mr`) after the
# ranks end; then powers the guest off.  The job (/run/bed/job.sh, written by ib-bed.sh)
# says what to run; BED_GUEST arrives on the kernel command line.
#
# Must never: write outside /run, /dev/shm, the results share and its own overlay on /tmp
# (whose upper layer is tmpfs: nothing reaches the host's /tmp), or end without the
# reboot that lets QEMU exit (every path goes through finish).
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/run/home TMPDIR=/run/tmp
mount -t proc proc /proc
mount -t sysfs sys /sys
g=${BED_GUEST:-0}
out=/run/bed/g$g
mkdir -p "$out"
exec >"$out/guest.log" 2>&1

finish() {
  echo "guest $g: $1"
  echo "$1" >"$out/status"
  sync
  echo b >/proc/sysrq-trigger
  sleep 60 # the reboot above ends the guest; never reached
}

# /tmp writable in the guest without hiding the host's (a build folder may live there):
# an overlay with the host's /tmp below and tmpfs above; without overlayfs, /tmp stays
# read-only and TMPDIR points elsewhere.
mkdir -p /run/tmpup/u /run/tmpup/w
mount -t overlay overlay -o lowerdir=/tmp,upperdir=/run/tmpup/u,workdir=/run/tmpup/w /tmp ||
  echo "guest $g: no overlay on /tmp: it stays read-only"
# shellcheck source=/dev/null
. /run/bed/job.sh || finish "cannot read /run/bed/job.sh"
hostname "bed-g$g"
ip link set lo up
ip link set eth0 up || finish "no eth0: the virtio NIC did not come up"
ip addr add "10.78.0.$((g + 1))/24" dev eth0
rdma link add rxe0 type rxe netdev eth0 || finish "rdma link add rxe0 type rxe netdev eth0 failed"
ready=0
for _ in $(seq 100); do # up to ~10 s: the port turns ACTIVE and the IPv4 GID appears
  if ibv_devinfo -d rxe0 2>/dev/null | grep -q PORT_ACTIVE &&
    grep -q "0000:0000:0000:0000:0000:ffff" /sys/class/infiniband/rxe0/ports/1/gids/* 2>/dev/null; then
    ready=1
    break
  fi
  sleep 0.1
done
[ $ready = 1 ] || finish "rxe0 did not become ACTIVE with an IPv4 GID within 10 s"
ibv_devinfo -d rxe0 -v >"$out/rxe0.txt" 2>&1
if [ -n "${BED_PRE:-}" ]; then
  bash -c "$BED_PRE" >"$out/pre.log" 2>&1 || finish "the guest hook failed: $BED_PRE"
fi

pids=()
for ((l = 0; l < BED_RANKS_PER_GUEST; l++)); do
  r=$((g * BED_RANKS_PER_GUEST + l))
  (
    export RANK=$r WORLD_SIZE=$((BED_GUESTS * BED_RANKS_PER_GUEST)) LOCAL_RANK=$l
    export LOCAL_WORLD_SIZE=$BED_RANKS_PER_GUEST MASTER_ADDR=10.78.0.1 MASTER_PORT=29500
    cd "$TMPDIR" || exit 1
    timeout -s KILL "$BED_LIMIT" "${BED_CMD[@]}" >"$out/rank$r.out" 2>&1
    echo $? >"$out/rank$r.rc"
  ) &
  pids+=($!)
done
if [ -n "${BED_DURING:-}" ]; then
  bash -c "$BED_DURING" >"$out/during.log" 2>&1 &
fi
for p in "${pids[@]}"; do wait "$p"; done
{
  echo "qp:"
  rdma resource show qp
  echo "mr:"
  rdma resource show mr
} >"$out/rdma-res.txt" 2>&1
finish "done"
