"""cairn.tune: Ray Tune's Tuner over the C++ Tuner, with Python trainables.

Each test runs a real experiment: trials in processes forked by the C++
Tuner, checkpoints committed manifest-last, the experiment's state in
tuner_state.json, in a temporary folder.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Optional, Union

import cairn
import pytest
from cairn import tune
from cairn.tune import Checkpoint, CheckpointConfig, RunConfig, TuneConfig
from cairn.tune.schedulers import ASHAScheduler, PopulationBasedTraining

sys.path.insert(0, os.path.dirname(__file__))
import driver_process


def _run_config(tmp_path: pathlib.Path, **kw: Any) -> RunConfig:
    return RunConfig(name="exp", storage_path=tmp_path, **kw)


def test_a_function_trainable_over_a_grid_with_asha_finds_the_best_config(
    tmp_path: pathlib.Path,
) -> None:
    def trainable(config: dict[str, Any]) -> None:
        for step in range(8):
            tune.report({"loss": (config["lr"] - 0.01) ** 2 + 1.0 / (step + 1)})

    grid = tune.Tuner(
        trainable,
        param_space={"lr": tune.grid_search([0.001, 0.01, 0.1, 1.0]), "fixed": 7},
        tune_config=TuneConfig(
            metric="loss",
            mode="min",
            scheduler=ASHAScheduler(max_t=8, grace_period=1, reduction_factor=2),
        ),
        run_config=_run_config(tmp_path),
    ).fit()
    assert len(grid) == 4 and grid.num_errors == 0
    assert {r.status for r in grid} == {"TERMINATED"}
    assert sorted(r.config["lr"] for r in grid) == [0.001, 0.01, 0.1, 1.0]
    assert all(r.config["fixed"] == 7 for r in grid)
    best = grid.get_best_result()
    assert best.config["lr"] == 0.01
    assert best.metrics["training_iteration"] == 8  # the best is never stopped early
    assert best.path == os.path.join(grid.experiment_path, best.trial_id)
    assert grid.experiment_path == str(tmp_path / "exp")
    with pytest.raises(cairn.NotFoundError, match="accuracy"):
        grid.get_best_result(metric="accuracy", mode="max")


def test_time_budget_s_ends_the_experiment_and_a_restore_counts_the_time_used(
    tmp_path: pathlib.Path,
) -> None:
    def trainable(config: dict[str, Any]) -> None:
        import time

        for step in range(1200):  # a minute: only the budget ends it sooner
            time.sleep(0.05)
            tune.report({"step": step})

    grid = tune.Tuner(
        trainable,
        param_space={"x": tune.grid_search([1, 2, 3])},
        tune_config=TuneConfig(max_concurrent_trials=1, time_budget_s=1.0),
        run_config=_run_config(tmp_path),
    ).fit()
    first = grid[0]
    assert first.status == "TERMINATED"
    assert 1 <= len(first.metrics_history) < 1200
    assert all(r.status == "PENDING" for r in list(grid)[1:])
    again = tune.Tuner.restore(str(tmp_path / "exp"), trainable).fit()
    assert len(again[0].metrics_history) == len(first.metrics_history)
    with pytest.raises(cairn.InvalidArgumentError, match="time_budget_s"):
        tune.Tuner(
            trainable,
            param_space={},
            tune_config=TuneConfig(time_budget_s=-1.0),
            run_config=RunConfig(name="bad", storage_path=tmp_path),
        ).fit()


def test_with_resources_hands_each_trial_its_own_gpus(
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")  # the GPUs the Tuner may hand out

    def trainable(config: dict[str, Any]) -> None:
        import time

        start = time.monotonic()
        time.sleep(0.3)
        tune.report(
            {
                "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "start": start,
                "end": time.monotonic(),
            }
        )

    grid = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1, "gpu": 1}),
        param_space={"x": tune.grid_search([1, 2, 3])},
        tune_config=TuneConfig(max_concurrent_trials=3),
        run_config=_run_config(tmp_path),
    ).fit()
    spans = [(r.metrics["start"], r.metrics["end"], r.metrics["gpus"]) for r in grid]
    assert sorted({g for _, _, g in spans}) <= ["3", "5"] and len(spans) == 3
    for start, _, gpu in spans:  # one trial per GPU at any moment
        assert sum(1 for s, e, g in spans if g == gpu and s <= start < e) == 1, spans
    with pytest.raises(cairn.InvalidArgumentError, match="resources_per_trial.gpu"):
        tune.Tuner(
            tune.with_resources(trainable, {"gpu": 4}),
            param_space={"x": tune.grid_search([1])},
            run_config=RunConfig(name="too_many", storage_path=tmp_path),
        ).fit()
    with pytest.raises(cairn.InvalidArgumentError, match="memory"):
        tune.with_resources(trainable, {"memory": 1})

    class Recorder(tune.Trainable):
        def step(self) -> dict[str, Any]:
            return {"gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "done": True}

    grid = tune.Tuner(
        tune.with_resources(Recorder, {"gpu": 1}),
        param_space={},
        tune_config=TuneConfig(max_concurrent_trials=1),
        run_config=RunConfig(
            name="class",
            storage_path=tmp_path,
            stop={"training_iteration": 1},
            # No save_checkpoint: as in Ray, a class trainable saves at its end
            # unless told not to.
            checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=False),
        ),
    ).fit()
    assert grid[0].metrics["gpus"] == "3", grid[0].metrics  # its GPU, not the Tuner's "3,5"


def test_random_sampling_is_seeded_and_within_its_domains(tmp_path: pathlib.Path) -> None:
    def trainable(config: dict[str, Any]) -> None:
        tune.report({"v": 1})

    space = {
        "lr": tune.loguniform(1e-4, 1e-1),
        "layers": tune.randint(1, 4),
        "act": tune.choice(["relu", "tanh"]),
        "drop": tune.uniform(0.0, 0.5),
    }
    configs = []
    for name in ("a", "b"):
        grid = tune.Tuner(
            trainable,
            param_space=space,
            tune_config=TuneConfig(num_samples=5, seed=3),
            run_config=RunConfig(name=name, storage_path=tmp_path),
        ).fit()
        configs.append(sorted((r.trial_id, tuple(sorted(r.config.items()))) for r in grid))
        for r in grid:
            assert 1e-4 <= r.config["lr"] < 1e-1 and r.config["layers"] in (1, 2, 3)
            assert r.config["act"] in ("relu", "tanh") and 0.0 <= r.config["drop"] < 0.5
    assert configs[0] == configs[1]


def _reports_config(config: dict[str, Any]) -> None:
    tune.report({"seen": dict(config)})


def test_sample_from_computes_each_trials_value_from_its_config(tmp_path: pathlib.Path) -> None:
    import numpy as np

    space = {
        "x": tune.grid_search([1, 2, 3]),
        "lr": tune.uniform(0.0, 1.0),
        # Read before "y" is computed (keys in order): asked again after it.
        "after_y": tune.sample_from(lambda spec: spec.config.y + 1),
        "y": tune.sample_from(lambda spec: spec.config.x * 10 + spec["config"]["lr"]),
        "model": {"width": tune.sample_from(lambda: np.int64(64))},
        "dims": [tune.sample_from(lambda spec: [spec.config.x] * 2)],
    }
    grid = tune.Tuner(_reports_config, param_space=space, run_config=_run_config(tmp_path)).fit()
    assert grid.num_errors == 0, grid.errors
    assert sorted(r.config["x"] for r in grid) == [1, 2, 3]
    for r in grid:
        c = r.config
        assert c["y"] == c["x"] * 10 + c["lr"] and c["after_y"] == c["y"] + 1
        assert c["model"]["width"] == 64 and isinstance(c["model"]["width"], int)
        assert c["dims"] == [[c["x"], c["x"]]]
        assert r.metrics["seen"] == c  # the trainable got the computed values


def test_sample_from_errors_name_the_key(tmp_path: pathlib.Path) -> None:
    with pytest.raises(TypeError, match="sample_from.*'func' must be a callable, got str"):
        tune.sample_from("lr")  # type: ignore[arg-type]
    with pytest.raises(cairn.InvalidArgumentError, match="the spec or no argument"):
        tune.sample_from(lambda a, b: a)
    waiting = {
        "p": tune.sample_from(lambda spec: spec.config.q),
        "q": tune.sample_from(lambda spec: spec.config.p),
    }
    with pytest.raises(cairn.InvalidArgumentError, match="p, q: .*wait for each other"):
        tune.Tuner(
            _reports_config,
            param_space=waiting,
            run_config=RunConfig(name="cycle", storage_path=tmp_path),
        ).fit()

    def no_width(spec: Any) -> int:
        raise KeyError("width")

    with pytest.raises(cairn.InvalidArgumentError, match=r"model/w: sample_from.*KeyError"):
        tune.Tuner(
            _reports_config,
            param_space={"model": {"w": tune.sample_from(no_width)}},
            run_config=RunConfig(name="raises", storage_path=tmp_path),
        ).fit()
    with pytest.raises(TypeError, match="SampleFrom"):  # grid values are constants
        tune.grid_search([tune.sample_from(lambda: 1)])


def test_restore_needs_the_sample_from_functions_only_while_trials_remain(
    tmp_path: pathlib.Path,
) -> None:
    calls = []

    def fails_on_third_trial(spec: Any) -> int:
        calls.append(spec.config.x)
        if len(calls) == 3:  # the first fit only
            raise RuntimeError("not yet")
        return spec.config.x * 2

    space = {"x": tune.grid_search([1, 2, 3, 4]), "double": tune.sample_from(fails_on_third_trial)}
    with pytest.raises(cairn.InvalidArgumentError, match="double: .*RuntimeError: not yet"):
        tune.Tuner(
            _reports_config,
            param_space=space,
            tune_config=TuneConfig(max_concurrent_trials=1),
            run_config=_run_config(tmp_path),
        ).fit()
    path = tmp_path / "exp"
    assert tune.Tuner.can_restore(path)
    with pytest.raises(cairn.InvalidArgumentError, match="double"):
        tune.Tuner.restore(path, _reports_config)  # trials remain: the function is needed
    grid = tune.Tuner.restore(path, _reports_config, param_space=space).fit()
    assert sorted((r.config["x"], r.config["double"]) for r in grid) == [
        (1, 2),
        (2, 4),
        (3, 6),
        (4, 8),
    ]
    assert {r.status for r in grid} == {"TERMINATED"}
    # Every trial created: no function is needed any more.
    again = tune.Tuner.restore(path, _reports_config).fit()
    assert len(again) == 4


class Counter(tune.Trainable):
    """Adds ``config["inc"]`` each step; the running total is its state."""

    def setup(self, config: dict[str, Any]) -> None:
        self.total = 0.0
        self.restored = False

    def step(self) -> dict[str, Any]:
        self.total += self.config["inc"]
        return {"total": self.total, "restored": self.restored}

    def save_checkpoint(self, checkpoint_dir: str) -> Optional[dict[str, Any]]:
        return {"total": self.total}

    def load_checkpoint(self, checkpoint: Union[str, dict[str, Any]]) -> None:
        assert isinstance(checkpoint, dict)
        self.total = checkpoint["total"]
        self.restored = True


def test_a_class_trainable_under_pbt_clones_the_best_trials_state(
    tmp_path: pathlib.Path,
) -> None:
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=2,
        seed=5,
        hyperparam_mutations={"inc": [1.0, 2.0, 3.0, 4.0]},
    )
    grid = tune.Tuner(
        Counter,
        param_space={"inc": tune.grid_search([1.0, 2.0, 3.0, 4.0])},
        tune_config=TuneConfig(metric="total", mode="max", scheduler=pbt, max_concurrent_trials=4),
        run_config=_run_config(
            tmp_path,
            stop={"training_iteration": 8},
            checkpoint_config=CheckpointConfig(checkpoint_frequency=2),
        ),
    ).fit()
    assert grid.num_errors == 0, grid.errors
    assert {r.status for r in grid} == {"TERMINATED"}
    # At least the stop's 8 iterations; a clone may jump past it, since it
    # goes on from the iteration of the checkpoint it took (as in Ray).
    assert all(r.metrics["training_iteration"] >= 8 for r in grid), [
        (r.trial_id, r.metrics) for r in grid
    ]
    # A trial is only ever ahead of steady growth at its own rate if it
    # took a better trial's state (PBT's exploit through load_checkpoint).
    for r in grid:
        if not r.metrics["restored"]:
            assert r.metrics["total"] == pytest.approx(8 * r.config["inc"]), r.trial_id
    assert grid.get_best_result().metrics["total"] == max(r.metrics["total"] for r in grid)


def test_restore_goes_on_with_the_saved_asha_or_pbt_scheduler(tmp_path: pathlib.Path) -> None:
    def trainable(config: dict[str, Any]) -> None:
        start = 0
        checkpoint = tune.get_checkpoint()
        if checkpoint is not None:
            start = checkpoint.to_dict()["step"]
        for step in range(start + 1, 10):
            # The best trial (x=1: ASHA never stops it, whatever order the
            # trials report in) fails once, before its step 3.
            if step == 3 and config["x"] == config.get("fail_x") and checkpoint is None:
                raise RuntimeError("interrupted")
            tune.report(
                {"loss": config["x"] / step}, checkpoint=Checkpoint.from_dict({"step": step})
            )

    asha = ASHAScheduler(max_t=6, grace_period=1, reduction_factor=3)
    grid = tune.Tuner(
        trainable,
        param_space={"x": tune.grid_search([1.0, 2.0, 3.0]), "fail_x": 1.0},
        tune_config=TuneConfig(metric="loss", mode="min", scheduler=asha),
        run_config=_run_config(tmp_path),
    ).fit()
    assert grid.num_errors == 1
    # Ray's call, no scheduler given: the saved ASHA (max_t=6) goes on.
    again = tune.Tuner.restore(tmp_path / "exp", trainable, resume_errored=True).fit()
    assert again.num_errors == 0 and len(again) == 3
    assert all(r.metrics["training_iteration"] <= 6 for r in again)

    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=1,
        hyperparam_mutations={"x": lambda: 1.0},
    )
    tune.Tuner(
        trainable,
        param_space={"x": 1.0},
        tune_config=TuneConfig(metric="loss", mode="min", scheduler=pbt),
        run_config=RunConfig(name="pbt", storage_path=tmp_path),
    ).fit()
    with pytest.raises(cairn.InvalidArgumentError, match="pass the scheduler again"):
        tune.Tuner.restore(tmp_path / "pbt", trainable)
    assert len(tune.Tuner.restore(tmp_path / "pbt", trainable, scheduler=pbt).fit()) == 1


def test_pbt_mutations_may_be_functions_as_in_ray() -> None:
    import random

    explored = []

    def label(spec: Any) -> str:
        explored.append(dict(spec.config))
        return "explored"

    mutations = {"inc": lambda: random.choice([5.0, 6.0]), "label": tune.sample_from(label)}
    # The explore step alone (what a clone's new config is made by).
    always = PopulationBasedTraining(
        seed=5, resample_probability=1.0, hyperparam_mutations=mutations
    )
    for _ in range(10):
        c = always.explore({"inc": 1.0, "label": "initial", "other": 7})
        assert c == {"inc": c["inc"], "label": "explored", "other": 7} and c["inc"] in (5.0, 6.0)
    assert explored[0]["label"] == "initial" and explored[0]["other"] == 7  # spec.config
    # Without a resample, a number is perturbed; a non-number is always resampled.
    never = PopulationBasedTraining(
        seed=5, resample_probability=0.0, hyperparam_mutations=mutations
    )
    c = never.explore({"inc": 1.0, "label": "initial"})
    assert c["inc"] in (0.8, 1.2) and c["label"] == "explored"
    # Ray's perturbation_factors: a perturbed number is multiplied by one of them.
    factors = PopulationBasedTraining(
        seed=5,
        resample_probability=0.0,
        perturbation_factors=(2.0, 0.5),
        hyperparam_mutations={"inc": tune.uniform(0.0, 10.0)},
    )
    assert {factors.explore({"inc": 3.0})["inc"] for _ in range(20)} == {6.0, 1.5}
    with pytest.raises(cairn.InvalidArgumentError, match="perturbation_factor"):
        PopulationBasedTraining(perturbation_factors=(0.0, 1.0), hyperparam_mutations=mutations)
    with pytest.raises(cairn.InvalidArgumentError, match="burn_in_period"):
        PopulationBasedTraining(burn_in_period=-1, hyperparam_mutations=mutations)
    with pytest.raises(cairn.InvalidArgumentError, match="custom_explore_fn"):
        PopulationBasedTraining(custom_explore_fn=lambda c: c, hyperparam_mutations=mutations)
    with pytest.raises(cairn.InvalidArgumentError, match="the spec or no argument"):
        PopulationBasedTraining(hyperparam_mutations={"lr": lambda a, b: a})


def _tune_driver_killed_at_its_hold(tmp_path: pathlib.Path) -> pathlib.Path:
    """Runs tune_driver.py under tmp_path, SIGKILLs it once each of its three
    trials has committed the checkpoint before its hold, and returns the
    experiment's folder (the hold released)."""
    import tune_driver

    hold = tmp_path / "hold"
    hold.touch()
    exp = tmp_path / "exp"
    held = [
        exp
        / f"trial_{i:05d}"
        / f"checkpoint_{tune_driver.HOLD_AT - 1:06d}"
        / ".cairn"
        / "manifest.json"
        for i in range(3)
    ]
    with driver_process.started(tune_driver.__file__, str(tmp_path)) as driver:
        driver_process.wait_for(driver, *held)
        driver.kill()  # trial runners and workers die with it
    hold.unlink()
    return exp


