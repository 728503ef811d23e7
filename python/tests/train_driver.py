"""A training run's driver for test_train.py's driver-kill test.

    python3 train_driver.py STORAGE_PATH [interruptible]

Runs ``loop`` (which test_train.py imports to restore the run) in two
workers: steps 0..STEPS-1, a checkpoint each. Before step HOLD_AT the
workers wait while the file STORAGE_PATH/hold exists, so the test can
SIGKILL this process mid-run, whatever the machine's speed.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from cairn import train
from cairn.train import Checkpoint, RunConfig, ScalingConfig

STEPS = 6
HOLD_AT = 3


def loop(config: dict[str, Any]) -> None:
    ckpt = train.get_checkpoint()
    start = 0 if ckpt is None else ckpt.to_dict()["step"] + 1
    for step in range(start, STEPS):
        deadline = time.monotonic() + 600  # bounded, should the test die first
        while step == HOLD_AT and os.path.exists(config["hold"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        train.report(
            {"step": step, "start": start}, checkpoint=Checkpoint.from_dict({"step": step})
        )


def interruptible_loop(config: dict[str, Any]) -> None:
    """Reports every step; a checkpoint at step 0 and when preempted (Ctrl-C)."""
    for step in range(100_000):  # bounded: about 30 minutes
        time.sleep(0.02)
        checkpoint = None
        if step == 0 or train.should_checkpoint():
            checkpoint = Checkpoint.from_dict(
                {"step": step, "preempted": train.should_checkpoint()}
            )
        train.report({"step": step}, checkpoint=checkpoint)


def main(argv: list[str]) -> int:
    from cairn.train.torch import TorchTrainer

    if argv[2:] == ["interruptible"]:
        TorchTrainer(
            interruptible_loop,
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="exp", storage_path=argv[1]),
        ).fit()
        return 0
    TorchTrainer(
        loop,
        train_loop_config={"hold": os.path.join(argv[1], "hold")},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="exp", storage_path=argv[1]),
    ).fit()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
