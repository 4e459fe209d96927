#!/usr/bin/env bash
# demo.sh — the README's first command: set up, build, and run coll-bench over every
# collective (and send/recv) on 4 local ranks, every result checked.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
[ -f build/build.ninja ] || meson setup build --buildtype=release >/dev/null
ninja -C build >/dev/null
exec build/bench/coll-bench all --ranks 4 -b 8 -e 16M -f 8 -c 1 "$@"
