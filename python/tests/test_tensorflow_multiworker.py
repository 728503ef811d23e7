"""TensorFlow's guide, MultiWorkerMirroredStrategy: cairn.tensorflow.CheckpointManager on 2 workers.

The guide's code runs verbatim but for the manager's class name: every
worker constructs the manager on one directory, only the chief saves. Real
TensorFlow (CPU), two real worker processes under TensorflowTrainer
(tf_mwms_guide.py, one run shared by the tests of this file). This process
never imports TensorFlow: other tests fork it.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

HERE = pathlib.Path(__file__).resolve().parent
CLI = HERE.parents[1] / "build" / "src" / "cli" / "cairn"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, dict[str, Any]]:
    """The two-worker run: its folder and its result."""
    work = tmp_path_factory.mktemp("mwms")
    env = dict(os.environ)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env.pop("TF_CONFIG", None)
    proc = subprocess.run(
        [sys.executable, str(HERE / "tf_mwms_guide.py"), str(work)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return work, json.loads(line[len("RESULT ") :])
    raise AssertionError(proc.stdout[-3000:] + proc.stderr[-3000:])


def _same(a: pathlib.Path, b: pathlib.Path) -> None:
    """Every array of two .npz files equal bit for bit (dtype, shape, bytes)."""
    x, y = np.load(a), np.load(b)
    assert sorted(x.files) == sorted(y.files)
    assert len([k for k in x.files if k.startswith("o")]) >= 5  # Adam: iterations, slots
    for key in x.files:
        assert x[key].dtype == y[key].dtype and x[key].shape == y[key].shape, key
        assert x[key].tobytes() == y[key].tobytes(), f"{key} differs ({a.name}, {b.name})"


def test_chief_only_saves_keep_what_tensorflow_keeps(
    run: tuple[pathlib.Path, dict[str, Any]],
) -> None:
    work, result = run
    model = work / "model"
    # tf.train.CheckpointManager keeps ckpt-3..5 after 5 saves; so does Cairn's,
    # one committed checkpoint folder each, and nothing else.
    assert result["reference"] == ["ckpt-3", "ckpt-4", "ckpt-5"]
    folders = sorted(p.name for p in model.glob("checkpoint_0*"))
    assert folders == ["checkpoint_000002", "checkpoint_000003", "checkpoint_000004"]
    for folder, prefix in zip(folders, result["reference"]):
        files = sorted(p.name for p in (model / folder).iterdir())
        assert files == [".cairn", f"{prefix}.data-00000-of-00001", f"{prefix}.index"]
    expected = [str(model / f / p) for f, p in zip(folders, result["reference"])]
    # The chief (the writer) and the other worker (a reader, no lock) agree.
    for rank in ("rank0", "rank1"):
        assert result[rank]["checkpoints"] == expected
        assert result[rank]["latest_checkpoint"] == expected[-1]
    # tf.train.latest_checkpoint names the newest.
    assert result["tf_latest"] == "model/checkpoint_000004/ckpt-5"
    verify = subprocess.run(
        [str(CLI), "verify", str(model)], capture_output=True, text=True, timeout=60, check=False
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert not (model / ".cairn-tf-staging").exists()


def test_every_worker_restores_the_chiefs_variables_bit_for_bit(
    run: tuple[pathlib.Path, dict[str, Any]],
) -> None:
    work, _ = run
    saved = work / "saved.npz"
    assert int(np.load(saved)["save_counter"]) == 5
    for rank in (0, 1):
        _same(saved, work / f"restored{rank}.npz")  # checkpoint.restore(latest_checkpoint)
        _same(saved, work / f"verified{rank}.npz")  # manager.restore(): checksums first


def test_a_second_writer_is_refused_and_changes_nothing(
    run: tuple[pathlib.Path, dict[str, Any]],
) -> None:
    work, result = run
    message = result["rank1"]["second_writer"]
    assert message.startswith("LockedError: ")
    assert str(work / "model") in message and "another CheckpointManager is saving" in message
    assert "only the chief saves" in message
    assert result["rank1"]["latest_after_refusal"] == str(
        work / "model" / "checkpoint_000004" / "ckpt-5"
    )


def test_a_reader_never_names_an_uncommitted_checkpoint(
    run: tuple[pathlib.Path, dict[str, Any]],
) -> None:
    work, result = run
    # checkpoint_000005 holds ckpt-5's files but no manifest: not listed.
    assert (work / "model_copy" / "checkpoint_000005" / "ckpt-5.index").exists()
    assert result["reader_with_leftover"] == [
        "checkpoint_000002/ckpt-3",
        "checkpoint_000003/ckpt-4",
        "checkpoint_000004/ckpt-5",
    ]


def test_tensorflows_pattern_non_chief_saves_to_a_directory_it_deletes(
    run: tuple[pathlib.Path, dict[str, Any]],
) -> None:
    work, result = run
    # The chief's directory: one checkpoint kept (max_to_keep=1), the newest.
    assert result["rank0"]["tf_pattern_saved"] == [
        "tf_pattern/ckpt/checkpoint_000000/ckpt-6",
        "tf_pattern/ckpt/checkpoint_000001/ckpt-7",
    ]
    ckpt_dir = work / "tf_pattern" / "ckpt"
    assert sorted(p.name for p in ckpt_dir.glob("checkpoint_0*")) == ["checkpoint_000001"]
    # The other worker saved twice into a directory it deleted after each
    # save: each save a new experiment there.
    assert result["rank1"]["tf_pattern_saved"] == [
        "tf_pattern/workertemp_1/ckpt/checkpoint_000000/ckpt-6",
        "tf_pattern/workertemp_1/ckpt/checkpoint_000000/ckpt-7",
    ]
    assert not (work / "tf_pattern" / "workertemp_1" / "ckpt").exists()
    for rank in (0, 1):
        latest = result[f"rank{rank}"]["tf_pattern_latest"]
        assert latest == "tf_pattern/ckpt/checkpoint_000001/ckpt-7"
        _same(work / "tf_saved.npz", work / f"tf_restored{rank}.npz")
    verify = subprocess.run(
        [str(CLI), "verify", str(ckpt_dir)], capture_output=True, text=True, timeout=60, check=False
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
