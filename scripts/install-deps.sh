#!/usr/bin/env bash
# Installs everything Cairn needs to build, test, demo and benchmark on
# Debian 12: Debian's packages with apt-get, and the project's Python packages
# with pip into one virtual environment, .venv, made from the python3 on PATH
# (or $CAIRN_PYTHON), with exactly the versions requirements.txt pins.
#
# Idempotent and quick when done: packages already present are skipped, and
# the venv is left alone while its stamp (.venv/.cairn-installed: the hash of
# requirements.txt and of the interpreter's version) matches. A venv without a
# matching stamp, a half-made one included, is removed and made again; the
# stamp is written only after every package installed, so a failed run never
# leaves a venv that a later run takes for a good one. On failure it says
# which package it could not get and exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  # toolchain
  build-essential g++ cmake ninja-build pkg-config git clang clang-format libclang-rt-14-dev
  # libraries (see README, "Dependencies")
  libgtest-dev libgmock-dev nlohmann-json3-dev libfmt-dev libspdlog-dev libcli11-dev libxxhash-dev
  # S3 backend: HTTP transport, SigV4 hashing, XML responses
  libcurl4-openssl-dev libssl-dev libpugixml-dev
  # S3 benchmarks: aws-cli and rclone to measure against
  awscli rclone
  # S3 tests against a production server: Ceph's S3 gateway, single node on
  # 127.0.0.1 (tests/support/radosgw.sh); moto, the other server, is a
  # Python package (requirements.txt)
  ceph-mon ceph-osd radosgw ceph-common
  # the Python package's binding (python/, docs/python.md); Python's own
  # headers come with the interpreter the venv is made from
  pybind11-dev
  # the Trainer's data-parallel process group: the headers of the Gloo that
  # c10d's ProcessGroupGloo includes (the torch wheel ships its library, not
  # its headers)
  libgloo-dev
  # benchmarks and multi-node runtime
  fio openmpi-bin libopenmpi-dev
  # the Trainer under a real Slurm: a one-node cluster the test starts
  # (tests/train/slurm_cluster.sh) with its own munged, slurmctld and slurmd
  slurmctld slurmd slurm-client munge
  # tests: small tmpfs for disk-full tests, process tools
  util-linux procps
  # package test (tests/package/run.sh): cpack -G DEB's dpkg-shlibdeps and file,
  # nm/readelf, and ccache so its shared build reuses its static build's objects
  dpkg-dev file binutils ccache
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -ne 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  if ! $SUDO apt-get update -qq; then
    echo "install-deps: apt-get update failed: Debian's package lists could not be read" >&2
    exit 1
  fi
  if ! $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
    still=()
    for p in "${missing[@]}"; do
      dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || still+=("$p")
    done
    echo "install-deps: could not install these Debian packages: ${still[*]}" >&2
    exit 1
  fi
fi

# The project venv.
python=${CAIRN_PYTHON:-python3}
if ! command -v "$python" >/dev/null; then
  echo "install-deps: no $python on PATH to make the venv from (set CAIRN_PYTHON)" >&2
  exit 1
fi
venv=.venv
version=$("$python" -c 'import sys; print(sys.version)')
stamp=$( { cat requirements.txt; echo "$version"; } | sha256sum | cut -c1-16)
if [ -f "$venv/.cairn-installed" ] && [ "$(cat "$venv/.cairn-installed")" = "$stamp" ] &&
   [ -x "$venv/bin/python3" ]; then
  exit 0
fi
echo "install-deps: making the project venv ($venv) from $python ($version)"
rm -rf "$venv"
if ! "$python" -m venv "$venv"; then
  echo "install-deps: $python -m venv failed (is Python's venv module installed?)" >&2
  rm -rf "$venv"
  exit 1
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! "$venv/bin/python3" -m pip install --disable-pip-version-check --no-input -q \
     -r requirements.txt >"$log" 2>&1; then
  grep -v 'is ignored: it is neither' "$log" | tail -n 20 >&2
  # pip names what it could not get in these lines.
  what=$(sed -nE 's/.*(No matching distribution found for|Could not find a version that satisfies the requirement) ([^ ]+).*/\2/p' "$log" |
         sort -u | tr '\n' ' ')
  echo "install-deps: pip could not install ${what:-the packages of requirements.txt (see above)}" >&2
  rm -rf "$venv"
  exit 1
fi
if ! "$venv/bin/python3" -m pip check --disable-pip-version-check >"$log" 2>&1; then
  cat "$log" >&2
  echo "install-deps: the venv's packages do not fit together (pip check); fix requirements.txt" >&2
  rm -rf "$venv"
  exit 1
fi
echo "$stamp" > "$venv/.cairn-installed"
echo "install-deps: $venv holds $(grep -c '==' requirements.txt) pinned packages"
