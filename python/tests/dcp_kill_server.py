"""Fork server for test_dcp.py's SIGKILL loop.

Usage: dcp_kill_server.py EXPERIMENT. Imports torch and cairn once (torch
starts no thread on import, so forking is sound), then for each line on
stdin (a delay in seconds) forks a child that opens a CheckpointManager on EXPERIMENT and saves
``state_for(step)`` through ``dcp.save`` and cairn.torch.dcp.Writer in a
loop, forever; SIGKILLs it once the delay has passed since the fork, and
prints ``exit <wait status>`` once it has reaped it.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import warnings
from typing import Any

import cairn
import torch.distributed.checkpoint as dcp
from cairn.torch.dcp import Writer

import torch

KEEP = 3


def state_for(step: int) -> dict[str, Any]:
    """What checkpoint ``step`` holds: values that only that step gives."""
    return {
        "w": torch.arange(64 * 1024, dtype=torch.float32) + step,
        "b": torch.full((1024,), step, dtype=torch.int64),
        "step": step,
        "tag": f"step-{step}",
    }


def _child(experiment: str) -> None:
    warnings.filterwarnings("ignore")  # dcp.save without a process group says so
    torch.set_num_threads(1)
    with cairn.CheckpointManager(experiment, config=cairn.CheckpointConfig(num_to_keep=KEEP)) as m:
        latest = m.latest()
        step = 0 if latest is None else latest.metrics["step"] + 1
        while True:
            dcp.save(state_for(step), storage_writer=Writer(m, metrics={"step": step}))
            step += 1


def main() -> None:
    experiment = sys.argv[1]
    for line in sys.stdin:
        delay = float(line)
        pid = os.fork()
        if pid == 0:
            try:
                _child(experiment)
            finally:
                os._exit(1)
        time.sleep(delay)  # the instant of the child's life the kill lands at
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        print(f"exit {status}", flush=True)


if __name__ == "__main__":
    main()
