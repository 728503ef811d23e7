"""Ray scripts with only their imports changed: the API details they rely on.

The reference guides' examples run whole in test_examples.py; this file
covers what else Ray's documented API promises and scripts use: the legacy
dict checkpoints of the PyTorch guide, ``Checkpoint(path, filesystem)``,
``fit()`` raising on failure, the context's trial methods, Ray's keyword
arguments, ``with_parameters``, a Trainable driven by hand, callbacks'
arguments, and the result rows' keys.
"""

from __future__ import annotations

import os
import pathlib
import pickle
from typing import Any

import cairn
import pytest
from cairn import train, tune
from cairn.train import Checkpoint, CheckpointConfig, RunConfig, ScalingConfig

torch = pytest.importorskip("torch")
import numpy  # noqa: E402
from cairn.train.torch import TorchConfig, TorchTrainer  # noqa: E402


def _legacy_train_func(config: dict[str, Any]) -> None:
    # The PyTorch guide's "restore" example (Checkpoint.from_dict with a
    # state_dict), as published but for its imports.
    import cairn.train.torch

    torch.manual_seed(0)
    X = torch.randn(16, 4)
    Y = torch.rand(16, 1)
    model = torch.nn.Linear(4, 1)
    criterion = torch.nn.MSELoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
    start_epoch = 0
    checkpoint = train.get_checkpoint()
    if checkpoint:
        checkpoint_dict = checkpoint.to_dict()
        model.load_state_dict(checkpoint_dict.get("model_weights"))
        start_epoch = checkpoint_dict.get("epoch", -1) + 1
    model = cairn.train.torch.prepare_model(model)
    for epoch in range(start_epoch, config["num_epochs"]):
        loss = criterion(model(X), Y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        state_dict = model.state_dict()
        checkpoint = Checkpoint.from_dict(dict(epoch=epoch, model_weights=state_dict))
        train.report({}, checkpoint=checkpoint)


def test_the_guides_legacy_dict_checkpoint_holds_tensors_and_resumes(
    tmp_path: pathlib.Path,
) -> None:
    run = RunConfig(storage_path=tmp_path)
    result = TorchTrainer(
        _legacy_train_func,
        train_loop_config={"num_epochs": 2},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=run,
    ).fit()
    first = result.checkpoint.to_dict()
    # As Ray's TorchTrainer: the DDP model's state dict without "module.".
    assert first["epoch"] == 1 and sorted(first["model_weights"]) == ["bias", "weight"]
    assert isinstance(first["model_weights"]["weight"], torch.Tensor)
    result = TorchTrainer(
        _legacy_train_func,
        train_loop_config={"num_epochs": 4},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=run,
        resume_from_checkpoint=result.checkpoint,
    ).fit()
    last = result.checkpoint.to_dict()
    assert last["epoch"] == 3
    # Resumed, not started over: two more epochs, from epoch 1's weights.
    assert [row["training_iteration"] for row in result.metrics_history] == [1, 2]


def test_from_dict_keeps_json_readable_and_pickles_the_rest(tmp_path: pathlib.Path) -> None:
    plain = Checkpoint.from_dict({"epoch": 3, "name": "x"})
    assert plain.to_dict() == {"epoch": 3, "name": "x"}
    assert [name for name, _ in plain.files()] == ["dict.json"]
    arrays = Checkpoint.from_dict({"w": numpy.arange(4), 1: "int key"})
    got = arrays.to_dict()
    assert numpy.array_equal(got["w"], numpy.arange(4)) and got[1] == "int key"
    assert [name for name, _ in arrays.files()] == ["dict.pkl"]
    # Copied to a folder and read back from it, as a stored checkpoint is.
    copied = Checkpoint.from_directory(arrays.to_directory(tmp_path / "copy"))
    assert numpy.array_equal(copied.to_dict()["w"], numpy.arange(4))
    with pytest.raises(TypeError):
        Checkpoint.from_dict([1, 2])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="neither JSON nor picklable"):
        Checkpoint.from_dict({"f": lambda: None})
    (tmp_path / "empty").mkdir()
    with pytest.raises(cairn.NotFoundError, match="holds no dict"):
        Checkpoint.from_directory(tmp_path / "empty").to_dict()


class LocalFileSystem:  # named as pyarrow.fs's: only the kind is used
    pass


