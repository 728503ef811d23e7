"""A TorchTrainer run on GPUs, for test_cuda.py (a process of its own).

    python3 gpu_train.py STORAGE_PATH WORKERS EPOCHS [KILL_AT]

Each worker trains a small model on its GPU (NCCL process group), saves the
model and optimizer state from the GPU every epoch (CUDA tensors handed to
Cairn by device address) and restores it with ``train.get_checkpoint()``.
With KILL_AT, rank 0 SIGKILLs itself after that epoch's step in the first
attempt and the run restarts once (``max_failures=1``). Prints one JSON
line: the metrics history and the final checkpoint's folder.

The driver never touches CUDA: its workers are forked, and a process that
initialised CUDA cannot hand it to its forks.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import sys
from typing import Any

from cairn import train
from cairn.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig


def loop(config: dict[str, Any]) -> None:
    import cairn.torch as ct
    import torch.distributed as dist
    from cairn.train.torch import get_device, prepare_model

    import torch

    torch.use_deterministic_algorithms(True)
    ctx = train.get_context()
    device = get_device()
    torch.manual_seed(0)
    model = prepare_model(
        torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    )
    plain = getattr(model, "module", model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    start = 0
    if (ckpt := train.get_checkpoint()) is not None:
        with ckpt.as_directory() as d:
            meta = ct.load_state(pathlib.Path(d) / "state.safetensors", plain, optimizer)
        start = meta["epoch"] + 1
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 32, generator=g).to(device)
    y = x.sum(dim=1, keepdim=True)
    for epoch in range(start, config["epochs"]):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        ones = torch.ones(1, device=device)
        dist.all_reduce(ones)  # over NCCL: counts the group
        if epoch == config.get("kill_at") and ctx.attempt == 0 and ctx.get_world_rank() == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        checkpoint = None
        if ctx.get_world_rank() == 0:
            folder = pathlib.Path(config["scratch"]) / f"epoch_{epoch}_{ctx.attempt}"
            folder.mkdir(parents=True)
            assert next(plain.parameters()).is_cuda
            ct.save_state(folder / "state.safetensors", plain, optimizer, metadata={"epoch": epoch})
            checkpoint = Checkpoint.from_directory(folder)
        train.report(
            {
                "epoch": epoch,
                "backend": dist.get_backend(),
                "group": ones.item(),
                "device": str(device),
                "attempt": ctx.attempt,
            },
            checkpoint=checkpoint,
        )


def main(argv: list[str]) -> int:
    from cairn.train.torch import TorchTrainer

    storage, workers, epochs = argv[1], int(argv[2]), int(argv[3])
    config: dict[str, Any] = {"epochs": epochs, "scratch": os.path.join(storage, "scratch")}
    if len(argv) > 4:
        config["kill_at"] = int(argv[4])
    result = TorchTrainer(
        loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=True),
        run_config=RunConfig(
            name="exp", storage_path=storage, failure_config=FailureConfig(max_failures=1)
        ),
    ).fit()
    if result.error is not None:
        print(f"run failed: {result.error}", file=sys.stderr)
        return 1
    assert result.checkpoint is not None
    print(json.dumps({"history": result.metrics_history, "checkpoint": result.checkpoint.path}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
