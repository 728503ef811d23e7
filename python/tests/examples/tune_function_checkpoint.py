# The Ray Tune guide's "Function API checkpointing" example, as published,
# with only its imports changed (ray -> cairn). The guide leaves MyModel to
# the reader; a small one is defined here. Run by test_examples.py.
import os
import tempfile

from cairn import tune
from cairn.tune import Checkpoint

import torch


class MyModel(torch.nn.Linear):
    def __init__(self):
        super().__init__(4, 2)


def train_func(config):
    start = 1
    my_model = MyModel()
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            checkpoint_dict = torch.load(os.path.join(checkpoint_dir, "checkpoint.pt"))
            start = checkpoint_dict["epoch"] + 1
            my_model.load_state_dict(checkpoint_dict["model_state"])
    for epoch in range(start, config["epochs"] + 1):
        # Model training here
        # ...
        metrics = {"metric": 1}
        with tempfile.TemporaryDirectory() as tempdir:
            torch.save(
                {"epoch": epoch, "model_state": my_model.state_dict()},
                os.path.join(tempdir, "checkpoint.pt"),
            )
            tune.report(metrics=metrics, checkpoint=Checkpoint.from_directory(tempdir))


tuner = tune.Tuner(train_func, param_space={"epochs": 5})
result_grid = tuner.fit()
