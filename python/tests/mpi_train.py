"""The program test_train.py runs under mpirun: a TorchTrainer over MPI.

    mpirun -np 2 python3 mpi_train.py STORAGE_PATH

Every MPI process calls fit(); MPI rank 0 is the driver, each process forks
one rank's worker. Prints ``RESULT <mpi rank> <sum> <error>`` on each.
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
    result = TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=2, launcher="mpi"),
                          run_config=RunConfig(name="mpi", storage_path=argv[1])).fit()
    print("RESULT", os.environ.get("OMPI_COMM_WORLD_RANK"), result.metrics.get("sum"),
          result.error, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
