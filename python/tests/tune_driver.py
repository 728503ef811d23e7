"""A Tuner's driver for test_tune.py's driver-kill test.

    python3 tune_driver.py STORAGE_PATH [MEMORY_TIER_ROOT]

Runs ``trainable`` (which test_tune.py imports to restore the experiment)
over three trials: steps 0..STEPS-1, a checkpoint each. Before step HOLD_AT
each trial waits while the file STORAGE_PATH/hold exists, so the test can
SIGKILL this process mid-experiment, whatever the machine's speed. With
MEMORY_TIER_ROOT the trials save into memory tiers there, persisted only
when a trial's run ends.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import cairn
from cairn import tune
from cairn.tune import Checkpoint

STEPS = 5
HOLD_AT = 2


def trainable(config: dict[str, Any]) -> None:
    ckpt = tune.get_checkpoint()
    start = 0 if ckpt is None else ckpt.to_dict()["step"] + 1
    for step in range(start, STEPS):
        deadline = time.monotonic() + 600  # bounded, should the test die first
        while step == HOLD_AT and os.path.exists(config["hold"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        tune.report(
            {"score": config["x"] * step, "step": step, "start": start},
            checkpoint=Checkpoint.from_dict({"step": step}),
        )


def main(argv: list[str]) -> int:
    checkpoint_config = cairn.CheckpointConfig()
    if len(argv) > 2:
        checkpoint_config = cairn.CheckpointConfig(
            memory_tier=cairn.MemoryTierConfig(root=argv[2], persist_every_n=0)
        )
    tune.Tuner(
        trainable,
        param_space={"x": tune.grid_search([1, 2, 3]), "hold": os.path.join(argv[1], "hold")},
        tune_config=tune.TuneConfig(metric="score", mode="max", max_concurrent_trials=3),
        run_config=tune.RunConfig(
            name="exp", storage_path=argv[1], checkpoint_config=checkpoint_config
        ),
    ).fit()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
