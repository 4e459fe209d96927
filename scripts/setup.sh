#!/usr/bin/env bash
# setup.sh — installs (from Debian) whatever the build and tests need and is missing.
# Idempotent: does nothing but check when everything is there.  Needs root for apt.
set -euo pipefail
PKGS=(
  build-essential meson ninja-build pkg-config   # build
  libcriterion-dev                                # tests
  libopenblas-dev                                 # libtrain matmuls
  libibverbs-dev                                  # the ib transport (built, needs no device)
  openmpi-bin libopenmpi-dev                      # mpirun launch test, MPI backend, MPI peer
  mpich libmpich-dev                              # the MPICH peer (bench/peers)
  python3 python3-torch python3-numpy             # PyTorch reference for libtrain
  libtorch-dev pybind11-dev                       # the PyTorch binding (torch/)
  python3-setuptools python3-pip                  # torch.utils.cpp_extension; pip for expecttest
  gnuplot-nox                                     # coll-bench --plot
  clang libclang-rt-14-dev                        # sanitizers' runtime, fuzzing
  clang-format                                    # scripts/format.sh (Debian 12: version 14)
  iproute2 procps                                 # ip netns test bed, process tools
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# PyTorch's own distributed test suite (scripts/torch_dist_suite.py) needs expecttest.
if ! /usr/bin/python3 -c 'import expecttest' 2>/dev/null; then
  echo "setup: installing expecttest (pip)"
  /usr/bin/python3 -m pip install -q --break-system-packages expecttest
fi