class S3FileSystem:
    pass


def test_checkpoint_takes_a_path_and_a_filesystem_and_pickles(tmp_path: pathlib.Path) -> None:
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.txt").write_text("a")
    assert Checkpoint(str(tmp_path / "c")).path == str(tmp_path / "c")
    assert Checkpoint(path=tmp_path / "c", filesystem=LocalFileSystem()).path == str(tmp_path / "c")
    assert Checkpoint(filesystem=S3FileSystem(), path="bucket/run/c").uri == "s3://bucket/run/c"
    with pytest.raises(TypeError, match="LocalFileSystem or S3FileSystem"):
        Checkpoint(str(tmp_path), filesystem=object())
    with pytest.raises(TypeError, match="local path or URI"):
        Checkpoint(42)
    local = Checkpoint(tmp_path / "c")
    assert pickle.loads(pickle.dumps(local)) == local
    in_memory = pickle.loads(pickle.dumps(Checkpoint.from_dict({"w": numpy.ones(2)})))
    assert numpy.array_equal(in_memory.to_dict()["w"], numpy.ones(2))


def test_to_directory_copies_into_a_folder_that_already_holds_files(
    tmp_path: pathlib.Path,
) -> None:
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "model.bin").write_text("new")
    (source / "sub" / "opt.bin").write_text("opt")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "model.bin").write_text("old")
    (dest / "notes.txt").write_text("mine")
    assert Checkpoint.from_directory(source).to_directory(dest) == str(dest)
    assert (dest / "model.bin").read_text() == "new"
    assert (dest / "sub" / "opt.bin").read_text() == "opt"
    assert (dest / "notes.txt").read_text() == "mine"
    assert sorted(os.listdir(tmp_path)) == ["dest", "src"]  # no staging folder left


def _context_loop(config: dict[str, Any]) -> None:
    ctx = train.get_context()
    train.report(
        {
            "trial_id": ctx.get_trial_id(),
            "trial_name": ctx.get_trial_name(),
            "experiment": ctx.get_experiment_name(),
            "metadata": ctx.get_metadata(),
            "cpus": ctx.get_trial_resources()["CPU"],
        }
    )


def test_a_failed_run_raises_and_the_context_names_the_run(tmp_path: pathlib.Path) -> None:
    result = TorchTrainer(
        _context_loop,
        metadata={"team": "a"},
        torch_config=TorchConfig(backend="gloo", timeout_s=60),
        scaling_config=ScalingConfig(num_workers=1, accelerator_type="A100"),
        run_config=RunConfig(
            name="ctx", storage_path=tmp_path, log_to_file=True, sync_config=train.SyncConfig()
        ),
    ).fit()
    assert result.metrics["trial_id"] == "ctx" and result.metrics["trial_name"] == "ctx"
    assert result.metrics["experiment"] == "ctx"
    assert result.metrics["metadata"] == {"team": "a"} and result.metrics["cpus"] == 1.0
    # The configuration comes back with the stored results, as Ray's.
    assert train.Result.from_path(tmp_path / "ctx").config == {}  # none was given
    with_config = TorchTrainer(
        _context_loop,
        train_loop_config={"lr": 0.5},
        run_config=RunConfig(name="cfg", storage_path=tmp_path),
    ).fit()
    assert train.Result.from_path(with_config.path).config == {"train_loop_config": {"lr": 0.5}}
    again = TorchTrainer.restore(with_config.path, _context_loop).fit()
    assert again.config == {"train_loop_config": {"lr": 0.5}}
    # In a trial: what with_resources asked for.
    grid = tune.Tuner(
        tune.with_resources(_context_loop, {"cpu": 2}),
        run_config=RunConfig(name="res", storage_path=tmp_path),
    ).fit()
    assert grid[0].metrics["cpus"] == 2.0 and grid[0].metrics["experiment"] == "res"
    assert train.Result.from_path(grid[0].path).config == grid[0].config
    # Ray's row keys.
    assert result.metrics["iterations_since_restore"] == 1
    assert result.metrics["time_this_iter_s"] >= 0

    def failing() -> None:
        raise RuntimeError("disk on fire")

    with pytest.raises(train.TrainingFailedError, match="disk on fire") as failed:
        TorchTrainer(failing, run_config=RunConfig(name="f", storage_path=tmp_path)).fit()
    assert failed.value.result is not None and failed.value.result.path == str(tmp_path / "f")
    with pytest.raises(ValueError, match="backend"):
        TorchTrainer(failing, torch_config=TorchConfig(backend="mpi"))
    with pytest.raises(cairn.InvalidArgumentError, match="storage_filesystem"):
        RunConfig(storage_filesystem=object())


