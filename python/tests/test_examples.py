"""The reference guides' examples (Ray Train, Ray Tune), imports changed, run as programs.

Each file in examples/ is a guide's example as published with ``ray``
replaced by ``cairn`` in its imports and nothing else. The test runs it as
its own process with ``CAIRN_STORAGE_PATH`` pointing at a temporary folder
(the examples name no storage path, so results go where Cairn puts them by
default) and then reads what it left there.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import cairn
import pytest
from cairn import train, tune

pytest.importorskip("torch")
import torch

EXAMPLES = pathlib.Path(__file__).parent / "examples"


def _run(name: str, tmp_path: pathlib.Path) -> list[pathlib.Path]:
    """Runs examples/<name>; returns the experiment folders it made, oldest first."""
    # The cairn this test imports, wherever the example runs from.
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(cairn.__file__)))
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    env = dict(
        os.environ,
        CAIRN_STORAGE_PATH=str(tmp_path / "results"),
        PYTHONPATH=path,
        PYTHONDONTWRITEBYTECODE="1",
    )
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    root = tmp_path / "results"
    return sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)


def test_ray_train_checkpoint_from_rank_0(tmp_path: pathlib.Path) -> None:
    (exp,) = _run("train_rank0_checkpoint.py", tmp_path)
    result = train.Result.from_path(exp)
    assert result.error is None
    assert len(result.metrics_history) == 5 and "loss" in result.metrics
    assert len(result.best_checkpoints) == 5  # the default keeps every checkpoint
    with result.checkpoint.as_directory() as d:
        state = torch.load(os.path.join(d, "model.pt"))
    assert sorted(state) == ["bias", "weight"]  # unwrapped: no "module." prefix
    assert result.checkpoint.verify() == []


def test_ray_train_restore_after_an_intentional_error(tmp_path: pathlib.Path) -> None:
    (exp,) = _run("train_restore.py", tmp_path)
    result = train.Result.from_path(exp)
    assert result.error is None  # max_failures=1 absorbed the error at epoch 1
    # Epochs 0 and 1, the error, then 2..4 resumed from epoch 1's checkpoint.
    assert [row["attempt"] for row in result.metrics_history] == [0, 0, 1, 1, 1]
    with result.checkpoint.as_directory() as d:
        assert torch.load(os.path.join(d, "extra_state.pt")) == {"epoch": 4}
        assert sorted(os.listdir(d)) == [".cairn", "extra_state.pt", "model.pt", "optimizer.pt"]


def _trials(exp: pathlib.Path) -> list[train.Result]:
    return [train.Result.from_path(p) for p in sorted(exp.glob("trial_*"))]


def test_ray_tune_function_api_checkpointing(tmp_path: pathlib.Path) -> None:
    (exp,) = _run("tune_function_checkpoint.py", tmp_path)
    (trial,) = _trials(exp)
    assert trial.error is None
    assert [row["training_iteration"] for row in trial.metrics_history] == [1, 2, 3, 4, 5]
    with trial.checkpoint.as_directory() as d:
        assert torch.load(os.path.join(d, "checkpoint.pt"))["epoch"] == 5


def test_ray_tune_class_api_checkpointing_periodic_and_at_end(tmp_path: pathlib.Path) -> None:
    periodic, at_end = _run("tune_class_checkpoint.py", tmp_path)
    for exp in (periodic, at_end):
        # The experiment as the Tuner sees it: restoring a finished one runs
        # nothing (no trainable code is called) and returns its results.
        grid = tune.Tuner.restore(exp, tune.Trainable).fit()
        (trial,) = list(grid)
        assert trial.status == "TERMINATED" and trial.error is None, trial.error
        assert trial.metrics["training_iteration"] == 2
        assert trial.checkpoint is not None, exp
        with trial.checkpoint.as_directory() as d:
            assert sorted(torch.load(os.path.join(d, "model.pth"))) == [
                "0.bias",
                "0.weight",
                "2.bias",
                "2.weight",
            ]


def test_ray_tune_callback_asks_for_checkpoints_every_three_iterations(
    tmp_path: pathlib.Path,
) -> None:
    (exp,) = _run("tune_callback_checkpoint.py", tmp_path)
    (trial,) = _trials(exp)
    assert trial.error is None
    with trial.checkpoint.as_directory() as d:
        assert "_dict_checkpoint.json" in os.listdir(d)
    manager = cairn.CheckpointManager(exp / "trial_00000")
    try:
        # The callback's rule: 2 - (-1) >= 3, then 5 - 2 >= 3; and, as in Ray,
        # a class trainable checkpoints at its end (checkpoint_at_end unset).
        assert [r.metrics["training_iteration"] for r in manager.history()] == [2, 5, 7]
    finally:
        manager.close()