def test_a_driver_killed_mid_experiment_is_restored_and_no_checkpointed_trial_starts_over(
    tmp_path: pathlib.Path,
) -> None:
    import tune_driver

    exp = _tune_driver_killed_at_its_hold(tmp_path)

    assert tune.Tuner.can_restore(exp)
    grid = tune.Tuner.restore(exp, tune_driver.trainable).fit()
    assert grid.num_errors == 0, grid.errors
    assert sorted(r.config["x"] for r in grid) == [1, 2, 3]
    for r in grid:
        assert r.status == "TERMINATED"
        assert r.checkpoint is not None
        assert r.checkpoint.to_dict() == {"step": tune_driver.STEPS - 1}
        after = [row for row in r.metrics_history if row["start"] > 0]
        # Resumed from its latest committed checkpoint, not from scratch.
        assert after and {row["start"] for row in after} == {tune_driver.HOLD_AT}, r.trial_id
        assert [row["step"] for row in after] == list(range(tune_driver.HOLD_AT, tune_driver.STEPS))


def test_a_killed_driver_restored_without_resume_unfinished_runs_no_started_trial_again(
    tmp_path: pathlib.Path,
) -> None:
    # As Ray: trials that were running when the driver died end TERMINATED
    # where they stood, with their committed checkpoints and results.
    import tune_driver

    exp = _tune_driver_killed_at_its_hold(tmp_path)

    grid = tune.Tuner.restore(exp, tune_driver.trainable, resume_unfinished=False).fit()
    assert grid.num_errors == 0, grid.errors
    assert sorted(r.config["x"] for r in grid) == [1, 2, 3]
    for r in grid:
        assert r.status == "TERMINATED", r.trial_id
        assert r.checkpoint is not None
        assert r.checkpoint.to_dict() == {"step": tune_driver.HOLD_AT - 1}, r.trial_id
        assert [row["step"] for row in r.metrics_history] == list(range(tune_driver.HOLD_AT))
        assert r.metrics["step"] == tune_driver.HOLD_AT - 1