class _Counter(tune.Trainable):
    def setup(self, config: dict[str, Any], offset: int = 0) -> None:
        self.total = offset
        self.weights = numpy.zeros(2)

    def step(self) -> dict[str, Any]:
        self.total += 1
        self.weights += 1
        return {"total": self.total, "trial": self.trial_id}

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        return {"total": self.total, "weights": self.weights}  # not JSON: pickled

    def load_checkpoint(self, state: dict[str, Any]) -> None:
        self.total = state["total"]
        self.weights = state["weights"]


def test_trainables_take_parameters_and_work_by_hand_as_in_ray(tmp_path: pathlib.Path) -> None:
    by_hand = tune.with_parameters(_Counter, offset=10)(config={"x": 1})
    assert by_hand.train()["total"] == 11 and by_hand.training_iteration == 1
    saved = by_hand.save(str(tmp_path / "saved"))
    again = _Counter(config={})
    again.restore(saved)
    assert again.total == 11 and numpy.array_equal(again.weights, numpy.ones(2))
    assert again.iteration == 1  # restored with the checkpoint, as Ray's

    grid = tune.Tuner(
        tune.with_parameters(_Counter, offset=100),
        tune_config=tune.TuneConfig(chdir_to_trial_dir=False),
        run_config=RunConfig(
            name="cls",
            storage_path=tmp_path,
            stop={"training_iteration": 3},
            checkpoint_config=CheckpointConfig(checkpoint_frequency=1),
        ),
    ).fit()
    assert grid[0].metrics["total"] == 103 and grid[0].metrics["trial"] == "trial_00000"

    def fn(config: dict[str, Any], data: list[int]) -> None:
        ctx = tune.get_context()
        tune.report(
            {
                "sum": sum(data) + config["x"],
                "trial": ctx.get_trial_id(),
                "experiment": ctx.get_experiment_name(),
            }
        )

    grid = tune.Tuner(
        tune.with_parameters(fn, data=[1, 2, 3]),
        param_space={"x": 4},
        run_config=RunConfig(name="fn", storage_path=tmp_path),
    ).fit()
    assert grid[0].metrics["sum"] == 10
    assert (grid[0].metrics["trial"], grid[0].metrics["experiment"]) == ("trial_00000", "fn")
    assert train.Result.from_path(grid[0].path).config == {"x": 4}
    assert tune.result.SHOULD_CHECKPOINT == "should_checkpoint"
    assert issubclass(cairn.NotFoundError, tune.TuneError)
    with pytest.raises(cairn.InvalidArgumentError, match="stop_last_trials"):
        tune.schedulers.ASHAScheduler(stop_last_trials=False)


class _Seen(tune.Callback):
    def __init__(self) -> None:
        self.setups = 0
        self.results: list[tuple[str, Any]] = []
        self.checkpoints: list[Checkpoint] = []

    def setup(self, **info: Any) -> None:
        self.setups += 1

    def on_trial_result(
        self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
    ) -> None:
        self.results.append((result["trial_id"], result["config"]))

    def on_checkpoint(
        self, iteration: int, trials: list[Any], trial: Any, checkpoint: Checkpoint, **info: Any
    ) -> None:
        self.checkpoints.append(checkpoint)


def test_callbacks_get_rays_arguments_and_a_tuners_run_config_replaces_the_trainers(
    tmp_path: pathlib.Path,
) -> None:
    def loop(config: dict[str, Any]) -> None:
        for step in range(3):
            train.report({"step": step}, checkpoint=Checkpoint.from_dict({"step": step}))

    seen = _Seen()
    trainer = TorchTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(name="trainer", storage_path=tmp_path),
    )
    grid = tune.Tuner(
        trainer,
        param_space={"train_loop_config": {"lr": 0.1}},
        run_config=RunConfig(
            storage_path=tmp_path / "tuner",
            callbacks=[seen],
            checkpoint_config=CheckpointConfig(num_to_keep=1),
        ),
    ).fit()
    assert grid.num_errors == 0, grid.errors
    # The Tuner's RunConfig, though it names no experiment, replaced the trainer's.
    assert grid.experiment_path.startswith(str(tmp_path / "tuner"))
    assert len(grid[0].best_checkpoints) == 1
    assert seen.setups == 1
    assert seen.results == [("trial_00000", {"train_loop_config": {"lr": 0.1}})] * 3
    assert len(seen.checkpoints) == 3 and all(isinstance(c, Checkpoint) for c in seen.checkpoints)
    assert seen.checkpoints[-1].to_dict() == {"step": 2}


