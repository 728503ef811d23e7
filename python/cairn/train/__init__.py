"""cairn.train: Ray Train's API over Cairn's C++ training runtime.

A Ray Train script runs with only its imports changed::

    from cairn import train
    from cairn.train import Checkpoint, CheckpointConfig, RunConfig, ScalingConfig
    from cairn.train.torch import TorchTrainer

    def train_loop_per_worker(config):
        start = 0
        if (ckpt := train.get_checkpoint()) is not None:
            start = ckpt.to_dict()["epoch"] + 1
        for epoch in range(start, config["epochs"]):
            ...
            train.report({"loss": loss}, checkpoint=Checkpoint.from_dict({"epoch": epoch}))

    result = TorchTrainer(train_loop_per_worker, train_loop_config={"epochs": 5},
                          scaling_config=ScalingConfig(num_workers=2),
                          run_config=RunConfig(name="exp", storage_path="/tmp/results")).fit()

The workers are processes forked by the C++ runtime; each report is
collective and each reported checkpoint is committed manifest-last, durable
when ``report`` returns (docs/python.md, "Training").
"""

from __future__ import annotations

from cairn._args import check_public as _check_public
from cairn._checkpoint import Checkpoint
from cairn._manager import CheckpointConfig, MemoryTierConfig
from cairn.train._config import FailureConfig, RunConfig, ScalingConfig, SyncConfig
from cairn.train._result import Result, TrainingFailedError, WorkerGroupError
from cairn.train._session import (
    TrainContext,
    get_checkpoint,
    get_context,
    report,
    should_checkpoint,
    wait_for_reports,
)
from cairn.train._trainer import DataParallelTrainer

__all__ = [
    "Checkpoint",
    "CheckpointConfig",
    "MemoryTierConfig",
    "DataParallelTrainer",
    "FailureConfig",
    "Result",
    "RunConfig",
    "ScalingConfig",
    "SyncConfig",
    "TrainContext",
    "TrainingFailedError",
    "get_checkpoint",
    "get_context",
    "report",
    "should_checkpoint",
    "wait_for_reports",
    "WorkerGroupError",
]


# A wrong type in a public call is a TypeError naming the parameter.
_check_public(globals())
