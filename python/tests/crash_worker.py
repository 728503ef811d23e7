"""The child program of test_kill.py: saves checkpoints in a loop until killed.

    python3 crash_worker.py EXPERIMENT SCRATCH SEED NUM_TO_KEEP

Opens a :class:`cairn.CheckpointManager` on EXPERIMENT (keeping the
NUM_TO_KEEP most recent) and registers one checkpoint per step, continuing
from the latest committed step. Each step's content is a function of the step
alone (:func:`expected_tensors`, :func:`expected_dict`), so the test can check
every checkpoint it finds against what this program wrote. Steps alternate
between a folder holding a safetensors file written by ``cairn.save`` (made
under SCRATCH, registered with ``Checkpoint.from_directory``) and an in-memory
``Checkpoint.from_dict``.

Writes one byte to stdout after its first commit, so the test can aim its
kill into the saves that follow. Stops by itself after a bounded number of
steps (the test kills it long before).
"""

from __future__ import annotations

import os
import pathlib
import random
import shutil
import sys

import cairn
import numpy as np

MAX_STEPS = 100_000


def is_dict_step(step: int) -> bool:
    """Whether ``step`` is saved as a ``from_dict`` checkpoint (else a folder)."""
    return step % 3 == 2


def expected_tensors(step: int) -> dict[str, np.ndarray]:
    """The tensors a folder checkpoint of ``step`` holds in model.safetensors."""
    return {
        "layer.weight": (np.arange(4096, dtype=np.float32) * 0.5 + step).reshape(64, 64),
        "layer.bias": np.full(64, step % 1000, dtype=np.float16),
        "step": np.array([step], dtype=np.int64),
    }


def expected_dict(step: int) -> dict[str, object]:
    """What a ``from_dict`` checkpoint of ``step`` holds."""
    return {"step": step, "values": [step * 7 + i for i in range(16)]}


def step_of(record_metrics: dict[str, object]) -> int:
    """The step a checkpoint was registered for, from its metrics."""
    step = record_metrics["step"]
    assert isinstance(step, int)
    return step


def main(argv: list[str]) -> int:
    experiment, scratch, seed, num_to_keep = argv[1], argv[2], int(argv[3]), int(argv[4])
    rng = random.Random(seed)
    config = cairn.CheckpointConfig(num_to_keep=num_to_keep)
    with cairn.CheckpointManager(experiment, "", config) as manager:
        latest = manager.latest()
        announced = False
        step = 0 if latest is None else step_of(latest.metrics) + 1
        for _ in range(MAX_STEPS):
            if is_dict_step(step):
                checkpoint = cairn.Checkpoint.from_dict(expected_dict(step))
                manager.register_checkpoint({"step": step}, checkpoint)
            else:
                folder = pathlib.Path(scratch) / f"step_{step}_{rng.getrandbits(32):08x}"
                folder.mkdir(parents=True)
                cairn.save(
                    expected_tensors(step), folder / "model.safetensors", metadata={"step": step}
                )
                manager.register_checkpoint({"step": step}, cairn.Checkpoint.from_directory(folder))
                shutil.rmtree(folder)
            if step_of(manager.latest().metrics) != step:
                print(f"latest is not step {step}", file=sys.stderr)
                return 2
            if not announced:
                os.write(1, b"c")  # the first commit of this process
                announced = True
            step += 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