def test_rays_other_search_spaces_draw_within_their_domains() -> None:
    space = {
        "qlog": tune.qloguniform(1e-4, 1e-1, 5e-5),
        "qint": tune.qrandint(-21, 12, 3),
        "logint": tune.lograndint(1, 100),
        "qlogint": tune.qlograndint(1, 100, 10),
        "normal": tune.randn(5, 2),
        "qnormal": tune.qrandn(0, 1, 0.5),
    }
    # PBT's explore resamples every key it is not given: the domains' draws.
    sampler = tune.schedulers.PopulationBasedTraining(
        resample_probability=1.0, seed=3, hyperparam_mutations=space
    )
    for _ in range(200):
        c = sampler.explore({})
        assert 5e-5 <= c["qlog"] <= 1e-1
        assert c["qint"] in range(-21, 13, 3)
        assert 1 <= c["logint"] < 100 and isinstance(c["logint"], int)
        assert c["qlogint"] in range(10, 101, 10)
        assert isinstance(c["normal"], float)
        assert c["qnormal"] / 0.5 == round(c["qnormal"] / 0.5)
    with pytest.raises(cairn.InvalidArgumentError, match="no multiple of 5"):
        tune.Tuner(lambda config: None, param_space={"x": tune.qrandint(1, 2, 5)})


def test_the_results_dataframe_takes_each_trials_last_or_best_row_with_its_config(
    tmp_path: pathlib.Path,
) -> None:
    def trainable(config: dict[str, Any]) -> None:
        for loss in config["losses"]:
            tune.report({"loss": loss})

    grid = tune.Tuner(
        trainable,
        param_space={"losses": tune.grid_search([[3.0, 1.0, 2.0], [5.0, 4.0]])},
        run_config=RunConfig(name="df", storage_path=tmp_path),
    ).fit()
    last = grid._rows(None, None)
    assert [(r["trial_id"], r["loss"]) for r in last] == [
        ("trial_00000", 2.0),
        ("trial_00001", 4.0),
    ]
    assert last[0]["config"] == {"losses": [3.0, 1.0, 2.0]}
    best = grid._rows("loss", "min")
    assert [r["loss"] for r in best] == [1.0, 4.0]
    assert [r["loss"] for r in grid._rows("loss", "max")] == [3.0, 5.0]
    with pytest.raises(ValueError):
        grid._rows("loss", None)


def _steps(config: dict[str, Any]) -> None:
    for step in range(1, 50):
        tune.report({"loss": 1.0 / step if config["x"] else 1.0})


