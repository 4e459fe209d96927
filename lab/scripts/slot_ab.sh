#!/usr/bin/env bash
# slot_ab.sh — the tree's libcoll against a variant build of it, 2-rank all-reduce,
# interleaved round by round, each with a fresh tuner cache of its own.  One line per
# run: round  round_trip_us  base|variant  all_reduce  size  out_us  in_us  algorithm
# Usage: lab/scripts/slot_ab.sh VARIANT_LIB_DIR [ROUNDS (default 8)] [BUILD_DIR (default build)]
# A variant is a libcoll.so.0 built from an edited tree, e.g. 256 KiB shm slots
# (2026-11-30, lab/perf-log.md):
#   sed -i 's/^#define SHM_SLOT_SMALL (64 \* 1024)$/#define SHM_SLOT_SMALL (256 * 1024)/' \
#     libcoll/transport/shm.c && ninja -C build && mkdir -p /tmp/slot256 &&
#   cp -L build/libcoll.so.0 /tmp/slot256/ && git checkout libcoll/transport/shm.c && ninja -C build
# coll-bench then loads the variant through LD_LIBRARY_PATH (it comes before the RUNPATH).
set -eu
cd "$(dirname "$0")/../.."
variant=$1
rounds=${2:-8}
build=${3:-build}
caches=$(mktemp -d)
trap 'rm -rf "$caches"' EXIT
for i in $(seq "$rounds"); do
  for s in 256K 512K 1M 4M 16M; do
    case $s in 256K) n=3000 ;; 512K) n=1500 ;; 1M) n=800 ;; 4M) n=200 ;; 16M) n=40 ;; esac
    rt=$("$build"/bench/peers/pingpong_bench -m spin -n 20000 | awk '$1 == "spin" {print $8}')
    for v in base variant; do
      lib=""
      [ "$v" = variant ] && lib=$variant
      r=$(LD_LIBRARY_PATH=$lib COLL_TUNE_FILE="$caches/$v" "$build"/bench/coll-bench all_reduce \
        --ranks 2 -b "$s" -e "$s" -d float -c 0 -z 1 -n "$n" -w 5 2>&1 |
        awk '/^ +[0-9]/ {print $6, $10, $NF}')
      echo "$i $rt $v all_reduce $s $r"
    done
  done
done
