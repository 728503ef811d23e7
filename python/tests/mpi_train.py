"""The program test_train.py runs under a launcher: a TorchTrainer over MPI
or over a torchrun-style launch.

    mpirun -np 2 python3 mpi_train.py STORAGE_PATH [LAUNCHER]
    torchrun --nproc_per_node=2 ... mpi_train.py STORAGE_PATH auto
    RANK=r WORLD_SIZE=3 ... mpi_train.py STORAGE_PATH elastic   (r = 0, 1, 2)

Every process calls fit(); rank 0 is the driver, each process forks one
rank's worker. Each writes ``<sum> <error>`` to STORAGE_PATH/result_<rank>.txt
(not to stdout, which the launcher may interleave). LAUNCHER is
ScalingConfig's (default "mpi"), or "elastic": an elastic group of 2 to 3
ranks whose rank 2 waits at step 2 to be killed (``kill-me``).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from cairn import train
from cairn.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from cairn.train.torch import TorchTrainer


def loop(config: dict[str, Any]) -> None:
    import torch.distributed as dist

    import torch

    ctx = train.get_context()
    t = torch.tensor([float(ctx.get_world_rank() + 1)])
    dist.all_reduce(t)
    for step in range(3):
        checkpoint = None
        if ctx.get_world_rank() == 0:
            checkpoint = Checkpoint.from_dict({"step": step})
        train.report({"step": step, "sum": float(t[0])}, checkpoint=checkpoint)


def elastic_loop(config: dict[str, Any]) -> None:
    """Four steps in DDP style; in the first attempt rank 2 writes
    ``kill-me`` at step 2 and waits for its process to be killed."""
    import torch.distributed as dist

    import torch

    ctx = train.get_context()
    ckpt = train.get_checkpoint()
    start = 0 if ckpt is None else ckpt.to_dict()["step"] + 1
    world = torch.tensor([1.0])
    dist.all_reduce(world)  # the ranks this attempt has
    for step in range(start, 4):
        if ctx.attempt == 0 and ctx.get_world_rank() == 2 and step == 2:
            open(os.path.join(config["out"], "kill-me"), "w").close()
            time.sleep(120)  # killed meanwhile
        checkpoint = None
        if ctx.get_world_rank() == 0:
            checkpoint = Checkpoint.from_dict({"step": step})
        train.report({"step": step, "sum": float(world[0])}, checkpoint=checkpoint)


def main(argv: list[str]) -> int:
    launcher = argv[2] if len(argv) > 2 else "mpi"
    if launcher == "elastic":
        result = TorchTrainer(
            elastic_loop,
            train_loop_config={"out": argv[1]},
            scaling_config=ScalingConfig(num_workers=(2, 3)),
            run_config=RunConfig(
                name="elastic", storage_path=argv[1], failure_config=FailureConfig(max_failures=1)
            ),
        ).fit()
        rank = os.environ["RANK"]
        with open(os.path.join(argv[1], f"result_{rank}.txt"), "w") as f:
            f.write(
                f"{result.metrics.get('sum')} {result.error} "
                f"{[r['world_size'] for r in result.restores]}"
            )
        return 0
    result = TorchTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=2, launcher=launcher),
        run_config=RunConfig(name="mpi", storage_path=argv[1]),
    ).fit()
    rank = os.environ.get(
        "OMPI_COMM_WORLD_RANK", os.environ.get("RANK", os.environ.get("SLURM_PROCID"))
    )
    with open(os.path.join(argv[1], f"result_{rank}.txt"), "w") as f:
        f.write(f"{result.metrics.get('sum')} {result.error}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
