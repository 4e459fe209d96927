#!/usr/bin/env bash
# gpu_prepare.sh — run HERE (Debian 12, network to the Debian mirror), before a GPU run:
# fetches, as .deb files into .gpu/debs/, what scripts/gpu_check.sh needs on the GPU
# machine and that machine lacks (it has nvcc, python3 with torch, meson and ninja, but
# no package registry and no network): Criterion and its libraries for the tests,
# OpenBLAS for libtrain, pkgconf for meson to find them; and the expecttest wheel.  .gpu/ is ignored by git; the
# device tool carries it (`carry: [".gpu"]`).  Idempotent; never installs anything here.
#
# The second group are ordinary system libraries that libgit2 (Criterion's) needs; the
# GPU machine's image most likely has them, and gpu_check.sh only uses the carried copy
# of one that the machine lacks (a carried libssl must not shadow the machine's own).
set -euo pipefail
cd "$(dirname "$0")/.."
NEEDED=(libcriterion3 libcriterion-dev libboxfort-dev libffi8 libgit2-1.5 libnanomsg5
        libhttp-parser2.9 libmbedtls14 libmbedx509-1 libmbedcrypto7 libssh2-1
        libopenblas0-pthread libopenblas-dev libopenblas-pthread-dev libgfortran5
        pkgconf pkgconf-bin libpkgconf3)
FALLBACK=(libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libcom-err2 libkeyutils1
          libpcre2-8-0 zlib1g libssl3)
mkdir -p .gpu/debs .gpu/fallback
grep -qx '.gpu/' .gitignore 2>/dev/null || echo '.gpu/' >>.gitignore
fetch() { # dir, packages...
  local dir=$1; shift
  local want=()
  for p in "$@"; do ls "$dir/${p}_"*.deb >/dev/null 2>&1 || want+=("$p"); done
  ((${#want[@]})) || return 0
  # apt drops privileges to _apt for downloads: give it a folder it may write.
  local tmp; tmp=$(mktemp -d); chmod 777 "$tmp"
  (cd "$tmp" && apt-get download "${want[@]}" >/dev/null)
  mv "$tmp"/*.deb "$dir"/
  rmdir "$tmp"
}
fetch .gpu/debs "${NEEDED[@]}"
fetch .gpu/fallback "${FALLBACK[@]}"
# expecttest (pure Python, PyPI) for PyTorch's own distributed_test in the torch stage:
# the GPU machine's Python has torch but not it.
mkdir -p .gpu/wheels
ls .gpu/wheels/expecttest-*.whl >/dev/null 2>&1 ||
  python3 -m pip download -q --no-deps --only-binary=:all: -d .gpu/wheels expecttest
du -sh .gpu | sed 's/^/gpu_prepare: /'
