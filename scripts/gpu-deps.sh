#!/usr/bin/env bash
# Fetches, on a Debian 12 machine with network, the Debian packages that
# scripts/gpu-check.sh needs on a GPU machine that has no network and no
# Debian packages: the headers and libraries of Cairn's small dependencies
# (nlohmann-json, fmt, spdlog, xxHash, GoogleTest). They are unpacked there
# into a private prefix (dpkg-deb -x), never installed system-wide.
#
#   bash scripts/gpu-deps.sh [DIR]     (default: .gpu-deps, ignored by git)
#
# Copy DIR next to the sources on the GPU machine (or set CAIRN_GPU_DEPS).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.gpu-deps}
packages=(nlohmann-json3-dev libfmt-dev libfmt9 libspdlog-dev libspdlog1.10 libxxhash-dev
          libxxhash0 libgtest-dev libgmock-dev)
mkdir -p "$dir"
rm -f "$dir"/*.deb
(cd "$dir" && apt-get download "${packages[@]}")
ls -l "$dir"
