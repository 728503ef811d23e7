"""The memory tier from Python: CheckpointConfig(memory_tier=MemoryTierConfig(...)).

The behaviour is the C++ manager's (tests/manager/memory_tier_test.cc); these
tests prove the binding passes the settings through and reports the tiers,
and that a Tuner's trials in memory outlive a killed driver.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import cairn
import pytest
from cairn import train, tune
from cairn.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig

sys.path.insert(0, os.path.dirname(__file__))
import driver_process


def _config(root: pathlib.Path, **tier: Any) -> cairn.CheckpointConfig:
    return cairn.CheckpointConfig(memory_tier=cairn.MemoryTierConfig(root=str(root), **tier))


def _source(folder: pathlib.Path, text: str) -> cairn.Checkpoint:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "state.txt").write_text(text)
    return cairn.Checkpoint.from_directory(folder)


def _tiers(root: pathlib.Path) -> list[pathlib.Path]:
    base = root / f"cairn-tier-{os.getuid()}"
    return sorted(base.iterdir()) if base.exists() else []


def test_saves_go_to_memory_and_every_nth_and_the_newest_are_persisted(
    tmp_path: pathlib.Path,
) -> None:
    root = tmp_path / "shm"
    root.mkdir()
    config = _config(root, num_to_keep=2, persist_every_n=2)
    assert config.memory_tier is not None and config.memory_tier.persist_every_n == 2
    assert cairn.CheckpointConfig().memory_tier is None
    with cairn.CheckpointManager(tmp_path, "exp", config) as manager:
        for step in range(3):
            record = manager.register_checkpoint(
                {"step": step}, _source(tmp_path / f"s{step}", f"v{step}")
            )
            assert record.tier == "memory"
            assert str(root) in record.checkpoint.path
        manager.wait_for_persistence()
        tiers = [(r.index, r.tier, r.persisted) for r in manager.history()]
        assert tiers == [(1, "memory", True), (2, "memory", False)]
        assert manager.latest().index == 2
    assert _tiers(root) == []
    with cairn.CheckpointManager(tmp_path, "exp") as reopened:
        assert [r.index for r in reopened.history()] == [1, 2]
        with reopened.latest().checkpoint.as_directory() as d:
            assert (pathlib.Path(d) / "state.txt").read_text() == "v2"


def test_a_process_that_dies_leaves_its_tier_for_the_next_open(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "shm"
    root.mkdir()
    script = textwrap.dedent(f"""
        import os, pathlib, cairn
        config = cairn.CheckpointConfig(memory_tier=cairn.MemoryTierConfig(
            root={str(root)!r}, persist_every_n=0))
        m = cairn.CheckpointManager({str(tmp_path)!r}, "exp", config)
        src = pathlib.Path({str(tmp_path / "src")!r})
        src.mkdir()
        (src / "state.txt").write_text("only in memory")
        m.register_checkpoint({{"step": 0}}, cairn.Checkpoint.from_directory(src))
        os.kill(os.getpid(), 9)
    """)
    proc = subprocess.run([sys.executable, "-c", script], env=os.environ.copy())
    assert proc.returncode == -signal.SIGKILL
    assert len(_tiers(root)) == 1
    with cairn.CheckpointManager(tmp_path, "exp", _config(root)) as manager:
        latest = manager.latest()
        assert latest is not None and latest.tier == "memory" and not latest.persisted
        with latest.checkpoint.as_directory() as d:
            assert (pathlib.Path(d) / "state.txt").read_text() == "only in memory"
    assert _tiers(root) == []


def test_bad_memory_tier_settings_raise_naming_the_field() -> None:
    with pytest.raises(cairn.InvalidArgumentError, match="MemoryTierConfig.num_to_keep"):
        cairn.MemoryTierConfig(num_to_keep=0)
    with pytest.raises(cairn.InvalidArgumentError, match="on_insufficient_memory"):
        cairn.MemoryTierConfig(on_insufficient_memory="swap")
    with pytest.raises(cairn.InvalidArgumentError, match="MemoryTierConfig.replicas"):
        cairn.MemoryTierConfig(replicas=-1)
    assert cairn.MemoryTierConfig().replicas == 1
    assert cairn.MemoryTierConfig(replicas=2).replicas == 2
    assert cairn.MemoryTierConfig().ranks_read_own_files is False
    assert cairn.MemoryTierConfig(ranks_read_own_files=True).ranks_read_own_files is True
    with pytest.raises(TypeError, match="ranks_read_own_files"):
        cairn.MemoryTierConfig(ranks_read_own_files="yes")  # type: ignore[arg-type]


def _fit_with_one_restart(
    loop: Any, tmp_path: pathlib.Path, root: pathlib.Path, *, workers: int, persist_every_n: int
) -> Any:
    """Trains `loop` on `workers` ranks as experiment tmp_path/exp, the
    memory tier at `root`, one restart allowed."""
    return train.DataParallelTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(
            name="exp",
            storage_path=tmp_path,
            checkpoint_config=_config(root, persist_every_n=persist_every_n),
            failure_config=FailureConfig(max_failures=1),
        ),
    ).fit()


def test_a_trainer_restarts_from_memory_and_says_so(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "shm"
    root.mkdir()

    def loop(config: dict[str, Any]) -> None:
        ckpt = train.get_checkpoint()
        start = 0 if ckpt is None else ckpt.to_dict()["step"] + 1
        ctx = train.get_context()
        for step in range(start, 4):
            if step == 2 and ctx.attempt == 0 and ctx.get_world_rank() == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            train.report({"step": step}, checkpoint=Checkpoint.from_dict({"step": step}))

    result = _fit_with_one_restart(loop, tmp_path, root, workers=2, persist_every_n=0)
    assert result.error is None, result.error
    assert result.restores == [
        {
            "attempt": 1,
            "checkpoint": "checkpoint_000001",
            "tier": "memory",
            "world_size": 2,
            "rank_tiers": [],
            "damaged": [],
        }
    ]
    assert [row["step"] for row in result.metrics_history] == [0, 1, 2, 3]
    assert result.checkpoint is not None and str(root) not in result.checkpoint.path
    assert result.checkpoint.to_dict() == {"step": 3}
    assert _tiers(root) == []


@pytest.mark.parametrize("persisted", [True, False])
def test_a_bit_flip_in_memory_is_found_on_restart_and_the_next_copy_is_taken(
    tmp_path: pathlib.Path, persisted: bool
) -> None:
    # Attempt 0 commits steps 0..2 to memory, flips one bit of the newest
    # copy there, and fails. The restart finds the damage by the manifest's
    # checksum, drops that copy and restores from the next one: the
    # persistent copy of the same checkpoint, or (nothing persisted) the
    # older checkpoint in memory.
    root = tmp_path / "shm"
    root.mkdir()

    def loop(config: dict[str, Any]) -> None:
        ckpt = train.get_checkpoint()
        start = 0 if ckpt is None else ckpt.to_dict()["step"] + 1
        for step in range(start, 4):
            train.report({"step": step}, checkpoint=Checkpoint.from_dict({"step": step}))
            if step == 2 and train.get_context().attempt == 0:
                if persisted:  # the flip comes after the background copy
                    manifest = tmp_path / "exp" / "checkpoint_000002" / ".cairn" / "manifest.json"
                    deadline = time.monotonic() + 120
                    while not manifest.exists() and time.monotonic() < deadline:
                        time.sleep(0.01)
                [newest] = sorted(root.glob("cairn-tier-*/*/checkpoints/checkpoint_000002"))
                target = newest / "dict.json"
                data = bytearray(target.read_bytes())
                data[len(data) // 2] ^= 0x01
                target.write_bytes(bytes(data))
                raise RuntimeError("failing after the bit flip")

    result = _fit_with_one_restart(
        loop, tmp_path, root, workers=1, persist_every_n=1 if persisted else 0
    )
    assert result.error is None, result.error
    [restore] = result.restores
    assert len(restore["damaged"]) == 1, restore
    assert "checkpoint_000002" in restore["damaged"][0]
    assert "dict.json" in restore["damaged"][0]
    if persisted:
        assert (restore["checkpoint"], restore["tier"]) == ("checkpoint_000002", "persistent")
        resumed_at = 3
    else:
        assert (restore["checkpoint"], restore["tier"]) == ("checkpoint_000001", "memory")
        resumed_at = 2
    steps = [row["step"] for row in result.metrics_history]
    assert steps == [0, 1, 2] + list(range(resumed_at, 4))
    assert result.checkpoint is not None and result.checkpoint.to_dict() == {"step": 3}


@pytest.mark.parametrize("resume_unfinished", [True, False])
def test_trials_in_the_memory_tier_outlive_a_killed_driver_and_end_persisted(
    tmp_path: pathlib.Path, resume_unfinished: bool
) -> None:
    # The trials' checkpoints are in memory only (persisted when a trial's
    # run ends) when the driver is killed: the restore resumes each trial
    # from its memory, or ends it where it stood, and either way its newest
    # checkpoint is persisted and its memory freed.
    import tune_driver

    hold = tmp_path / "hold"
    hold.touch()
    shm = tmp_path / "shm"
    shm.mkdir()
    exp = tmp_path / "exp"
    held = (
        f"cairn-tier-*/*/checkpoints/checkpoint_{tune_driver.HOLD_AT - 1:06d}/.cairn/manifest.json"
    )
    with driver_process.started(tune_driver.__file__, str(tmp_path), str(shm)) as driver:
        driver_process.wait_for_matches(driver, shm, held, 3)
        driver.kill()
    hold.unlink()
    assert not list(exp.glob("trial_*/checkpoint_0*")), "only memory held the checkpoints"

    grid = tune.Tuner.restore(exp, tune_driver.trainable, resume_unfinished=resume_unfinished).fit()
    assert grid.num_errors == 0, grid.errors
    last = tune_driver.STEPS - 1 if resume_unfinished else tune_driver.HOLD_AT - 1
    for r in grid:
        assert r.status == "TERMINATED", r.trial_id
        assert r.checkpoint is not None
        assert r.checkpoint.to_dict() == {"step": last}, r.trial_id
        assert r.checkpoint.path.startswith(str(exp)), r.checkpoint.path
        assert [row["step"] for row in r.metrics_history] == list(range(last + 1))
        if resume_unfinished:
            # Resumed from the checkpoint only memory held.
            assert r.metrics_history[-1]["start"] == tune_driver.HOLD_AT, r.trial_id
    assert not list(shm.glob("cairn-tier-*/*")), "a trial's memory was left"