def test_a_result_row_lost_between_a_commit_and_a_kill_is_written_from_the_checkpoint(
    tmp_path: pathlib.Path,
) -> None:
    # The driver dies after a trial committed a checkpoint and before its
    # row reached result.json (acted out: the rows are cut back to before
    # the last commit). The restore writes that row from the metrics
    # committed with the checkpoint: every result once, no step skipped.
    import tune_driver

    hold = tmp_path / "hold"
    hold.touch()
    exp = tmp_path / "exp"
    results = [exp / f"trial_{i:05d}" / "result.json" for i in range(3)]
    with driver_process.started(tune_driver.__file__, str(tmp_path)) as driver:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(
            f.exists() and f.read_text().count("\n") == tune_driver.HOLD_AT for f in results
        ):
            assert driver.poll() is None, "the driver ended early"
            time.sleep(0.05)
        driver.kill()
    hold.unlink()
    for f in results:
        lines = f.read_text().splitlines(keepends=True)
        assert len(lines) == tune_driver.HOLD_AT, f
        f.write_text("".join(lines[:-1]))  # the last report's row, lost

    grid = tune.Tuner.restore(exp, tune_driver.trainable).fit()
    assert grid.num_errors == 0, grid.errors
    for r in grid:
        steps = [row["step"] for row in r.metrics_history]
        assert steps == list(range(tune_driver.STEPS)), (r.trial_id, steps)
        iterations = [row["training_iteration"] for row in r.metrics_history]
        assert iterations == list(range(1, tune_driver.STEPS + 1)), (r.trial_id, iterations)
        backfilled = r.metrics_history[tune_driver.HOLD_AT - 1]
        assert backfilled["checkpoint_dir_name"] == f"checkpoint_{tune_driver.HOLD_AT - 1:06d}"
        with open(pathlib.Path(r.path) / "progress.csv") as f:
            assert len(f.read().splitlines()) == tune_driver.STEPS + 1  # the header too


