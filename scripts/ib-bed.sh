#!/usr/bin/env bash
# ib-bed.sh — the InfiniBand test bed: K QEMU guests (1..4) booting Debian 12's stock
# kernel, each with soft-RoCE (rdma_rxe) on its virtio NIC, the guests joined by one
# QEMU UDP wire, running R ranks of PROGRAM each with libcoll's env-based init (RANK,
# WORLD_SIZE, MASTER_ADDR = guest 0, MASTER_PORT).  Guests see the host's root read-only
# over 9p (so PROGRAM and the libraries it uses are the host's own) and a writable
# results folder; each rank's output comes back from there, prefixed [gG rR].
#
# First run: installs what is missing (qemu-system-x86 busybox-static rdma-core
# ibverbs-utils ibverbs-providers perftest kmod cpio xz-utils, as root), downloads the kernel
# package named by linux-image-amd64 with `apt-get download` into the cache
# (COLL_IB_BED_CACHE, default /var/cache/libcoll/ib-bed, else ~/.cache/libcoll/ib-bed),
# unpacks it, extracts the uncompressed vmlinux (boots faster than the bzImage) and packs
# a busybox initramfs (scripts/ib-bed-init.sh as /init).  Later runs reuse the cache.
# KVM is used only when the CPU advertises vmx/svm and /dev/kvm opens (COLL_IB_BED_ACCEL=
# kvm|tcg overrides); otherwise TCG (-accel tcg -cpu max).
#
# usage: scripts/ib-bed.sh [-k GUESTS] [-n RANKS] [-t SECONDS] [-m MIB] [-o DIR]
#                          [-e VAR=VALUE]... [-p 'guest cmd'] [-d 'guest cmd'] [-q]
#                          -- PROGRAM [ARGS...]
#   -k GUESTS   guests (default 2), 1..4; guest G is 10.78.0.(G+1) on the wire
#   -n RANKS    ranks per guest (default 1), 1..8: rank = G*RANKS + local rank
#   -t SECONDS  the whole run's bound, boots included (default 120): QEMU is killed then
#   -m MIB      memory per guest (default 1024); each guest has 2 vCPUs
#   -o DIR      keep the results here (default: a temporary folder, removed at exit)
#   -e VAR=VAL  set VAR in every rank's environment (repeatable; ASAN_OPTIONS, UBSAN_OPTIONS,
#               LSAN_OPTIONS and TSAN_OPTIONS follow from this environment by themselves)
#   -p CMD      shell command each guest runs before its ranks start (BED_GUEST is its
#               number), e.g. '[ $BED_GUEST = 1 ] && tc qdisc add dev eth0 root netem loss 2%'
#   -d CMD      shell command each guest runs in the background while its ranks run
#   -q          no banner
# Exit status: the first failing rank's status (137: killed by its timeout), 124 when a
# guest did not finish in time, 1 when a guest failed before its ranks ran, 77 when this
# machine cannot run the bed (no root to install, no kernel package, QEMU cannot start) —
# tests read 77 as "skip", with the sentence printed before it.
set -uo pipefail
# The body is one compound command, read whole before it runs: editing this file while a
# bed runs cannot change what the running bed does.
{

guests=2 per=1 limit=120 mem=1024 keep="" quiet=0 pre="" during=""
envs=()
while getopts "k:n:t:m:o:e:p:d:qh" o; do
  case $o in
    k) guests=$OPTARG ;;
    n) per=$OPTARG ;;
    t) limit=$OPTARG ;;
    m) mem=$OPTARG ;;
    o) keep=$OPTARG ;;
    e) envs+=("$OPTARG") ;;
    p) pre=$OPTARG ;;
    d) during=$OPTARG ;;
    q) quiet=1 ;;
    *) sed -n '2,35p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ "${1:-}" = "--" ] && shift
