#!/bin/busybox sh
# ib-bed-init.sh — /init of the InfiniBand test bed's initramfs (scripts/ib-bed.sh packs it
# with busybox-static and the kernel modules listed in /modules.order).  Runs as PID 1 in
# a QEMU guest: loads the modules (virtio, 9p, soft-RoCE, netem), mounts the host's root
# read-only over 9p, puts tmpfs on the places that must be writable, mounts the writable
# results share at /run/bed, and switch_roots into scripts/ib-bed-guest.sh from the host's
# tree.  The kernel hands the command line's unknown key=value words to us as
# environment variables (BED_SRC: the tree holding the guest script).
#
# Must never: wait for anything without a bound, or leave the guest running when a step
# fails (every failure says why on the console and reboots, which -no-reboot turns into
# QEMU's exit).
export PATH=/bin
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev

die() {
  echo "ib-bed-init: $*" >/dev/console
  echo b >/proc/sysrq-trigger
  exit 1
}

while read -r m; do
  insmod "/lib/modules/$m" 2>/dev/null || echo "ib-bed-init: insmod $m failed" >/dev/console
done </modules.order

opts=trans=virtio,version=9p2000.L,msize=262144
mkdir -p /newroot
mount -t 9p -o "$opts,cache=loose,ro" hostroot /newroot || die "cannot mount the host's root over 9p"
mount -t tmpfs -o mode=0755 run /newroot/run || die "cannot put tmpfs on /run"
mkdir -p /newroot/run/bed /newroot/run/tmp /newroot/run/home
chmod 1777 /newroot/run/tmp
mount -t 9p -o "$opts,cache=none" results /newroot/run/bed || die "cannot mount the results share"
mount --move /dev /newroot/dev
mkdir -p /newroot/dev/shm /newroot/dev/pts
mount -t tmpfs -o mode=1777 shm /newroot/dev/shm
mount -t devpts devpts /newroot/dev/pts 2>/dev/null
umount /proc /sys
[ -x "/newroot$BED_SRC/scripts/ib-bed-guest.sh" ] ||
  die "no $BED_SRC/scripts/ib-bed-guest.sh in the host's tree"
exec switch_root /newroot /bin/bash "$BED_SRC/scripts/ib-bed-guest.sh"