def _report_steps(config: dict[str, Any]) -> None:
    for step in range(4):
        tune.report({"step": step}, checkpoint=Checkpoint.from_dict({"step": step}))


def test_a_restore_applies_the_retention_an_ended_trial_missed_when_its_driver_died(
    tmp_path: pathlib.Path,
) -> None:
    # The state a driver killed between a trial's end and its deferred
    # retention leaves: the trial TERMINATED with one checkpoint more than
    # it keeps. The next start converges.
    run = _run_config(tmp_path, checkpoint_config=CheckpointConfig(num_to_keep=2))
    grid = tune.Tuner(_report_steps, param_space={"x": tune.grid_search([1])}, run_config=run).fit()
    trial = pathlib.Path(grid[0].path)
    with cairn.CheckpointManager(trial.parent, trial.name) as keep_all:  # no retention
        keep_all.register_checkpoint({"step": 3}, Checkpoint.from_dict({"step": 3}))
    names = sorted(p.name for p in trial.glob("checkpoint_0*"))
    assert len(names) == 3, names

    grid = tune.Tuner.restore(tmp_path / "exp", _report_steps).fit()
    assert grid[0].status == "TERMINATED"
    assert sorted(p.name for p in trial.glob("checkpoint_0*")) == names[1:]
    assert grid[0].checkpoint is not None
    assert pathlib.Path(grid[0].checkpoint.path).name == names[-1]


