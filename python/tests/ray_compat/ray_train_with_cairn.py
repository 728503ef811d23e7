"""A Ray Train run (the real Ray: a local cluster, two workers on gloo) whose
checkpoints go through Cairn (cairn.ray.checkpoint_upload_fn).

Usage: ``ray_train_with_cairn.py STORAGE_DIR MARKER_DIR OUT.json``

Rank 0 reports a checkpoint every epoch (a 48 MiB weights file and the
epoch); rank 1 reports none. In the first attempt rank 0 is SIGKILLed while
Cairn uploads epoch 2's checkpoint: a thread watches the checkpoint's folder
and kills the worker as soon as a file appears there before Cairn's
manifest (or right after the upload, if it was too quick to be caught).
FailureConfig(max_failures=1) has Ray restart the group, which resumes from
``get_checkpoint()``. Writes what the run returned to OUT.json.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import sys
import tempfile
import threading
import time
from typing import Any

import cairn.ray
import numpy as np
import ray.train
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

EPOCHS = 5
KILL_AT = 2
SIZE = 48 << 20


def _weights(epoch: int) -> bytes:
    return np.random.default_rng(epoch).integers(0, 256, SIZE, dtype=np.uint8).tobytes()


def _kill_during_upload(folder: pathlib.Path) -> None:
    """SIGKILLs this process once `folder` has a file but no manifest yet;
    bounded: after 60 s it kills anyway."""
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        if folder.exists() and any(p.is_file() for p in folder.rglob("*")):
            break
        time.sleep(0.0005)
    os.kill(os.getpid(), signal.SIGKILL)


def train_func(config: dict[str, Any]) -> None:
    context = ray.train.get_context()
    rank = context.get_world_rank()
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            start = json.loads(pathlib.Path(d, "state.json").read_text())["epoch"] + 1
    marker = pathlib.Path(config["marker_dir"], "killed")
    for epoch in range(start, EPOCHS):
        metrics = {"epoch": epoch, "resumed_from": start}
        if rank != 0:
            ray.train.report(metrics)
            continue

        def upload(ckpt: Any, name: str, epoch: int = epoch) -> Any:
            if epoch == KILL_AT and not marker.exists():
                marker.touch()
                storage = ray.train.get_context().get_storage()
                folder = pathlib.Path(storage.build_checkpoint_path_from_name(name))
                threading.Thread(target=_kill_during_upload, args=(folder,), daemon=True).start()
            return cairn.ray.checkpoint_upload_fn(ckpt, name)

        with tempfile.TemporaryDirectory() as tmp:
            pathlib.Path(tmp, "weights.bin").write_bytes(_weights(epoch))
            pathlib.Path(tmp, "state.json").write_text(json.dumps({"epoch": epoch}))
            ray.train.report(
                metrics,
                checkpoint=ray.train.Checkpoint.from_directory(tmp),
                checkpoint_dir_name=f"checkpoint_epoch_{epoch}",
                checkpoint_upload_fn=upload,
            )


def main() -> None:
    storage, marker_dir, out = sys.argv[1:4]
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"marker_dir": marker_dir},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="run",
            storage_path=storage,
            failure_config=FailureConfig(max_failures=1),
            checkpoint_config=CheckpointConfig(num_to_keep=10),
        ),
    )
    result = trainer.fit()
    pathlib.Path(out).write_text(
        json.dumps(
            {
                "error": None if result.error is None else repr(result.error),
                "checkpoint": None if result.checkpoint is None else result.checkpoint.path,
                "best_checkpoints": [c.path for c, _ in result.best_checkpoints],
                "metrics": result.metrics,
            }
        )
    )


if __name__ == "__main__":
    main()
