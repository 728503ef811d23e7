"""cairn.train.tensorflow: TensorflowTrainer with MultiWorkerMirroredStrategy.

Real TensorFlow (CPU) in the workers, real processes, real SIGKILL. The
runs that train go in child processes (tf_train_*.py): this process never
imports TensorFlow, since other tests fork it and the workers are forks of
the process that calls fit().
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest
from cairn import train
from cairn.errors import InvalidArgumentError
from cairn.train import FailureConfig, RunConfig, ScalingConfig, TrainingFailedError
from cairn.train.tensorflow import TensorflowConfig, TensorflowTrainer

HERE = pathlib.Path(__file__).resolve().parent


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env.pop("TF_CONFIG", None)
    return env


def _start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *args],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, out[-3000:] + err[-6000:]
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise AssertionError(out[-3000:] + err[-3000:])


def _manifest(checkpoint: pathlib.Path) -> dict[str, Any]:
    return json.loads((checkpoint / ".cairn" / "manifest.json").read_text())


def test_a_sigkilled_worker_restarts_the_group_and_the_run_ends_as_an_unbroken_one(
    tmp_path: pathlib.Path,
) -> None:
    script = str(HERE / "tf_train_mwms.py")
    for run in ("killed", "unbroken"):
        (tmp_path / run / "scratch").mkdir(parents=True)
    # Both runs at once: each has its own rendezvous and gRPC ports.
    killed = _start(
        script,
        str(tmp_path / "killed"),
        str(tmp_path / "killed" / "scratch"),
        str(tmp_path / "killed.npz"),
        "kill",
    )
    unbroken = _start(
        script,
        str(tmp_path / "unbroken"),
        str(tmp_path / "unbroken" / "scratch"),
        str(tmp_path / "unbroken.npz"),
    )
    k, u = _result(killed), _result(unbroken)
    # The killed run restarted once, from epoch 1's checkpoint; the other never.
    assert k["metrics"]["attempt"] == 1 and k["metrics"]["start"] == 2
    assert u["metrics"]["attempt"] == 0 and u["metrics"]["start"] == 0
    assert k["metrics"]["epoch"] == u["metrics"]["epoch"] == 3
    import numpy as np

    a, b = np.load(tmp_path / "killed.npz"), np.load(tmp_path / "unbroken.npz")
    assert sorted(a.files) == sorted(b.files) and len(a.files) >= 6
    for key in a.files:  # weights and Adam's state, bit for bit
        assert np.array_equal(a[key], b[key]), key
    for run in ("killed", "unbroken"):
        # Every worker saved, no temporary folder is left ...
        assert list((tmp_path / run / "scratch").iterdir()) == []
        # ... and only the chief's files were committed.
        checkpoints = sorted((tmp_path / run / "exp").glob("checkpoint_0*"))
        assert len(checkpoints) == 4
        for checkpoint in checkpoints:
            ranks = _manifest(checkpoint)["ranks"]
            assert ranks["world_size"] == 2 and ranks["contributed"] == [0], checkpoint
            assert sorted(ranks["files"]["0"]) == [
                "epoch.json",
                "state.data-00000-of-00001",
                "state.index",
            ]


def test_report_checkpoint_callback_reports_logs_and_the_chiefs_model(
    tmp_path: pathlib.Path,
) -> None:
    result = _result(
        _start(str(HERE / "tf_train_keras.py"), str(tmp_path), str(tmp_path / "w.npz"))
    )
    assert result["same"] is True  # get_model() loads what the chief trained
    assert result["metrics"]["training_iteration"] == 2
    assert result["metrics"]["train_loss"] > 0
    checkpoint = pathlib.Path(result["checkpoint"])
    manifest = _manifest(checkpoint)
    assert manifest["ranks"]["contributed"] == [0]
    assert [f["path"] for f in manifest["files"]] == ["model.keras"]


def _never_called(config: dict[str, Any]) -> None:
    raise AssertionError("not reached")


def test_tf_config_already_set_is_refused(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {}}')
    with pytest.raises(InvalidArgumentError, match="TF_CONFIG is already set"):
        TensorflowTrainer(_never_called, run_config=RunConfig(storage_path=tmp_path))


def test_gpus_on_a_machine_where_tensorflow_has_none_are_refused(tmp_path: pathlib.Path) -> None:
    from cairn.train.tensorflow import _tensorflow_has_gpu

    if _tensorflow_has_gpu():
        pytest.skip("TensorFlow can use a GPU here")
    for scaling in (
        ScalingConfig(num_workers=2, use_gpu=True),
        ScalingConfig(num_workers=2, resources_per_worker={"GPU": 1}),
    ):
        with pytest.raises(InvalidArgumentError, match="GPU"):
            TensorflowTrainer(
                _never_called, scaling_config=scaling, run_config=RunConfig(storage_path=tmp_path)
            )


def test_what_cairn_does_not_provide_raises_not_implemented(tmp_path: pathlib.Path) -> None:
    with pytest.raises(NotImplementedError, match="datasets"):
        TensorflowTrainer(_never_called, datasets={"train": object()})
    with pytest.raises(NotImplementedError, match="dataset_config"):
        TensorflowTrainer(_never_called, dataset_config=object())
    with pytest.raises(NotImplementedError, match="TensorflowCheckpoint"):
        from cairn.train.tensorflow import TensorflowCheckpoint  # noqa: F401
    with pytest.raises(TypeError, match="tensorflow_config"):
        TensorflowTrainer(_never_called, tensorflow_config={})  # type: ignore[arg-type]
    TensorflowTrainer(
        _never_called,
        tensorflow_config=TensorflowConfig(),
        run_config=RunConfig(storage_path=tmp_path),
    )


def test_a_worker_failing_at_start_names_its_rank(tmp_path: pathlib.Path) -> None:
    def loop() -> None:
        context = train.get_context()
        config = json.loads(os.environ["TF_CONFIG"])
        assert config["task"]["index"] == context.get_world_rank()
        if context.get_world_rank() == 1:
            raise RuntimeError("rank one cannot start")
        train.report({"x": 1})  # rank 0 waits for rank 1, which never comes

    with pytest.raises(TrainingFailedError, match="rank one cannot start") as info:
        TensorflowTrainer(
            loop,
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(
                name="exp", storage_path=tmp_path, failure_config=FailureConfig(max_failures=0)
            ),
        ).fit()
    assert "rank 1" in str(info.value)
    assert "TF_CONFIG" not in os.environ  # the driver's environment is untouched


def test_restore_goes_on_from_the_latest_checkpoint_with_a_new_cluster(
    tmp_path: pathlib.Path,
) -> None:
    broken = tmp_path / "broken"
    broken.write_text("rank 1 fails at step 2 while this file exists")

    def loop(config: dict[str, Any]) -> None:
        from cairn.train import Checkpoint

        context = train.get_context()
        cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"]
        assert len(set(cluster)) == 2  # a port of its own for each rank
        ckpt = train.get_checkpoint()
        start = 0 if ckpt is None else ckpt.to_dict()["step"] + 1
        for step in range(start, 4):
            if step == 2 and context.get_world_rank() == 1 and os.path.exists(config["broken"]):
                raise RuntimeError("broken at step 2")
            train.report(
                {"step": step, "start": start, "cluster": cluster},
                checkpoint=Checkpoint.from_dict({"step": step, "rank": context.get_world_rank()}),
            )

    config = {"broken": str(broken)}
    with pytest.raises(TrainingFailedError, match="broken at step 2"):
        TensorflowTrainer(
            loop,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="exp", storage_path=tmp_path),
        ).fit()
    assert TensorflowTrainer.can_restore(tmp_path / "exp")
    broken.unlink()
    first = json.loads((tmp_path / "exp" / "result.json").read_text().splitlines()[0])
    result = TensorflowTrainer.restore(tmp_path / "exp", loop, train_loop_config=config).fit()
    assert result.metrics["step"] == 3 and result.metrics["start"] == 2
    assert result.metrics["cluster"] != first["cluster"]  # new ports for the new group
    # Only the chief's dict was committed (the other rank's differs by "rank").
    assert result.checkpoint is not None and result.checkpoint.to_dict() == {"step": 3, "rank": 0}