def _restore_tune_preempt_to_the_end(tmp_path: pathlib.Path) -> None:
    """Restores a tune_preempt.py experiment that was preempted while trials
    x=1 and x=2 ran: every trial ends, those two from the checkpoint they
    made on the notice, x=3 from scratch."""
    import tune_preempt

    (tmp_path / "may_finish").touch()
    grid = tune.Tuner.restore(tmp_path / "exp", tune_preempt.trainable).fit()
    assert not grid.preempted
    assert grid.num_errors == 0, grid.errors
    assert sorted(r.config["x"] for r in grid) == [1, 2, 3]
    for r in grid:
        assert r.status == "TERMINATED"
        starts = {row["start"] for row in r.metrics_history}
        # It ran to its end from where it started last, not from scratch.
        assert r.metrics["step"] == max(tune_preempt.STEPS - 1, max(starts))
        if r.config["x"] == 3:
            assert starts == {0}
        else:  # went on from the checkpoint it made on the notice
            assert len(starts) == 2 and min(starts) == 0 < max(starts), starts


def test_sigterm_to_the_driver_pauses_the_running_trials_with_a_checkpoint(
    tmp_path: pathlib.Path,
) -> None:
    import tune_preempt

    with driver_process.started(tune_preempt.__file__, str(tmp_path)) as driver:
        driver_process.wait_for(driver, tmp_path / "1.started", tmp_path / "2.started")
        driver.send_signal(signal.SIGTERM)
        _, err = driver.communicate(timeout=120)  # reads stderr: a full pipe cannot stall it
    assert driver.returncode == 0, err.decode()
    with open(tmp_path / "grid.json") as f:
        got = json.load(f)
    assert got == {
        "preempted": True,
        "trials": [["trial_00000", "PAUSED"], ["trial_00001", "PAUSED"]],
    }
    _restore_tune_preempt_to_the_end(tmp_path)