def test_stop_takes_rays_stoppers_and_functions(tmp_path: pathlib.Path) -> None:
    from cairn.tune.stopper import CombinedStopper, MaximumIterationStopper, TrialPlateauStopper

    def at_three(trial_id: str, result: dict[str, Any]) -> bool:
        return result["training_iteration"] >= 3

    grid = tune.Tuner(
        _steps,
        param_space={"x": 1},
        run_config=RunConfig(name="fn", storage_path=tmp_path, stop=at_three),
    ).fit()
    assert grid[0].metrics["training_iteration"] == 3 and grid[0].status == "TERMINATED"

    # A flat loss plateaus after 3 results; a falling one runs to the cap.
    both = CombinedStopper(
        MaximumIterationStopper(6),
        TrialPlateauStopper("loss", std=0.0, num_results=3, grace_period=3),
    )
    grid = tune.Tuner(
        _steps,
        param_space={"x": tune.grid_search([0, 1])},
        run_config=RunConfig(name="both", storage_path=tmp_path, stop=both),
    ).fit()
    assert {r.config["x"]: r.metrics["training_iteration"] for r in grid} == {0: 3, 1: 6}

    class AfterTwoResults(tune.Stopper):
        def __init__(self) -> None:
            self.results = 0

        def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
            self.results += 1
            return False

        def stop_all(self) -> bool:
            return self.results >= 2

    grid = tune.Tuner(
        _steps,
        param_space={"x": tune.grid_search([1, 1, 1])},
        tune_config=tune.TuneConfig(max_concurrent_trials=1),
        run_config=RunConfig(name="all", storage_path=tmp_path, stop=AfterTwoResults()),
    ).fit()
    assert sum(r.metrics.get("training_iteration", 0) for r in grid) == 2

    class Broken(tune.Stopper):
        def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
            raise RuntimeError("stopper bug")

    with pytest.raises(cairn.InvalidArgumentError, match="Broken.*stopper bug"):
        tune.Tuner(
            _steps,
            param_space={"x": 1},
            run_config=RunConfig(name="broken", storage_path=tmp_path, stop=Broken()),
        ).fit()
    with pytest.raises(cairn.InvalidArgumentError, match="RunConfig.stop"):
        tune.Tuner(_steps, run_config=RunConfig(name="bad", storage_path=tmp_path, stop=42))
    with pytest.raises(cairn.InvalidArgumentError, match="saved with it"):
        tune.Tuner.restore(tmp_path / "fn", _steps, stop={"training_iteration": 2})
    assert len(tune.Tuner.restore(tmp_path / "fn", _steps, stop=at_three).fit()) == 1


def test_nested_metrics_are_named_as_ray_flattens_them(tmp_path: pathlib.Path) -> None:
    def trainable(config: dict[str, Any]) -> None:
        for i in range(1, 9):
            tune.report({"eval": {"loss": config["x"] / i, "acc": i}})

    asha = tune.schedulers.ASHAScheduler(max_t=8, grace_period=2, reduction_factor=2)
    grid = tune.Tuner(
        trainable,
        param_space={"x": tune.grid_search([1.0, 2.0, 3.0, 4.0])},
        tune_config=tune.TuneConfig(
            metric="eval/loss", mode="min", max_concurrent_trials=2, scheduler=asha
        ),
        run_config=RunConfig(name="nested", storage_path=tmp_path, stop={"eval/acc": 6}),
    ).fit()
    iterations = {r.config["x"]: r.metrics["training_iteration"] for r in grid}
    assert max(iterations.values()) == 6, iterations  # the nested stop threshold
    assert min(iterations.values()) < 6, iterations  # ASHA stopped the worse early
    assert grid.get_best_result().config["x"] == 1.0
    assert grid.get_best_result("eval/acc", "max", scope="all").metrics["eval"]["acc"] == 6


def test_fail_fast_ends_a_tuner_at_the_first_error(tmp_path: pathlib.Path) -> None:
    def trainable(config: dict[str, Any]) -> None:
        if config["x"] == 0:
            raise ValueError("trial zero fails")
        for i in range(3):
            tune.report({"i": i})

    def run(name: str, fail_fast: Any) -> Any:
        return tune.Tuner(
            trainable,
            param_space={"x": tune.grid_search([0, 1, 2])},
            tune_config=tune.TuneConfig(max_concurrent_trials=1),
            run_config=RunConfig(
                name=name,
                storage_path=tmp_path,
                failure_config=train.FailureConfig(fail_fast=fail_fast),
            ),
        ).fit()

    assert [r.status for r in run("slow", False)] == ["ERROR", "TERMINATED", "TERMINATED"]
    fast = run("fast", True)
    assert fast[0].status == "ERROR"
    assert all(r.status != "TERMINATED" or not r.metrics for r in fast[1:]), [
        (r.status, r.metrics) for r in fast
    ]
    with pytest.raises(train.TrainingFailedError, match="trial zero fails"):
        run("raise", "raise")
    with pytest.raises(cairn.InvalidArgumentError, match="fail_fast"):
        run("bad", "sometimes")
    # The stop thresholds still apply (and are the experiment's, saved).
    kept = tune.Tuner(
        trainable,
        param_space={"x": tune.grid_search([1, 2])},
        run_config=RunConfig(
            name="kept",
            storage_path=tmp_path,
            stop={"training_iteration": 2},
            failure_config=train.FailureConfig(fail_fast=True),
        ),
    ).fit()
    assert [r.metrics["training_iteration"] for r in kept] == [2, 2]
    import json

    state = json.loads((tmp_path / "kept" / "tuner_state.json").read_text())
    assert state["stop"] == {"training_iteration": 2}  # what a restore goes on with


