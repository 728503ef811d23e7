#!/usr/bin/env bash
# Fetches, on a Debian 12 machine with network, the Debian packages that
# scripts/gpu-check.sh needs on a GPU machine that has no network and no
# Debian packages: the headers and libraries of Cairn's small dependencies
# (nlohmann-json, fmt, spdlog, xxHash, CLI11, GoogleTest). They are unpacked there
# into a private prefix (dpkg-deb -x), never installed system-wide.
#
# It also builds, from Debian's own fio source package (from the archives
# this machine's apt configuration names), a statically linked
# fio (libaio and psync engines, nothing else that needs a library) for the
# benchmark's disk reference: Debian's fio binary needs 80 MB of libraries
# (librados, librbd, ...) that the GPU machine lacks. That step needs root
# (it installs the build dependencies with apt-get); CAIRN_GPU_FIO=0 skips it
# and the benchmark then judges the load against its own O_DIRECT reader only.
#
#   bash scripts/gpu-deps.sh [DIR]     (default: .gpu-deps, ignored by git)
#
# It writes DIR/torch-version, the torch that requirements.txt pins (the one
# CI tests): scripts/gpu-check.sh compares it with the GPU machine's torch
# and says so when they differ (a CUDA build of the same version is wanted).
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
  # Source lists of its own, made from this machine's apt configuration (the
  # same archives, as deb-src); the system's configuration is untouched.
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/lists/partial" "$work/sources.list.d"
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && sed -E 's/^Types:.*/Types: deb-src/' "$f" > "$work/sources.list.d/$(basename "$f")"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] && sed -nE 's/^deb (.*)/deb-src \1/p' "$f" >> "$work/sources.list"
  done
  touch "$work/sources.list"
  apt_src=(-o Dir::Etc::SourceList="$work/sources.list" -o Dir::Etc::SourceParts="$work/sources.list.d"
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
sed -nE 's/^torch==([0-9.]+).*/\1/p' requirements.txt > "$dir/torch-version"
ls -l "$dir"