def test_ctrl_c_in_tuner_fit_pauses_the_running_trials_then_raises_keyboard_interrupt(
    tmp_path: pathlib.Path,
) -> None:
    import tune_preempt

    with driver_process.started(tune_preempt.__file__, str(tmp_path)) as driver:
        driver_process.wait_for(driver, tmp_path / "1.started", tmp_path / "2.started")
        driver.send_signal(signal.SIGINT)
        _, err = driver.communicate(timeout=120)
    assert driver.returncode != 0
    assert "KeyboardInterrupt" in err.decode(), err.decode()
    assert not (tmp_path / "grid.json").exists()  # fit() raised
    _restore_tune_preempt_to_the_end(tmp_path)


def test_a_failing_trial_is_an_error_with_its_traceback_and_can_be_resumed(
    tmp_path: pathlib.Path,
) -> None:
    marker = tmp_path / "fail"
    marker.touch()

    def trainable(config: dict[str, Any]) -> None:
        ckpt = tune.get_checkpoint()
        start = 0 if ckpt is None else ckpt.to_dict()["step"] + 1
        for step in range(start, 4):
            if config["x"] == 2 and step == 2 and marker.exists():
                raise KeyError("missing shard")
            tune.report({"step": step}, checkpoint=Checkpoint.from_dict({"step": step}))

    grid = tune.Tuner(
        trainable, param_space={"x": tune.grid_search([1, 2])}, run_config=_run_config(tmp_path)
    ).fit()
    assert grid.num_errors == 1 and grid.num_terminated == 1
    failed = next(r for r in grid if r.status == "ERROR")
    assert failed.config["x"] == 2
    assert "KeyError" in str(failed.error) and "missing shard" in str(failed.error)
    assert "Traceback" in str(failed.error)

    marker.unlink()
    grid = tune.Tuner.restore(tmp_path / "exp", trainable, resume_errored=True).fit()
    assert grid.num_errors == 0 and {r.status for r in grid} == {"TERMINATED"}
    resumed = next(r for r in grid if r.config["x"] == 2)
    assert [row["step"] for row in resumed.metrics_history] == [0, 1, 2, 3]


