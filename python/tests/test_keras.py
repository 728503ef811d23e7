"""cairn.keras (BackupAndRestore, ModelCheckpoint) and Keras trials under PBT.

Real Keras 3 on TensorFlow in child processes (this process never imports
TensorFlow: other tests fork it), real SIGKILL.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import cairn

HERE = pathlib.Path(__file__).resolve().parent


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def _run(*args: str, timeout: float = 240) -> str:
    done = subprocess.run(
        [sys.executable, *args],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done.stdout


def _line(out: str, tag: str) -> object:
    for line in out.splitlines():
        if line.startswith(tag + " "):
            return json.loads(line[len(tag) + 1 :])
    raise AssertionError(f"no {tag} line in:\n{out[-3000:]}")


def _same_npz(a: pathlib.Path, b: pathlib.Path) -> None:
    import numpy as np

    x, y = np.load(a), np.load(b)
    assert sorted(x.files) == sorted(y.files) and len(x.files) > 4
    for key in x.files:
        assert np.array_equal(x[key], y[key]), key


def test_a_killed_fit_resumes_at_its_last_committed_step_and_ends_as_an_uninterrupted_one(
    tmp_path: pathlib.Path,
) -> None:
    script = str(HERE / "keras_fit.py")
    hold = tmp_path / "hold"
    killed = subprocess.Popen(
        [sys.executable, script, str(tmp_path / "a"), str(tmp_path / "a.npz"), str(hold)],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    # The uninterrupted run goes on meanwhile.
    reference = subprocess.Popen(
        [sys.executable, script, str(tmp_path / "b"), str(tmp_path / "b.npz")],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not hold.exists():
            assert killed.poll() is None, killed.stderr.read()[-3000:]  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the fit never reached epoch 2, batch 6"
            time.sleep(0.05)
        os.kill(killed.pid, signal.SIGKILL)  # mid-epoch: batch 6 of 8 of epoch 2
        assert killed.wait(timeout=60) == -signal.SIGKILL
    finally:
        if killed.poll() is None:
            killed.kill()
            killed.wait()
    # Its latest backup: after batch 5 of epoch 2 (a backup every 3 batches).
    with cairn.CheckpointManager(tmp_path / "a", "backup") as manager:
        latest = manager.latest()
        assert latest is not None
        assert (latest.metrics["epoch"], latest.metrics["step"]) == (2, 5)
    resumed = _line(_run(script, str(tmp_path / "a"), str(tmp_path / "a.npz")), "RESUMED")
    out, err = reference.communicate(timeout=240)
    assert reference.returncode == 0, err[-5000:]
    fresh = _line(out, "RESUMED")
    # The second run started at epoch 2 with 2 * 8 + 5 optimizer steps done.
    assert resumed == {"initial_epoch": 2, "iterations": 21, "best_is_final": True}
    assert fresh == {"initial_epoch": 0, "iterations": 0, "best_is_final": True}
    _same_npz(tmp_path / "a.npz", tmp_path / "b.npz")  # weights and optimizer, bit for bit
    # A completed fit marks its backups done: the next fit starts afresh.
    with cairn.CheckpointManager(tmp_path / "b", "backup") as manager:
        assert manager.latest().metrics["completed"] is True  # type: ignore[union-attr]
    # ModelCheckpoint: best by loss, two kept, the file named by the epoch.
    with cairn.CheckpointManager(tmp_path / "b", "best") as manager:
        kept = manager.history()
        assert [r.metrics["epoch"] for r in kept] == [3, 4]
        assert all(r.checkpoint.verify() == [] for r in kept)
        names = [n for n, _ in kept[-1].checkpoint.files()]
        assert "model-04.keras" in names


def test_model_checkpoint_refuses_a_filepath_with_a_folder(tmp_path: pathlib.Path) -> None:
    out = _run(
        "-c",
        "import sys\n"
        "from cairn.keras import ModelCheckpoint, BackupAndRestore\n"
        "for make in (lambda: ModelCheckpoint(sys.argv[1], 'sub/m.keras'),\n"
        "             lambda: ModelCheckpoint(sys.argv[1], 'm.txt'),\n"
        "             lambda: BackupAndRestore(sys.argv[1], save_freq='sometimes'),\n"
        "             lambda: BackupAndRestore(sys.argv[1], num_to_keep=0)):\n"
        "    try:\n"
        "        make()\n"
        "    except ValueError as e:\n"
        "        print('ERR', e)\n",
        str(tmp_path),
    )
    errors = [line for line in out.splitlines() if line.startswith("ERR")]
    assert len(errors) == 4, out
    assert "sub/m.keras" in errors[0] and ".keras" in errors[1]
    assert "save_freq" in errors[2] and "num_to_keep" in errors[3]


def test_pbt_clones_a_keras_trials_weights_and_optimizer_bit_for_bit(
    tmp_path: pathlib.Path,
) -> None:
    out = _run(str(HERE / "keras_tune_pbt.py"), str(tmp_path), timeout=280)
    assert _line(out, "ERRORS") == []
    rows = _line(out, "ROWS")
    assert isinstance(rows, list)
    clones = [r for r in rows if isinstance(r.get("loaded_digest"), str)]
    assert clones, "PBT never exploited"
    for clone in clones:
        # What the exploiting trial loaded is exactly what was saved ...
        assert clone["loaded_digest"] == clone["checkpoint_digest"]
        # ... and is a state another trial reported (the source of the clone).
        sources = [
            r
            for r in rows
            if r["trial"] != clone["trial"] and r["digest"] == clone["loaded_digest"]
        ]
        assert sources, clone


def test_the_callbacks_commit_to_s3(tmp_path: pathlib.Path, s3_through_python: str) -> None:
    out = _run(str(HERE / "keras_fit.py"), s3_through_python, str(tmp_path / "s3.npz"))
    assert _line(out, "RESUMED") == {"initial_epoch": 0, "iterations": 0, "best_is_final": True}
    with cairn.CheckpointManager(s3_through_python, "backup") as manager:
        history = manager.history()
        assert history[-1].metrics["completed"] is True
        assert (history[-2].metrics["epoch"], history[-2].metrics["step"]) == (
            3,
            6,
        )  # global batch 30
        assert history[-2].checkpoint.verify() == []
    with cairn.CheckpointManager(s3_through_python, "best") as manager:
        assert [r.metrics["epoch"] for r in manager.history()] == [3, 4]
