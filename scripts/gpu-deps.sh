#!/usr/bin/env bash
# Fetches, on a Debian 12 machine with network, the Debian packages that
# scripts/gpu-check.sh needs on a GPU machine that has no network and no
# Debian packages: the headers and libraries of Cairn's small dependencies
# (nlohmann-json, fmt, spdlog, xxHash, CLI11, GoogleTest). They are unpacked there
# into a private prefix (dpkg-deb -x), never installed system-wide.
#
# It also builds, from Debian's own fio source package, a statically linked
# fio (libaio and psync engines, nothing else that needs a library) for the
# benchmark's disk reference: Debian's fio binary needs 80 MB of libraries
# (librados, librbd, ...) that the GPU machine lacks. That step needs root
# (it installs the build dependencies with apt-get); CAIRN_GPU_FIO=0 skips it
# and the benchmark then judges the load against its own O_DIRECT reader only.
#
#   bash scripts/gpu-deps.sh [DIR]     (default: .gpu-deps, ignored by git)
#
# Copy DIR next to the sources on the GPU machine (or set CAIRN_GPU_DEPS).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.gpu-deps}
packages=(nlohmann-json3-dev libfmt-dev libfmt9 libspdlog-dev libspdlog1.10 libxxhash-dev libcli11-dev
          libxxhash0 libgtest-dev libgmock-dev)
mkdir -p "$dir"
rm -f "$dir"/*.deb
(cd "$dir" && apt-get download "${packages[@]}")

if [ "${CAIRN_GPU_FIO:-1}" != 0 ]; then
  # A deb-src list of its own (the system's apt configuration is untouched).
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/lists/partial"
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]" \
    "http://deb.debian.org/debian bookworm main" > "$work/sources.list"
  apt_src=(-o Dir::Etc::SourceList="$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
           -o Dir::State::Lists="$work/lists")
  apt-get "${apt_src[@]}" update
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    build-essential dpkg-dev libaio-dev zlib1g-dev
  (cd "$work" && apt-get "${apt_src[@]}" source fio)
  # --disable-native: the binary runs on any x86-64, not only this CPU.
  (cd "$work"/fio-*/ && ./configure --build-static --disable-native --disable-numa \
     --disable-rdma --disable-rados --disable-rbd --disable-http --disable-gfapi \
     --disable-libnfs --disable-pmem --disable-xnvme --disable-libzbc --disable-tcmalloc \
     --disable-dfs --disable-lex && make -j"$(nproc)")
  install -m 0755 "$work"/fio-*/fio "$dir/fio"
  strip "$dir/fio"
  "$dir/fio" --version
fi
ls -l "$dir"