def test_a_torch_trainer_as_trainable_runs_each_trial_on_its_workers(
    tmp_path: pathlib.Path,
) -> None:
    pytest.importorskip("torch")
    from cairn import train
    from cairn.train import ScalingConfig
    from cairn.train.torch import TorchTrainer

    def loop(config: dict[str, Any]) -> None:
        import torch.distributed as dist

        import torch

        t = torch.tensor([config["lr"]])
        dist.all_reduce(t)
        train.report(
            {
                "sum": float(t[0]),
                "world": train.get_context().get_world_size(),
                "epochs": config["epochs"],
            }
        )

    trainer = TorchTrainer(
        loop,
        train_loop_config={"epochs": 3, "lr": 0.0},
        scaling_config=ScalingConfig(num_workers=2),
    )
    grid = tune.Tuner(
        trainer,
        param_space={"train_loop_config": {"lr": tune.grid_search([0.5, 1.5])}},
        run_config=_run_config(tmp_path),
    ).fit()
    assert grid.num_errors == 0, grid.errors
    got = sorted((r.metrics["sum"], r.metrics["world"], r.metrics["epochs"]) for r in grid)
    assert got == [(1.0, 2, 3), (3.0, 2, 3)]
    elastic = TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=(1, 2)))
    with pytest.raises(cairn.InvalidArgumentError, match=r"\(min, max\) range is for the Trainer"):
        tune.Tuner(elastic, run_config=_run_config(tmp_path))


