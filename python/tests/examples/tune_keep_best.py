# The Ray Tune guide's checkpoint configuration (keep the 2 best checkpoints
# by a metric) on a grid of two trials, with only its imports changed
# (ray -> cairn); the function reports fixed scores so that which
# checkpoints are kept, and which trial is best, is known.
# Run by ray_compat/test_differential.py.
import json
import os
import tempfile

from cairn import tune
from cairn.tune import Checkpoint


def train_func(config):
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            with open(os.path.join(checkpoint_dir, "state.json")) as f:
                start = json.load(f)["step"] + 1
    for step in range(start, 6):
        score = config["scale"] * [3, 9, 1, 7, 5, 8][step]
        with tempfile.TemporaryDirectory() as tempdir:
            with open(os.path.join(tempdir, "state.json"), "w") as f:
                json.dump({"step": step}, f)
            tune.report({"score": score}, checkpoint=Checkpoint.from_directory(tempdir))


tuner = tune.Tuner(
    train_func,
    param_space={"scale": tune.grid_search([1, 2])},
    tune_config=tune.TuneConfig(metric="score", mode="max", max_concurrent_trials=1),
    run_config=tune.RunConfig(
        checkpoint_config=tune.CheckpointConfig(
            num_to_keep=2,
            checkpoint_score_attribute="score",
            checkpoint_score_order="max",
        ),
    ),
)
results = tuner.fit()
best = results.get_best_result()
print("best", best.config, best.metrics["score"])
