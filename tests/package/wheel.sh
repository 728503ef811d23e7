#!/usr/bin/env bash
# The release wheel (scripts/build-wheel.sh) used as on another machine:
#
#   1. built and repaired by scripts/build-wheel.sh; `auditwheel show` accepts
#      it under a manylinux tag, and its name carries that tag;
#   2. installed with `pip install --no-index --no-deps` into a fresh venv
#      made from the project venv's base interpreter, with no site packages
#      of the machine's and nothing of the checkout's;
#   3. every shared library the installed extension loads, apart from the C
#      and C++ runtimes that manylinux promises, comes from the wheel's own
#      cairn.libs folder (ldd), never from this machine's -dev packages;
#   4. the package's smoke test from outside the checkout: import, version,
#      a CheckpointManager registering a checkpoint that verifies and reads
#      back, Checkpoint.from_dict/to_dict, and an error naming the file at
#      fault.
#
# Usage: tests/package/wheel.sh     Environment: JOBS (default 2).
# The temporary folder is removed at the exit.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/cairn-wheel-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
# shellcheck source=scripts/build-flags.sh
source "$src/scripts/build-flags.sh"  # normal_build_flags, so ccache serves the build
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR=$src CCACHE_NOHASHDIR=1
fi
version=$(sed -nE 's/^project\(cairn VERSION ([0-9.]+).*/\1/p' "$src/CMakeLists.txt")

wheel=$(TMPDIR=$work JOBS=${JOBS:-2} CAIRN_CMAKE_ARGS="$(printf '%q ' "${normal_build_flags[@]}")" \
  bash "$src/scripts/build-wheel.sh" "$work/dist" | tail -n 1)
echo "wheel: $(basename "$wheel")"
case "$(basename "$wheel")" in
  cairn-"$version"-*-manylinux_*_x86_64.whl | cairn-"$version"-*-manylinux_*_aarch64.whl) ;;
  *)
    echo "wheel: $(basename "$wheel") is not a manylinux wheel of cairn $version" >&2
    exit 1
    ;;
esac
"$src/.venv/bin/auditwheel" show "$wheel" | tr '\n' ' ' | grep -q 'is consistent with the following platform tag'

base=$("$src/.venv/bin/python3" -c 'import sys; print(sys._base_executable)')
"$base" -m venv "$work/venv"
env -u PYTHONPATH PIP_DISABLE_PIP_VERSION_CHECK=1 "$work/venv/bin/pip" install -q --no-index \
  --no-deps "$wheel"

site=$("$work/venv/bin/python3" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
extension=$(ls "$site"/cairn/_cairn.*.so)
# What manylinux lets a wheel take from the system (auditwheel's policy
# leaves them out of the wheel): glibc's libraries, the C++ runtime, zlib,
# the dynamic loader.
outside=$(ldd "$extension" | awk '/=>/ {print $1 " " $3}' |
  grep -vE "^(libc|libm|libdl|libpthread|librt|libresolv|libnsl|libutil|libz|libstdc\+\+|libgcc_s|ld-linux[^ ]*)\.so" |
  grep -v "/cairn\.libs/" || true)
if [ -n "$outside" ]; then
  echo "wheel: the installed extension loads libraries from outside the wheel:" >&2
  echo "$outside" >&2
  exit 1
fi
echo "wheel: $(ls "$site/cairn.libs" | wc -l) vendored libraries; nothing else beyond glibc, libstdc++ and zlib"

mkdir "$work/outside"
cd "$work/outside"
env -u PYTHONPATH PYTHONDONTWRITEBYTECODE=1 "$work/venv/bin/python3" - "$version" <<'PY'
"""The smoke test of the installed wheel."""
import os
import pathlib
import sys
import tempfile

import cairn

version = sys.argv[1]
where = pathlib.Path(cairn.__file__).resolve().parent
assert where.parent.name == "site-packages", f"cairn imported from {where}"
assert cairn.__version__ == version, f"cairn.__version__ {cairn.__version__}, project {version}"
with tempfile.TemporaryDirectory() as tmp:
    state = os.path.join(tmp, "state")
    os.mkdir(state)
    with open(os.path.join(state, "weights.bin"), "wb") as f:
        f.write(os.urandom(100_000))
    config = cairn.CheckpointConfig(num_to_keep=1)
    with cairn.CheckpointManager(os.path.join(tmp, "runs"), "exp", config) as manager:
        for step in range(3):
            manager.register_checkpoint({"step": step}, cairn.Checkpoint.from_directory(state))
        manager.register_checkpoint({"step": 3}, cairn.Checkpoint.from_dict({"step": 3}))
        latest = manager.latest()
        assert latest is not None and latest.metrics["step"] == 3, latest
        assert latest.checkpoint.verify() == [], latest.checkpoint.verify()
        assert latest.checkpoint.to_dict() == {"step": 3}, latest.checkpoint.to_dict()
        assert len(manager.history()) == 1, manager.history()
    try:
        cairn.Checkpoint.from_directory(os.path.join(tmp, "no-such-folder")).verify()
    except FileNotFoundError as e:
        assert "no-such-folder" in str(e), e
    else:
        raise AssertionError("a missing folder was accepted")
print(f"wheel: cairn {cairn.__version__} from {where}: CheckpointManager, from_dict, errors")
PY
echo "wheel: ok"
