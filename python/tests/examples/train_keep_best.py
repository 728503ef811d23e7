# The Ray Train guide's "Configure checkpointing" example: the
# CheckpointConfig as published (keep the 2 best by mean_accuracy), with
# only its imports changed (ray -> cairn), around a training loop that
# reports fixed accuracies so that which checkpoints are kept is known.
# Run by ray_compat/test_differential.py.
import os
import tempfile

from cairn import train
from cairn.train import Checkpoint, CheckpointConfig, RunConfig, ScalingConfig
from cairn.train.torch import TorchTrainer

ACCURACIES = [0.5, 0.9, 0.3, 0.8, 0.7, 0.95]


def train_func():
    for epoch, accuracy in enumerate(ACCURACIES):
        with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
            checkpoint = None
            if train.get_context().get_world_rank() == 0:
                with open(os.path.join(temp_checkpoint_dir, "epoch.txt"), "w") as f:
                    f.write(str(epoch))
                checkpoint = Checkpoint.from_directory(temp_checkpoint_dir)
            train.report({"mean_accuracy": accuracy, "epoch": epoch}, checkpoint=checkpoint)


trainer = TorchTrainer(
    train_func,
    scaling_config=ScalingConfig(num_workers=2),
    run_config=RunConfig(
        checkpoint_config=CheckpointConfig(
            num_to_keep=2,
            checkpoint_score_attribute="mean_accuracy",
            checkpoint_score_order="max",
        ),
    ),
)
result = trainer.fit()
