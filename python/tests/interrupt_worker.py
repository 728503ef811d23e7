"""The child program of test_interrupt.py: large saves in a loop until Ctrl-C.

    python3 interrupt_worker.py EXPERIMENT SCRATCH SIZE_MIB

Each step writes a state of SIZE_MIB with ``cairn.save`` into a folder under
SCRATCH and registers that folder with a :class:`cairn.CheckpointManager`
(``num_to_keep=1``). It reports on stdout, one line each, ``save N`` before
the save of step N, ``register N`` before its registration and
``committed N`` after it, so the test can aim SIGINT into either call.
SIGINT is left to Python's default handler: the program ends with
KeyboardInterrupt. Stops by itself after a bounded number of steps.
"""

from __future__ import annotations

import pathlib
import shutil
import sys

import cairn
import numpy as np

MAX_STEPS = 1000
TENSORS = 20


def base_tensors(size_mib: int) -> dict[str, np.ndarray]:
    """The state every step starts from: TENSORS float32 tensors, SIZE_MIB in all."""
    n = size_mib * (1 << 20) // 4 // TENSORS
    return {f"layer{i}.weight": np.arange(n, dtype=np.float32) + i for i in range(TENSORS)}


def stamp(state: dict[str, np.ndarray], step: int) -> dict[str, np.ndarray]:
    """Makes ``state`` step ``step``'s: the first element of every tensor is the step."""
    for tensor in state.values():
        tensor[0] = step
    return state


def say(line: str) -> None:
    """One line to the test, unbuffered."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    experiment, scratch, size_mib = argv[1], pathlib.Path(argv[2]), int(argv[3])
    state = base_tensors(size_mib)
    config = cairn.CheckpointConfig(num_to_keep=1)
    with cairn.CheckpointManager(experiment, "", config) as manager:
        latest = manager.latest()
        step = 0 if latest is None else int(latest.metrics["step"]) + 1
        for _ in range(MAX_STEPS):
            folder = scratch / f"step_{step}"
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            say(f"save {step}")
            cairn.save(stamp(state, step), folder / "model.safetensors", metadata={"step": step})
            say(f"register {step}")
            manager.register_checkpoint({"step": step}, cairn.Checkpoint.from_directory(folder))
            say(f"committed {step}")
            shutil.rmtree(folder)
            step += 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