def test_bad_trainables_and_configs_are_clear_errors(tmp_path: pathlib.Path) -> None:
    with pytest.raises(cairn.InvalidArgumentError, match="Trainable"):
        tune.Tuner(dict, run_config=_run_config(tmp_path))
    with pytest.raises(cairn.InvalidArgumentError, match="trainable"):
        tune.Tuner(42, run_config=_run_config(tmp_path))
    with pytest.raises(cairn.InvalidArgumentError, match="search_alg"):
        tune.Tuner(
            lambda c: None,
            tune_config=TuneConfig(search_alg=object()),
            run_config=_run_config(tmp_path),
        )
    with pytest.raises(cairn.InvalidArgumentError, match="mode"):
        tune.Tuner(
            lambda c: None,
            tune_config=TuneConfig(metric="x", mode="sideways"),
            run_config=_run_config(tmp_path),
        )
    with pytest.raises(ValueError, match="hyperparam_mutations"):
        PopulationBasedTraining(hyperparam_mutations={})


class Recorder(tune.Callback):
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.events.append(("start", trial.trial_id))

    def on_trial_result(
        self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
    ) -> None:
        assert trial in trials
        self.events.append(("result", trial.trial_id))

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.events.append(("complete", trial.trial_id))

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.events.append(("error", trial.trial_id))

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        self.events.append(("end", ",".join(sorted(t.status for t in trials))))


def test_python_callbacks_see_every_event_and_a_failing_one_ends_fit_naming_it(
    tmp_path: pathlib.Path,
) -> None:
    def trainable(config: dict[str, Any]) -> None:
        for step in range(2):
            tune.report({"step": step})
        if config["x"] == 1:
            raise ValueError("no")

    recorder = Recorder()
    tune.Tuner(
        trainable,
        param_space={"x": tune.grid_search([0, 1])},
        tune_config=TuneConfig(max_concurrent_trials=1),
        run_config=_run_config(tmp_path, callbacks=[recorder]),
    ).fit()
    assert recorder.events == [
        ("start", "trial_00000"),
        ("result", "trial_00000"),
        ("result", "trial_00000"),
        ("complete", "trial_00000"),
        ("start", "trial_00001"),
        ("result", "trial_00001"),
        ("result", "trial_00001"),
        ("error", "trial_00001"),
        ("end", "ERROR,TERMINATED"),
    ]

    class Broken(tune.Callback):
        def on_trial_result(self, *args: Any, **kw: Any) -> None:
            raise RuntimeError("callback bug")

    with pytest.raises(cairn.InvalidArgumentError, match="Broken.*callback bug"):
        tune.Tuner(
            trainable,
            param_space={"x": 0},
            run_config=RunConfig(name="b", storage_path=tmp_path, callbacks=[Broken()]),
        ).fit()
    with pytest.raises(cairn.InvalidArgumentError, match=r"callbacks\[0\]"):
        tune.Tuner(
            trainable, run_config=RunConfig(name="c", storage_path=tmp_path, callbacks=[object()])
        )


_HOSTS_PROGRAM = os.path.join(os.path.dirname(__file__), "tune_hosts.py")
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(cairn.__file__)))


def test_trials_run_on_every_process_of_a_launch_and_each_gets_the_grid(
    tmp_path: pathlib.Path,
) -> None:
    # Two processes started by hand with torchrun's variables: process 0
    # runs the experiment, process 1 runs the trials placed on it.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        os.environ,
        PYTHONPATH=_PACKAGE_ROOT,
        PYTHONDONTWRITEBYTECODE="1",
        WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    procs = [
        subprocess.Popen(
            [sys.executable, _HOSTS_PROGRAM, str(tmp_path)],
            env=dict(env, RANK=str(r), CAIRN_TEST_PLACE=str(r)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    try:
        outputs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    grids = [json.loads((tmp_path / f"grid_{r}.json").read_text()) for r in range(2)]
    assert grids[0] == grids[1], outputs
    assert isinstance(grids[0], list) and len(grids[0]) == 4, (grids[0], outputs)
    assert all(step == 2 for _, step, _ in grids[0]), grids[0]
    assert {place for _, _, place in grids[0]} == {"0", "1"}, grids[0]
