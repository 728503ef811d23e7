# The Ray Tune guide's ASHA setup (tune.schedulers.ASHAScheduler with a
# grace period and reduction factor) on six trials run one at a time, with
# only its imports changed (ray -> cairn); each trial reports a fixed curve,
# so which trials the scheduler stops, and at which rung, is known. Each
# report carries a checkpoint. Run by ray_compat/test_differential.py.
import json
import os
import tempfile

from cairn import tune
from cairn.tune import Checkpoint
from cairn.tune.schedulers import ASHAScheduler


def train_func(config):
    for step in range(1, 10):
        score = config["quality"] * step
        with tempfile.TemporaryDirectory() as tempdir:
            with open(os.path.join(tempdir, "state.json"), "w") as f:
                json.dump({"step": step}, f)
            tune.report({"score": score}, checkpoint=Checkpoint.from_directory(tempdir))


tuner = tune.Tuner(
    train_func,
    param_space={"quality": tune.grid_search([3, 1, 4, 1.5, 5, 2])},
    tune_config=tune.TuneConfig(
        metric="score",
        mode="max",
        max_concurrent_trials=1,
        scheduler=ASHAScheduler(max_t=9, grace_period=1, reduction_factor=3),
    ),
    run_config=tune.RunConfig(checkpoint_config=tune.CheckpointConfig(num_to_keep=2)),
)
results = tuner.fit()
