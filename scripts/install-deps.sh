#!/usr/bin/env bash
# Installs everything Cairn needs to build, test, demo and benchmark on Debian 12.
# Idempotent: packages already present are skipped, so build scripts call it every time.
set -euo pipefail

packages=(
  # toolchain
  build-essential g++ cmake ninja-build pkg-config git clang clang-format libclang-rt-14-dev
  # libraries (see README, "Dependencies")
  libgtest-dev libgmock-dev nlohmann-json3-dev libfmt-dev libspdlog-dev libcli11-dev libxxhash-dev
  # S3 backend: HTTP transport, SigV4 hashing, XML responses
  libcurl4-openssl-dev libssl-dev libpugixml-dev
  # S3 tests and benchmarks: the SigV4 oracle, aws-cli and rclone to measure against
  python3-botocore awscli rclone
  # S3 tests against a production server: Ceph's S3 gateway, single node on
  # 127.0.0.1 (tests/support/radosgw.sh)
  ceph-mon ceph-osd radosgw ceph-common
  # S3 benchmark: XXH3-64 for the manifest of the checkpoint it writes
  python3-xxhash
  # LibTorch adapter, torch baselines and interop tests
  libtorch-dev python3 python3-numpy python3-torch
  # the Python package (python/, docs/python.md): the binding and its tests
  pybind11-dev python3-dev python3-pytest
  # `pip install .` into a venv (README, docs/python.md; tests/package/pip.sh):
  # python3 -m venv, whose ensurepip brings pip into the venv (python3-pip is
  # not needed: Debian's pip refuses to install outside a venv anyway)
  python3-venv
  # the Trainer's data-parallel process group: c10d::ProcessGroupGloo's headers
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

# Node.js and npm run the S3 server the tests start (s3rver, installed below
# from npm). A machine that already has a Node.js with its own npm (NodeSource
# packages conflict with Debian's npm) keeps it.
command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -ne 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The pinned S3 server (tests/support/s3rver), into a cache folder.
bash "$(dirname "$0")/install-s3rver.sh" >/dev/null
