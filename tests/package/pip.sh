#!/usr/bin/env bash
# `pip install .` checked from outside the checkout, offline, as README and
# docs/python.md tell a user to run it:
#
#   1. a fresh venv in a temporary folder, made from the interpreter the
#      project venv (.venv) was made from, that sees the project venv's
#      packages (torch, numpy) through a .pth file: a venv holding a supported
#      torch, made offline;
#   2. `pip install --no-index --no-build-isolation <checkout>`: the in-tree
#      backend (python/backend/cairn_backend.py) builds _cairn with CMake and
#      Ninja and writes the wheel; with the network unused (--no-index);
#   3. from a folder outside the checkout, with PYTHONPATH unset: `cairn` is
#      the installed one, its __version__ and the distribution's version are
#      the project's (CMakeLists.txt), every *.py/*.pyi/py.typed under
#      python/cairn is installed and matches RECORD's sha256, a small torch
#      state goes through cairn.save/cairn.load (and its metadata), and a
#      cairn.CheckpointManager registers it as a checkpoint that verifies and
#      reads back.
#
# The build folder sits directly in the checkout (build-package-pip.XXXXXX,
# removed at the exit) and the build passes scripts/build-flags.sh's flags
# (RelWithDebInfo with -g1, -DCAIRN_WERROR=ON), so that its compile lines
# are those of scripts/test.sh's normal build, whose objects ccache then
# serves (tests/package/run.sh says how); the install is checked with
# warnings as errors too.
# Usage: tests/package/pip.sh     Environment: JOBS (default 2); PYTHON
# (default: the project venv's base interpreter). Exits non-zero on the first failure; the
# temporary folder is removed at the exit.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
project_python=$src/.venv/bin/python3
python=${PYTHON:-$("$project_python" -c 'import sys; print(sys._base_executable)')}
work=$(mktemp -d "${TMPDIR:-/tmp}/cairn-pip.XXXXXX")
build=""
trap 'rm -rf "$work" ${build:+"$build"}' EXIT
build=$(mktemp -d "$src/build-package-pip.XXXXXX")
# shellcheck source=scripts/build-flags.sh
source "$src/scripts/build-flags.sh"  # normal_build_flags: scripts/test.sh's build/
version=$(sed -nE 's/^project\(cairn VERSION ([0-9.]+).*/\1/p' "$src/CMakeLists.txt")

echo "pip: venv from $python, with the project venv's packages"
"$python" -m venv "$work/venv"
project_site=$("$project_python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
venv_site=$("$work/venv/bin/python3" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$project_site" > "$venv_site/cairn-test-project-venv.pth"

echo "pip: pip install --no-index --no-build-isolation $src"
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR=$src CCACHE_NOHASHDIR=1  # as run.sh's and test.sh's builds
fi
start=$SECONDS
env -u PYTHONPATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 JOBS="${JOBS:-2}" \
  CAIRN_CMAKE_ARGS="$(printf '%q ' "${normal_build_flags[@]}")" \
  "$work/venv/bin/pip" install --no-index --no-build-isolation \
  --config-settings "build-dir=$build" "$src"
echo "pip: installed in $((SECONDS - start)) s"

mkdir "$work/outside"
cd "$work/outside"
env -u PYTHONPATH PYTHONDONTWRITEBYTECODE=1 "$work/venv/bin/python" - "$version" "$src" <<'PY'
"""The installed package, used as a user would."""
import base64
import hashlib
import importlib.metadata
import os
import pathlib
import sys
import tempfile

import torch

import cairn

version, src = sys.argv[1], pathlib.Path(sys.argv[2])
where = pathlib.Path(cairn.__file__).resolve().parent
assert src not in where.parents, f"cairn imported from the checkout: {where}"
assert where.parent.name == "site-packages", f"cairn imported from {where}"
assert cairn.__version__ == version, f"cairn.__version__ {cairn.__version__}, project {version}"
dist = importlib.metadata.distribution("cairn")
assert dist.version == version, f"installed distribution {dist.version}, project {version}"
print(f"cairn {cairn.__version__} from {where}, torch {torch.__version__}")

# Every pure-Python file of the package is installed, and RECORD's hashes hold.
root = src / "python" / "cairn"
wanted = {p.relative_to(root).as_posix() for pattern in ("*.py", "*.pyi", "py.typed")
          for p in root.rglob(pattern) if "__pycache__" not in p.parts}
recorded = {}
for f in dist.files or []:
    if f.hash is None:
        continue
    digest = base64.urlsafe_b64encode(hashlib.sha256(f.read_binary()).digest()).rstrip(b"=")
    assert f.hash.mode == "sha256" and f.hash.value == digest.decode(), f"RECORD: {f} differs"
    recorded[f.as_posix()] = f
missing = sorted(w for w in wanted if f"cairn/{w}" not in recorded)
assert not missing, f"not in the wheel: {missing}"
assert any(n.startswith("cairn/_cairn.") and n.endswith(".so") for n in recorded), "no extension"
# Built over a torch wheel (its LibTorch), the wheel carries the C++ torch
# helpers too, and cairn uses them under that torch.
import cairn._tensors  # noqa: E402

helpers = cairn._tensors._torch_helpers()
assert helpers is not None and pathlib.Path(helpers.__file__).resolve().parent == where, \
    f"cairn._cairn_torch is not installed for torch {torch.__version__}"
print(f"{len(recorded)} files installed, RECORD's sha256 verified")
import cairn.torch  # noqa: E402  (a subpackage of the package)

assert pathlib.Path(cairn.torch.__file__).resolve().parent.parent == where, cairn.torch.__file__

with tempfile.TemporaryDirectory() as tmp:
    state_dir = os.path.join(tmp, "state")
    os.mkdir(state_dir)
    path = os.path.join(state_dir, "model.safetensors")
    state = {"layer": {"weight": torch.randn(4, 3), "bias": torch.zeros(4)},
             "step": torch.tensor(7), "half": torch.ones(2, 2, dtype=torch.bfloat16)}
    cairn.save(state, path, metadata={"epoch": 3, "lr": 0.01})
    back = cairn.load(path)
    flat = cairn.flatten_state_dict(state)
    assert sorted(back) == sorted(flat), f"names {sorted(back)}, saved {sorted(flat)}"
    for name, tensor in flat.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name
    assert cairn.load_metadata(path) == {"epoch": 3, "lr": 0.01}, cairn.load_metadata(path)
    print(f"cairn.save/cairn.load: {len(back)} tensors round-trip")

    config = cairn.CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="loss",
                                    checkpoint_score_order="min")
    with cairn.CheckpointManager(os.path.join(tmp, "runs"), "exp", config) as manager:
        record = manager.register_checkpoint({"epoch": 3, "loss": 0.5},
                                             cairn.Checkpoint.from_directory(state_dir))
        latest = manager.latest()
        assert latest is not None and latest.name == record.name, latest
        assert latest.checkpoint.verify() == [], latest.checkpoint.verify()
        with latest.checkpoint.as_directory() as d:
            again = cairn.load(os.path.join(d, "model.safetensors"), mmap=False)
        assert torch.equal(again["layer.weight"], flat["layer.weight"])
    print(f"cairn.CheckpointManager: {record.name} registered, verified, read back")
PY
echo "pip: ok"
