#!/usr/bin/env bash
# netns.sh — a multi-host test bed on one machine: K "hosts" as network namespaces, each
# with its own address, hostname and /dev/shm, joined by veth pairs to a bridge (in a
# namespace of its own, so the machine's own network is never touched), each link
# optionally capped with tc tbf in both directions.  Runs one rank of PROGRAM per host
# with the normal env-based init (RANK, WORLD_SIZE, COLL_ADDR = host 0), prefixes each
# host's output with [hI], and exits with the first non-zero status of any rank.
#
# Everything it makes is named after this invocation (pid + random), so runs can overlap,
# and torn down on any exit (trap): processes left in the namespaces are killed, the
# namespaces (and with them the veths, bridge and tc rules) deleted.
#
# usage: scripts/netns.sh [-k HOSTS] [-r RATE] [-b BURST] [-m MTU] [-t SECONDS] [-p PORT]
#                         [-q] -- PROGRAM [ARGS...]
#   -k HOSTS    number of hosts (default 2), addresses 10.77.0.1 .. 10.77.0.K
#   -r RATE     cap each host's link at RATE (tc units: 1gbit, 500mbit) both ways
#   -b BURST    tbf's bucket (tc units, default 256kb): a link idle for a while sends
#               that much at veth speed.  Smaller buckets lose rate here (1gbit, 2 hosts,
#               16 MiB ring all-reduce: 16kb 262 ms, 64kb 160 ms, 256kb 141 ms = the rate)
#   -m MTU      link MTU (default 1500)
#   -t SECONDS  kill every rank after SECONDS (default 300)
#   -p PORT     rendezvous port on host 0 (default 29500)
#   -q          no banner
# Exit status: the first failing rank's, 124/137 on timeout, 77 when not root or the
# kernel refuses network namespaces (tests read that as "skip").
set -uo pipefail

hosts=2 rate="" burst=256kb mtu=1500 limit=300 port=29500 quiet=0
while getopts "k:r:b:m:t:p:qh" o; do
  case $o in
    k) hosts=$OPTARG ;;
    r) rate=$OPTARG ;;
    b) burst=$OPTARG ;;
    m) mtu=$OPTARG ;;
    t) limit=$OPTARG ;;
    p) port=$OPTARG ;;
    q) quiet=1 ;;
    *) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ "${1:-}" = "--" ] && shift
if [ $# -lt 1 ]; then echo "netns.sh: no PROGRAM given (see -h)" >&2; exit 2; fi
if ! [[ $hosts =~ ^[0-9]+$ ]] || [ "$hosts" -lt 1 ] || [ "$hosts" -gt 200 ]; then
  echo "netns.sh: -k $hosts: need 1..200 hosts" >&2; exit 2
fi
if [ "$(id -u)" != 0 ]; then
  echo "netns.sh: needs root (ip netns, tc): run as root or skip the multi-host tests" >&2
  exit 77
fi

tag="cl$$r$RANDOM"
sw="$tag-sw"
made=()
pids=()

teardown() {
  local p ns
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for ns in "${made[@]}"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  for ns in "${made[@]}"; do ip netns del "$ns" 2>/dev/null; done
}
trap teardown EXIT
trap 'exit 130' INT TERM

mkns() {
  ip netns add "$1" || { echo "netns.sh: cannot create network namespace $1" >&2; exit 77; }
  made+=("$1")
  ip -n "$1" link set lo up
}

cap() { # namespace, device
  [ -n "$rate" ] || return 0
  # burst (-b): the default 256kb is the smallest that keeps the rate (see -b above).
  ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$rate" burst "$burst" latency 20ms ||
    { echo "netns.sh: tc tbf rate $rate failed on $2" >&2; exit 1; }
}

mkns "$sw"
ip -n "$sw" link add br0 type bridge
ip -n "$sw" link set br0 mtu "$mtu" up
for ((i = 0; i < hosts; i++)); do
  h="$tag-h$i"
  mkns "$h"
  ip link add eth0 netns "$h" type veth peer name "p$i" netns "$sw" ||
    { echo "netns.sh: cannot create a veth pair" >&2; exit 77; }
  ip -n "$sw" link set "p$i" mtu "$mtu" master br0 up
  ip -n "$h" link set eth0 mtu "$mtu" up
  ip -n "$h" addr add "10.77.0.$((i + 1))/24" dev eth0
  cap "$h" eth0     # what host i sends
  cap "$sw" "p$i"   # what host i receives
done
[ $quiet = 1 ] || echo "netns.sh: $hosts hosts 10.77.0.1..$hosts on bridge $sw, mtu $mtu${rate:+, each link capped at $rate both ways}: $*" >&2

for ((i = 0; i < hosts; i++)); do
  h="$tag-h$i"
  # unshare --uts: a hostname of its own (libcoll tells hosts apart by it); ip netns exec
  # already gave a private mount namespace, so the tmpfs on /dev/shm is this host's only.
  ip netns exec "$h" unshare --uts -- timeout -s KILL "$limit" sh -c '
      hostname "$1" && mount -t tmpfs -o mode=1777 tmpfs /dev/shm || exit 70
      shift; exec "$@"' sh "host$i" \
    env RANK="$i" WORLD_SIZE="$hosts" COLL_ADDR="10.77.0.1:$port" "$@" \
    > >(sed -u "s/^/[h$i] /") 2>&1 &
  pids+=($!)
done

status=0
for ((i = 0; i < hosts; i++)); do
  wait "${pids[$i]}"
  st=$?
  if [ $st != 0 ]; then
    echo "netns.sh: host $i exited with status $st" >&2
    [ $status = 0 ] && status=$st
  fi
done
exit $status
