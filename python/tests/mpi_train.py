"""The program test_train.py runs under a launcher: a TorchTrainer over MPI
or over a torchrun-style launch.

    mpirun -np 2 python3 mpi_train.py STORAGE_PATH [LAUNCHER]
    torchrun --nproc_per_node=2 ... mpi_train.py STORAGE_PATH auto

Every process calls fit(); rank 0 is the driver, each process forks one
rank's worker. Each writes ``<sum> <error>`` to STORAGE_PATH/result_<rank>.txt
(not to stdout, which the launcher may interleave). LAUNCHER is
ScalingConfig's (default "mpi").
"""

from __future__ import annotations

import os
import sys
from typing import Any

from cairn import train
from cairn.train import Checkpoint, RunConfig, ScalingConfig
from cairn.train.torch import TorchTrainer


def loop(config: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    ctx = train.get_context()
    t = torch.tensor([float(ctx.get_world_rank() + 1)])
    dist.all_reduce(t)
    for step in range(3):
        checkpoint = None
        if ctx.get_world_rank() == 0:
            checkpoint = Checkpoint.from_dict({"step": step})
        train.report({"step": step, "sum": float(t[0])}, checkpoint=checkpoint)


def main(argv: list[str]) -> int:
    launcher = argv[2] if len(argv) > 2 else "mpi"
    result = TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=2, launcher=launcher),
                          run_config=RunConfig(name="mpi", storage_path=argv[1])).fit()
    rank = os.environ.get("OMPI_COMM_WORLD_RANK",
                          os.environ.get("RANK", os.environ.get("SLURM_PROCID")))
    with open(os.path.join(argv[1], f"result_{rank}.txt"), "w") as f:
        f.write(f"{result.metrics.get('sum')} {result.error}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
