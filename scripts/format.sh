#!/usr/bin/env bash
# format.sh — the tree's one style (.clang-format), applied or checked.
#   scripts/format.sh           format, in place, every tracked C/C++/CUDA file under
#                               libcoll/ libtrain/ test/ bench/ sim/ torch/
#   scripts/format.sh --check   change nothing; list the files that are not formatted
#                               and exit 1 (0 when all are)
# The file set is what git tracks (git ls-files), so it is the same on a clean clone.
# clang-format must be major version 14 (Debian 12's; scripts/setup.sh installs it):
# another version formats differently, and CI and developers must agree.  Any other
# version, or none, is refused with exit status 2.  CLANG_FORMAT=path picks the binary.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: scripts/format.sh [--check]" >&2; exit 2; }
check=0
case $# in
  0) ;;
  1) if [ "$1" = --check ]; then check=1; else usage; fi ;;
  *) usage ;;
esac

want=14
major() { "$1" --version 2>/dev/null | sed -n 's/.*clang-format version \([0-9][0-9]*\)\..*/\1/p' | head -n1; }
if [ -n "${CLANG_FORMAT:-}" ]; then cands=("$CLANG_FORMAT"); else cands=("clang-format-$want" clang-format); fi
cf='' found=()
for c in "${cands[@]}"; do
  command -v "$c" >/dev/null 2>&1 || continue
  v=$(major "$c")
  if [ "$v" = "$want" ]; then cf=$c; break; fi
  found+=("$c is version ${v:-unknown}")
done
if [ -z "$cf" ]; then
  if ((${#found[@]})); then
    echo "format.sh: $(IFS=';'; echo "${found[*]}"), but the tree's style is defined by" \
         "clang-format $want (Debian 12's): install it, or point CLANG_FORMAT at it" >&2
  else
    echo "format.sh: clang-format $want not found (Debian 12: apt-get install clang-format," \
         "or scripts/setup.sh; or point CLANG_FORMAT at it)" >&2
  fi
  exit 2
fi

if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "format.sh: not a git checkout (the file set is git ls-files)" >&2
  exit 2
fi

specs=()
for d in libcoll libtrain test bench sim torch; do
  for e in c h cu cuh cpp hpp; do specs+=(":(glob)$d/**/*.$e"); done
done
files=()
while IFS= read -r -d '' f; do
  [ -f "$f" ] && files+=("$f")  # tracked but deleted in the work tree: nothing to format
done < <(git ls-files -z -- "${specs[@]}")
if ((${#files[@]} == 0)); then
  echo "format.sh: no files to format" >&2
  exit 2
fi

if ((check == 0)); then
  printf '%s\0' "${files[@]}" | xargs -0 -n 32 "$cf" -i --style=file
  exit 0
fi

bad=()
for f in "${files[@]}"; do
  if ! out=$("$cf" --dry-run --Werror --style=file "$f" 2>&1 >/dev/null); then
    if ! grep -q 'code should be clang-formatted' <<<"$out"; then
      echo "format.sh: $cf failed on $f:" >&2
      echo "$out" >&2
      exit 2
    fi
    bad+=("$f")
  fi
done
if ((${#bad[@]})); then
  echo "format.sh: ${#bad[@]} of ${#files[@]} files are not formatted (run scripts/format.sh):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "format.sh: all ${#files[@]} files formatted"
