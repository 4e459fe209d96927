#!/usr/bin/env bash
# test.sh — the README's second command: set up, build three times (plain with -Werror,
# with ASan+UBSan, and the library with TSan), run every test suite (TSan: the executor's
# own test), and end with one line "N passed, N failed, N skipped"
# counting Criterion test cases over all runs (a test program that dies without its
# summary counts as one failure).
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh || exit 1
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1

build() { # dir, extra meson args...
  local dir=$1; shift
  if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" -Dwerror=true "$@" >"$dir.setup.log" 2>&1 || { cat "$dir.setup.log"; return 1; }
  fi
  ninja -C "$dir" ${TARGETS:-} || return 1
}

status=0
build build || status=1
# ASan+UBSan at -O1: a third of -O0's time on the rank tests, the same checks (COLL_CHECK stays
# on by default, meson.build).
build build-asan -Db_sanitize=address,undefined -Db_lundef=false -Ddebug=true -Doptimization=1 ||
  status=1
# ThreadSanitizer for the executor: only the library and its one plain test program.
TARGETS="test/exec/tsan_executor test/exec/exec_threads" build build-tsan -Db_sanitize=thread -Db_lundef=false \
  -Dbuildtype=debug -Dcuda=disabled || status=1

run() { # dir, suites...
  local dir=$1; shift
  local args=()
  for s in "$@"; do args+=(--suite "$s"); done
  meson test -C "$dir" --no-rebuild --print-errorlogs "${args[@]}" || true
}
if [ $status = 0 ]; then
  run build coll train
  run build-asan coll
  run build-tsan tsan
fi
python3 scripts/summary.py build/meson-logs/testlog.json build-asan/meson-logs/testlog.json \
  build-tsan/meson-logs/testlog.json
rc=$?
[ $status = 0 ] || { echo "0 passed, 1 failed, 0 skipped"; exit 1; }
exit $rc
