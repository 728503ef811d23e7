"""A Tuner's driver for test_tune.py's SIGTERM test.

    python3 tune_preempt.py STORAGE_PATH

Runs ``trainable`` (which test_tune.py imports to restore the experiment)
over three trials, two at a time: steps of 20 ms from 0, a checkpoint only
when ``train.should_checkpoint()`` says so (a preemption notice) or at the
last. A trial ends at the first step at or past STEPS - 1 once
STORAGE_PATH/may_finish exists, so before that none ends on its own however
the machine's load spreads their starts. Each trial touches
STORAGE_PATH/<x>.started once it is past step 1. Writes what fit() returned
to STORAGE_PATH/grid.json.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from cairn import train, tune
from cairn.tune import Checkpoint

STEPS = 30


def trainable(config: dict[str, Any]) -> None:
    ckpt = tune.get_checkpoint()
    start = 0 if ckpt is None else ckpt.to_dict()["step"] + 1
    step = start
    while True:
        time.sleep(0.02)
        if step == 2:
            open(os.path.join(config["dir"], f"{config['x']}.started"), "w").close()
        last = step >= STEPS - 1 and os.path.exists(os.path.join(config["dir"], "may_finish"))
        save = train.should_checkpoint() or last
        tune.report(
            {"score": config["x"] * step, "step": step, "start": start},
            checkpoint=Checkpoint.from_dict({"step": step}) if save else None,
        )
        if last:
            return
        step += 1


def main(argv: list[str]) -> int:
    grid = tune.Tuner(
        trainable,
        param_space={"x": tune.grid_search([1, 2, 3]), "dir": argv[1]},
        tune_config=tune.TuneConfig(metric="score", mode="max", max_concurrent_trials=2),
        run_config=tune.RunConfig(name="exp", storage_path=argv[1]),
    ).fit()
    with open(os.path.join(argv[1], "grid.json"), "w") as out:
        json.dump(
            {"preempted": grid.preempted, "trials": sorted([r.trial_id, r.status] for r in grid)},
            out,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