def test_get_results_reads_a_restored_experiment_without_running_it(
    tmp_path: pathlib.Path,
) -> None:
    def trainable(config: dict[str, Any]) -> None:
        for i in range(3):
            tune.report({"loss": config["x"] * (3 - i)}, checkpoint=Checkpoint.from_dict({"i": i}))

    tuner = tune.Tuner(
        trainable,
        param_space={"x": tune.grid_search([1, 2])},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=RunConfig(name="res", storage_path=tmp_path),
    )
    grid = tuner.fit()
    assert tuner.get_results() is grid
    again = tune.Tuner.restore(tmp_path / "res", trainable).get_results()
    assert [(r.trial_id, r.status, r.config) for r in again] == [
        (r.trial_id, r.status, r.config) for r in grid
    ]
    assert again.get_best_result().config == {"x": 1}
    assert again[0].checkpoint is not None and again[0].checkpoint.to_dict() == {"i": 2}
    assert [len(r.metrics_history) for r in again] == [3, 3]  # nothing ran again
    with pytest.raises(cairn.FailedPreconditionError, match="not restored"):
        tune.Tuner(trainable, run_config=RunConfig(name="new", storage_path=tmp_path)).get_results()


# Found by running Ray's own tests against Cairn (docs/ray.md, "Ray's own tests").


def test_result_is_built_from_ray_fields(tmp_path: pathlib.Path) -> None:
    # Ray Train V2's tests build a Result by hand: Result(metrics, checkpoint, error, path, ...).
    kept = [(Checkpoint(str(tmp_path / f"c{i}")), {"iter": i, "m": float(i)}) for i in range(3)]
    result = train.Result(
        metrics={"iter": 2},
        checkpoint=kept[-1][0],
        error=None,
        path=str(tmp_path),
        best_checkpoints=kept,
    )
    assert result.metrics == {"iter": 2} and result.path == str(tmp_path)
    assert result.checkpoint == kept[-1][0] and result.error is None
    assert result.get_best_checkpoint("m", "min") == kept[0][0]
    assert result.get_best_checkpoint("m", "max") == kept[2][0]
    assert "metrics={'iter': 2}" in repr(result)
    assert train.Result({}, None, None, str(tmp_path)).best_checkpoints == []
    with pytest.raises(TypeError, match="metrics"):
        train.Result(metrics=[1], checkpoint=None, error=None, path=str(tmp_path))


def _fails_after_a_checkpoint(config: dict[str, Any]) -> None:
    train.report({"m": 1}, checkpoint=Checkpoint.from_dict({"i": 1}))
    raise RuntimeError("worker fails on purpose")


def test_fit_raises_worker_group_error_and_from_path_takes_a_filesystem(
    tmp_path: pathlib.Path,
) -> None:
    from pyarrow.fs import LocalFileSystem

    trainer = TorchTrainer(
        _fails_after_a_checkpoint,
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(name="wge", storage_path=str(tmp_path)),
    )
    with pytest.raises(train.WorkerGroupError, match="on purpose") as raised:
        trainer.fit()
    assert isinstance(raised.value, train.TrainingFailedError)  # code written for V1 catches it
    assert raised.value.result is not None and raised.value.result.checkpoint is not None
    for filesystem in (None, LocalFileSystem()):
        result = train.Result.from_path(str(tmp_path / "wge"), storage_filesystem=filesystem)
        assert result.checkpoint is not None and result.checkpoint.to_dict() == {"i": 1}
        assert isinstance(result.error, train.TrainingFailedError)
    with pytest.raises(TypeError, match="filesystem"):
        train.Result.from_path(str(tmp_path / "wge"), storage_filesystem=object())


def test_checkpoint_repr_is_rays(tmp_path: pathlib.Path) -> None:
    assert (
        repr(Checkpoint(str(tmp_path / "c"))) == f"Checkpoint(filesystem=local, path={tmp_path}/c)"
    )
    assert (
        repr(Checkpoint("s3://bucket/run/c")) == "Checkpoint(filesystem=s3, path=s3://bucket/run/c)"
    )
    assert repr(Checkpoint.from_dict({"a": 1})).startswith("Checkpoint(filesystem=memory, path=")