say() { echo "ib-bed: $*" >&2; }
[ $# -ge 1 ] || { say "no PROGRAM given (see -h)"; exit 2; }
[[ $guests =~ ^[1-4]$ ]] || { say "-k $guests: need 1..4 guests"; exit 2; }
[[ $per =~ ^[1-8]$ ]] || { say "-n $per: need 1..8 ranks per guest"; exit 2; }
[[ $limit =~ ^[0-9]+$ ]] && [ "$limit" -ge 20 ] || { say "-t $limit: need at least 20 s"; exit 2; }
for e in "${envs[@]}"; do
  [[ $e =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || { say "-e $e: not VAR=VALUE"; exit 2; }
done
src=$(cd "$(dirname "$0")/.." && pwd)
t0=$(date +%s.%N)

# ---- what the bed needs on the host --------------------------------------------------
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q "install ok installed" ||
  need+=(busybox-static)
command -v rdma >/dev/null || need+=(iproute2)
dpkg-query -W -f='${Status}' rdma-core 2>/dev/null | grep -q "install ok installed" ||
  need+=(rdma-core)
command -v ibv_devinfo >/dev/null || need+=(ibverbs-utils)
[ -e /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so ] || need+=(ibverbs-providers)
command -v ib_write_bw >/dev/null || need+=(perftest)
command -v depmod >/dev/null || need+=(kmod)
command -v cpio >/dev/null || need+=(cpio)
command -v xz >/dev/null || need+=(xz-utils)
if ((${#need[@]})); then
  if [ "$(id -u)" != 0 ]; then
    say "needs ${need[*]} (apt-get install as root) — cannot run the bed here"
    exit 77
  fi
  say "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}"; } \
    >/dev/null 2>&1 || { say "apt-get install ${need[*]} failed — cannot run the bed here"; exit 77; }
fi

# ---- the kernel and the initramfs (cached) ---------------------------------------------
cache=${COLL_IB_BED_CACHE:-}
if [ -z "$cache" ]; then
  cache=/var/cache/libcoll/ib-bed
  mkdir -p "$cache" 2>/dev/null && [ -w "$cache" ] || cache=${XDG_CACHE_HOME:-$HOME/.cache}/libcoll/ib-bed
fi
mkdir -p "$cache" || { say "cannot make the cache folder $cache"; exit 77; }
# One bed at a time prepares the cache (tests may start several beds together).
exec 9>"$cache/.lock"
flock 9
kver=${COLL_IB_BED_KERNEL:-}
if [ -z "$kver" ]; then # the newest kernel already unpacked, else the one Debian names now
  kver=$(ls -1 "$cache/root/lib/modules" 2>/dev/null | sort -V | tail -1)
fi
if [ -z "$kver" ]; then
  kver=$(apt-cache depends linux-image-amd64 2>/dev/null |
    sed -n 's/.*Depends: linux-image-\([0-9][^ ]*-amd64\)$/\1/p' | head -1)
  [ -n "$kver" ] || { say "apt-cache names no linux-image-*-amd64 (apt-get update?)"; exit 77; }
fi
kroot=$cache/root
if [ ! -f "$kroot/lib/modules/$kver/modules.dep" ]; then
  say "fetching linux-image-$kver into $cache"
  (cd "$cache" && rm -f linux-image-"$kver"_*.deb && apt-get download "linux-image-$kver" \
    >/dev/null 2>&1) || { say "apt-get download linux-image-$kver failed"; exit 77; }
  dpkg-deb -x "$cache"/linux-image-"$kver"_*.deb "$kroot" &&
    depmod -b "$kroot" "$kver" || { say "cannot unpack linux-image-$kver"; exit 77; }
  rm -f "$cache"/linux-image-"$kver"_*.deb
fi
vmlinux=$cache/vmlinux-$kver
if [ ! -s "$vmlinux" ]; then # the ELF inside the bzImage: boots faster under TCG (PVH entry)
  bz=$kroot/boot/vmlinuz-$kver
  off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$bz" | head -1 | cut -d: -f1)
  if [ -n "$off" ]; then
    tail -c +$((off + 1)) "$bz" | xz -dcq >"$vmlinux.tmp" 2>/dev/null
    if [ "$(head -c 4 "$vmlinux.tmp" | od -An -c | tr -d ' ')" = '177ELF' ]; then
      mv "$vmlinux.tmp" "$vmlinux"
    else
      rm -f "$vmlinux.tmp"
    fi
  fi
  [ -s "$vmlinux" ] || cp "$bz" "$vmlinux" # not an xz kernel: boot the bzImage itself
fi
# crc32_generic: rxe asks the crypto API for "crc32" (its ICRC), which no dependency loads.
# overlay: a writable /tmp over the host's (the guest script; Criterion's runner needs one).
mods=(virtio_pci virtio_net 9pnet_virtio 9p crc32_generic rdma_rxe ib_uverbs rdma_ucm sch_netem
  overlay)
# Named by what goes in (the init script and the module list): a change makes a new one.
initrd=$cache/initrd-$kver-$({ cat "$src/scripts/ib-bed-init.sh"; echo "${mods[*]}"; } | md5sum | cut -c1-8).cpio
if [ ! -s "$initrd" ]; then
  rm -f "$cache/initrd-$kver-"*.cpio # an older recipe's
  ir=$(mktemp -d)
  mkdir -p "$ir"/{bin,dev,proc,sys,newroot,lib/modules}
  cp /bin/busybox "$ir/bin/busybox"
  cp "$src/scripts/ib-bed-init.sh" "$ir/init"
  chmod 755 "$ir/init"
  for m in "${mods[@]}"; do
    modprobe -d "$kroot" -S "$kver" --show-depends "$m" || { say "no module $m in $kver"; exit 77; }
  done | awk '$1 == "insmod" && !seen[$2]++ {print $2}' | while read -r ko; do
    cp "$ko" "$ir/lib/modules/" && basename "$ko" >>"$ir/modules.order"
  done
  (cd "$ir" && find . | cpio -o -H newc --quiet) >"$initrd.tmp" && mv "$initrd.tmp" "$initrd"
  rm -rf "$ir"
fi
flock -u 9

accel=${COLL_IB_BED_ACCEL:-}
if [ -z "$accel" ]; then
  accel=tcg
  if grep -qwE 'vmx|svm' /proc/cpuinfo && [ -r /dev/kvm ] && [ -w /dev/kvm ]; then accel=kvm; fi
fi
if [ "$accel" = kvm ]; then accelopt=(-accel kvm -cpu host); else accelopt=(-accel tcg,thread=multi -cpu max); fi

# ---- this run ---------------------------------------------------------------------------
if [ -n "$keep" ]; then
  mkdir -p "$keep" && res=$(cd "$keep" && pwd) || { say "cannot make $keep"; exit 2; }
else
  res=$(mktemp -d "${TMPDIR:-/tmp}/ib-bed.XXXXXX")
fi
qpids=()
gone() { # pid: not running (absent, or a zombie nobody has reaped yet)
  [ ! -e "/proc/$1" ] || [ "$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)" = Z ]
}
teardown() {
  local p f i qemus=()
  # qpids are the `timeout` wrappers: TERM reaches QEMU through them (KILL would not),
  # and QEMU's own pid file catches one that did not go.
  for p in "${qpids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for f in "$res"/qemu-g*.pid; do
    [ -s "$f" ] && qemus+=("$(cat "$f")")
  done
  for p in "${qemus[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for p in "${qpids[@]}"; do wait "$p" 2>/dev/null; done
  # Only once no QEMU serves the results share can the folder go for good.
  for p in "${qemus[@]}"; do
    for ((i = 0; i < 100; i++)); do gone "$p" && break; sleep 0.05; done
  done
  [ -n "$keep" ] || rm -rf "$res"
}
trap teardown EXIT
trap 'exit 130' INT TERM

prog=$(command -v "$1") || { say "$1: not found"; exit 2; }
prog=$(readlink -f "$prog")
shift
# The ranks' own bound: what is left of -t once the guests have booted (~5-20 s here).
ranklimit=$((limit > 35 ? limit - 25 : 10))
{
  echo "BED_GUESTS=$guests BED_RANKS_PER_GUEST=$per BED_LIMIT=$ranklimit"
  printf 'BED_PRE=%q\nBED_DURING=%q\n' "$pre" "$during"
  printf 'BED_CMD=(%q' "$prog"
  for a in "$@"; do printf ' %q' "$a"; done
  printf ')\n'
  # The sanitizers' settings follow the ranks into the guests (scripts/test.sh sets them).
  for v in ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS TSAN_OPTIONS; do
    [ -n "${!v:-}" ] && printf 'export %s=%q\n' "$v" "${!v}"
  done
  for e in "${envs[@]}"; do printf 'export %s=%q\n' "${e%%=*}" "${e#*=}"; done
} >"$res/job.sh"

# The wire: every guest's NIC on one UDP multicast group on the host's loopback (a hub),
# its port picked per run so that beds running together do not hear each other.
wire=$((20000 + (RANDOM * 32768 + RANDOM) % 40000))
[ "$quiet" = 1 ] || say "$guests guest(s) x $per rank(s), kernel $kver, $accel, results in $res"
for ((g = 0; g < guests; g++)); do
  mac=$(printf '52:54:00:4c:00:%02x' $((g + 1)))
  timeout -s KILL "$limit" qemu-system-x86_64 "${accelopt[@]}" -smp 2 -m "$mem" \
    -display none -monitor none -serial "file:$res/console-g$g.log" -no-reboot \
    -pidfile "$res/qemu-g$g.pid" \
    -kernel "$vmlinux" -initrd "$initrd" \
    -append "console=ttyS0 quiet panic=-1 BED_GUEST=$g BED_SRC=$src" \
    -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap" \
    -virtfs "local,path=$res,mount_tag=results,security_model=none,multidevs=remap" \
    -netdev "socket,id=n0,mcast=230.78.0.1:$wire,localaddr=127.0.0.1" \
    -device "virtio-net-pci,netdev=n0,mac=$mac" >"$res/qemu-g$g.log" 2>&1 &
  qpids+=($!)
done
status=0
for ((g = 0; g < guests; g++)); do
  wait "${qpids[$g]}"
  rc=$?
  if [ $rc = 137 ] || [ $rc = 124 ]; then
    say "guest $g did not finish within ${limit} s (killed)"
    [ $status != 0 ] || status=124
  elif [ $rc != 0 ] && [ ! -d "$res/g$g" ]; then
    # QEMU itself refused (no TCG, no 9p, a bad accelerator): this machine cannot boot
    # the guests, which is not a failure of what runs in them.
    say "QEMU could not start guest $g (exit $rc): $(tail -n 1 "$res/qemu-g$g.log" 2>/dev/null)"
    cant=1
  fi
done
if [ "${cant:-0}" = 1 ]; then exit 77; fi
qpids=()

# ---- what came back ---------------------------------------------------------------------
for ((g = 0; g < guests; g++)); do
  st=$(cat "$res/g$g/status" 2>/dev/null)
  if [ "$st" != done ]; then
    say "guest $g: ${st:-no report} (console: $res/console-g$g.log)"
    tail -n 5 "$res/console-g$g.log" 2>/dev/null | sed "s/^/[g$g console] /" >&2
    [ $status != 0 ] || status=1
  fi
  for ((l = 0; l < per; l++)); do
    r=$((g * per + l))
    [ -f "$res/g$g/rank$r.out" ] && sed "s/^/[g$g r$r] /" "$res/g$g/rank$r.out"
    rc=$(cat "$res/g$g/rank$r.rc" 2>/dev/null)
    if [ -n "$rc" ] && [ "$rc" != 0 ]; then
      say "rank $r (guest $g) exited with $rc"
      [ $status != 0 ] || status=$rc
    fi
  done
  grep -q . "$res/g$g/rdma-res.txt" 2>/dev/null &&
    sed "s/^/[g$g rdma] /" "$res/g$g/rdma-res.txt"
done
[ "$quiet" = 1 ] || say "finished in $(awk -v a="$t0" -v b="$(date +%s.%N)" "BEGIN{printf \"%.1f\", b - a}") s, status $status"
exit $status
}
