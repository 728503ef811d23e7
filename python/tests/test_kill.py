"""The commit protocol under SIGKILL, from Python.

A child process (crash_worker.py, on the same interpreter and PYTHONPATH)
saves checkpoints in a loop through ``cairn.CheckpointManager`` with
``num_to_keep=2``, mixing folders written by ``cairn.save`` and in-memory
``from_dict`` checkpoints, and is killed with SIGKILL at seeded random
moments: odd rounds after the child's first commit (so the kill lands in the
saves and retention passes that follow), even rounds at any moment from its
start. After every kill, before anything repairs the experiment:

- every committed checkpoint verifies, and its content is exactly what the
  child wrote for the step it holds;
- at most ``num_to_keep + 1`` are committed (a kill between a commit and the
  retention pass that follows it; include/cairn/manager.h);
- the latest committed step never goes back, and moves forward on every
  aimed kill.

Then a new manager (which repairs) lists exactly committed checkpoints, no
uncommitted folder is left, its latest is the newest committed and loads,
and retention kept at most ``num_to_keep``.

CAIRN_PY_KILL_ITERATIONS sets the number of kills (default 100).
"""

from __future__ import annotations

import os
import pathlib
import random
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from typing import Optional

import cairn
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import crash_worker

NUM_TO_KEEP = 2
# A checkpoint folder's name (checkpoint_name() in include/cairn/manager.h).
CHECKPOINT_NAME = re.compile(r"checkpoint_(\d{6}|[a-z]\d+)")
# Bounds on waits for the child, generous for a loaded machine; they bound a
# hang, they do not judge speed.
FIRST_COMMIT_TIMEOUT_S = 120.0


def _wait_byte(fd: int, timeout_s: float) -> bool:
    """Reads one byte from ``fd``, waiting at most ``timeout_s``; False if none came."""
    ready, _, _ = select.select([fd], [], [], timeout_s)
    return bool(ready) and os.read(fd, 1) == b"c"


def _check_content(checkpoint: cairn.Checkpoint) -> int:
    """Asserts a committed checkpoint holds what the child wrote; returns its step."""
    names = {path for path, _ in checkpoint.files()}
    if "dict.json" in names:
        data = checkpoint.to_dict()
        step = data["step"]
        assert data == crash_worker.expected_dict(step), checkpoint.path
        return step
    assert names == {"model.safetensors"}, f"{checkpoint.path}: {sorted(names)}"
    file = pathlib.Path(checkpoint.path) / "model.safetensors"
    for mmap in (True, False):
        tensors = cairn.load(file, mmap=mmap, framework="np")
        step = int(tensors["step"][0])
        expected = crash_worker.expected_tensors(step)
        assert sorted(tensors) == sorted(expected), checkpoint.path
        for name, want in expected.items():
            got = tensors[name]
            assert got.dtype == want.dtype and got.shape == want.shape, f"{file}: {name}"
            assert np.array_equal(got, want), f"{file}: {name} differs from step {step}'s"
    assert cairn.load_metadata(file) == {"step": step}, file
    return step


def _committed(experiment: pathlib.Path) -> dict[str, int]:
    """The committed checkpoints as the killed child left them: name -> step.

    Each one verifies and holds its step's content.
    """
    out: dict[str, int] = {}
    if not experiment.exists():
        return out
    for entry in sorted(experiment.iterdir()):
        if not CHECKPOINT_NAME.fullmatch(entry.name):
            continue
        checkpoint = cairn.Checkpoint.from_directory(entry)
        if not checkpoint.is_committed():
            continue
        problems = checkpoint.verify()
        assert problems == [], f"{entry.name}: {problems}"
        out[entry.name] = _check_content(checkpoint)
    return out


def _kill_once(
    experiment: pathlib.Path,
    scratch: pathlib.Path,
    seed: int,
    aimed: bool,
    startup_s: float,
    rng: random.Random,
) -> Optional[float]:
    """Starts the child, kills it (after its first commit when ``aimed``) and reaps it.

    Returns the time the child took to its first commit when aimed, else None.
    """
    env = dict(os.environ)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    stderr = tempfile.TemporaryFile()
    started = time.monotonic()
    child = subprocess.Popen(
        [
            sys.executable,
            crash_worker.__file__,
            str(experiment),
            str(scratch),
            str(seed),
            str(NUM_TO_KEEP),
        ],
        stdout=subprocess.PIPE,
        stderr=stderr,
        env=env,
    )
    assert child.stdout is not None
    took = None
    try:
        if aimed:
            if not _wait_byte(child.stdout.fileno(), FIRST_COMMIT_TIMEOUT_S):
                child.kill()
                child.wait()
                stderr.seek(0)
                raise AssertionError(
                    "the child never committed a checkpoint (exit status "
                    f"{child.returncode}): {stderr.read().decode(errors='replace')}"
                )
            took = time.monotonic() - started
            time.sleep(rng.uniform(0.0, 0.05))
        else:
            time.sleep(rng.uniform(0.0, startup_s + 0.05))
        child.send_signal(signal.SIGKILL)
        child.wait()
        stderr.seek(0)
        # A child that ended by itself failed (or ran out of steps, which a
        # kill within 50 ms of its first commit rules out).
        assert child.returncode == -signal.SIGKILL, (
            f"the child exited with status {child.returncode} before the kill: "
            f"{stderr.read().decode(errors='replace')}"
        )
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        stderr.close()
    return took


def test_every_committed_checkpoint_survives_sigkill_at_random_moments() -> None:
    iterations = int(os.environ.get("CAIRN_PY_KILL_ITERATIONS", "100"))
    rng = random.Random(20261126)
    config = cairn.CheckpointConfig(num_to_keep=NUM_TO_KEEP)
    with tempfile.TemporaryDirectory(prefix="cairn-kill-") as tmp:
        experiment = pathlib.Path(tmp) / "exp"
        scratch = pathlib.Path(tmp) / "scratch"
        startup_s = 0.3  # refined by measurement
        latest_step = -1
        for i in range(iterations):
            aimed = i % 2 == 1
            took = _kill_once(experiment, scratch, rng.getrandbits(63), aimed, startup_s, rng)
            if took is not None:
                startup_s = took
            where = f"after kill {i} ({'aimed' if aimed else 'any moment'})"

            committed = _committed(experiment)
            assert len(committed) <= NUM_TO_KEEP + 1, f"{where}: {sorted(committed)}"
            newest = max(committed.values(), default=-1)
            assert newest >= latest_step, f"{where}: step {latest_step} was lost"
            if aimed:
                assert newest > latest_step, f"{where}: the child's commit is not visible"
            latest_step = newest

            with cairn.CheckpointManager(experiment, "", config) as manager:
                history = manager.history()
                names = [r.name for r in history]
                assert set(names) <= set(committed), f"{where}: {names} vs {sorted(committed)}"
                assert len(history) <= NUM_TO_KEEP, f"{where}: {names}"
                assert bool(history) == bool(committed), where
                left = sorted(
                    p.name
                    for p in experiment.iterdir()
                    if CHECKPOINT_NAME.fullmatch(p.name) and p.name not in names
                )
                assert left == [], f"{where}: the new manager left {left}"
                for record in history:
                    assert crash_worker.step_of(record.metrics) == committed[record.name], where
                latest = manager.latest()
                if committed:
                    assert latest is not None and latest.name == max(committed), where
                    assert _check_content(latest.checkpoint) == latest_step, where
        # Whatever the kills left in the child's scratch folder goes with tmp.
