"""A Tuner program test_tune.py starts on several processes by hand, as a
job script's shell loop or torchrun would (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), each with CAIRN_TEST_PLACE naming it.

    RANK=r WORLD_SIZE=2 ... python3 tune_hosts.py STORAGE_PATH

Every process calls fit(): process 0 runs the experiment, the other runs
the trials placed on it. Each writes what fit() returned (every trial's
id, status and last result, sorted) or raised to
STORAGE_PATH/grid_<rank>.json.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from cairn import tune
from cairn.tune import Checkpoint


def trainable(config: dict[str, Any]) -> None:
    ckpt = tune.get_checkpoint()
    start = 0 if ckpt is None else ckpt.to_dict()["step"] + 1
    for step in range(start, 3):
        tune.report(
            {
                "score": config["x"] * step,
                "step": step,
                "place": os.environ.get("CAIRN_TEST_PLACE", "?"),
            },
            checkpoint=Checkpoint.from_dict({"step": step}),
        )


def main(argv: list[str]) -> int:
    out = os.path.join(argv[1], f"grid_{os.environ['RANK']}.json")
    try:
        grid = tune.Tuner(
            trainable,
            param_space={"x": tune.grid_search([1, 2, 3, 4])},
            tune_config=tune.TuneConfig(metric="score", mode="max"),
            run_config=tune.RunConfig(name="exp", storage_path=argv[1]),
        ).fit()
        got: Any = sorted([r.trial_id, r.metrics["step"], r.metrics["place"]] for r in grid)
    except Exception as e:
        got = f"{type(e).__name__}: {e}"
    with open(out, "w") as f:
        json.dump(got, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
