"""Cairn inside Ray: the real Ray Train runs the workers and restarts them,
Cairn commits the checkpoints (cairn.ray.checkpoint_upload_fn, docs/ray.md)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import cairn
import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

HERE = pathlib.Path(__file__).resolve().parent
CLI = pathlib.Path(os.environ.get("CAIRN_CLI", ""))


def _cli() -> pathlib.Path:
    """The cairn command of the build this test imports."""
    build = pathlib.Path(cairn.__file__).resolve().parents[2]
    for candidate in (CLI, build / "cli" / "cairn", build / "src" / "cli" / "cairn"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    pytest.skip("the cairn command is not built beside this package")


def test_a_worker_killed_mid_upload_resumes_from_the_newest_whole_checkpoint() -> None:
    work = pathlib.Path(tempfile.mkdtemp(prefix="rc"))  # short: Ray's socket paths
    try:
        storage, markers = work / "results", work / "markers"
        storage.mkdir()
        markers.mkdir()
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(cairn.__file__)))
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(
                p for p in (package_root, os.environ.get("PYTHONPATH")) if p
            ),
            PYTHONDONTWRITEBYTECODE="1",
            HOME=str(work),
            TMPDIR=str(work),
            RAY_USAGE_STATS_ENABLED="0",
        )
        out = work / "result.json"
        done = subprocess.run(
            [
                sys.executable,
                str(HERE / "ray_train_with_cairn.py"),
                str(storage),
                str(markers),
                str(out),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        assert (markers / "killed").exists()  # the first attempt was killed
        result = json.loads(out.read_text())
        assert result["error"] is None
        assert result["metrics"]["epoch"] == 4

        # Every folder of the run that has Cairn's manifest is whole; one
        # without it (the killed upload, if it was caught before its commit)
        # is no checkpoint Ray kept.
        run = storage / "run"
        folders = sorted(p for p in run.iterdir() if p.name.startswith("checkpoint_"))
        committed = [p for p in folders if (p / ".cairn" / "manifest.json").exists()]
        assert [p.name for p in committed] == [f"checkpoint_epoch_{e}" for e in range(5)]
        for folder in committed:
            assert cairn.Checkpoint.from_directory(folder).verify() == []
        verify = subprocess.run(
            [str(_cli()), "verify", result["checkpoint"]], capture_output=True, text=True
        )
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert [pathlib.Path(p).name for p in result["best_checkpoints"]] == [
            f"checkpoint_epoch_{e}" for e in range(5)
        ]
        # The restart resumed after the newest checkpoint Ray had registered
        # when the worker died (Ray registers a report's checkpoint after its
        # upload returned, so on a loaded machine that may be an older one:
        # its later checkpoints are then uploaded again, replacing the
        # unregistered ones under the same names).
        resumed = result["metrics"]["resumed_from"]
        assert 0 <= resumed <= 3
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_a_rank_uploading_again_replaces_its_checkpoint_and_another_rank_is_refused(
    tmp_path: pathlib.Path,
) -> None:
    import cairn.ray

    source = tmp_path / "local"
    source.mkdir()
    (source / "state.txt").write_text("first")
    dest = str(tmp_path / "run" / "checkpoint_epoch_1")
    cairn.ray._commit(str(source), dest, 0)
    # A restarted group redoes the report: the same rank, the same name.
    (source / "state.txt").write_text("again")
    cairn.ray._commit(str(source), dest, 0)
    checkpoint = cairn.Checkpoint.from_directory(dest)
    assert checkpoint.verify() == []
    assert (pathlib.Path(dest) / "state.txt").read_text() == "again"
    # Two ranks uploading into one checkpoint of a report: the second is refused.
    with pytest.raises(cairn.AlreadyExistsError, match="rank 1: .*another rank"):
        cairn.ray._commit(str(source), dest, 1)
    assert checkpoint.verify() == []
