#!/usr/bin/env bash
# build_ab.sh — all-reduce with two builds of libcoll in turn, the order alternating from
# round to round, so that a drift of the machine falls on both.  One line per shape:
#   round ranks size old OUT/IN new OUT/IN   (µs, out of place / in place)
# Usage: lab/scripts/build_ab.sh OLD_BUILD [ROUNDS (default 4)] [NEW_BUILD (default build)]
# OLD_BUILD needs only bench/coll-bench and libcoll.so.0 (coll-bench's RUNPATH is
# $ORIGIN/..), e.g. from the commit before a change:
#   git stash && ninja -C build && mkdir -p /tmp/old/bench && cp build/bench/coll-bench \
#     /tmp/old/bench/ && cp -L build/libcoll.so.0 /tmp/old/ && git stash pop && ninja -C build
# SHAPES="ranks:size:calls ..." replaces the default shapes.
set -eu
cd "$(dirname "$0")/../.."
old=$1
rounds=${2:-4}
new=${3:-build}
t() {
  "$1"/bench/coll-bench all_reduce --ranks "$2" -b "$3" -e "$3" -d float -c 0 -z 1 -n "$4" -w 5 2>&1 |
    awk '/^ +[0-9]/ {print $6 "/" $10}'
}
for i in $(seq "$rounds"); do
  for shape in ${SHAPES:-4:64K:2000 4:1M:200 4:64M:4 2:64K:4000 2:1M:800}; do
    IFS=: read -r r s n <<<"$shape"
    if [ $((i % 2)) = 1 ]; then
      o=$(t "$old" "$r" "$s" "$n") w=$(t "$new" "$r" "$s" "$n")
    else
      w=$(t "$new" "$r" "$s" "$n") o=$(t "$old" "$r" "$s" "$n")
    fi
    echo "$i $r $s old $o new $w"
  done
done
