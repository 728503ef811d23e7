#!/usr/bin/env python3
"""Lightning's checkpoint plugins against Cairn's, same state, same disk.

    PYTHONPATH=build/python .venv/bin/python3 bench/lightning_compare.py [--width 2048]
        [--layers 6] [--rounds 3] [--dir DIR]

The state is a real Lightning checkpoint dict (``dump_checkpoint()`` of a
Trainer that ran one step of a stack of ``--layers`` Linear(width, width)
layers with Adam: weights plus Adam's two moments, about 300 MiB at the
defaults). Each round, interleaved:

- save: ``TorchCheckpointIO.save_checkpoint`` (torch.save into memory, then
  the file; no fsync) against ``CairnCheckpointIO.save_checkpoint`` (Cairn's
  engine, durable on return: file and folder fsync'd, committed
  manifest-last), both overwriting the name they saved in the round before;
- async stall: the time until ``save_checkpoint`` returns, Lightning's
  ``AsyncCheckpointIO(TorchCheckpointIO())`` (clones every tensor, then a
  thread saves) against ``AsyncCairnCheckpointIO`` (copies the tensors into
  staging kept from the last save, then Cairn writes behind); each save
  waited for before the next (its total is printed too); and the stall of
  the first save after a ``load_checkpoint`` by a fresh plugin (a resumed
  run; Cairn's readies its staging in the background from the load on, and
  the benchmark waits for that, as a resumed run's first epoch would);
- load: ``load_checkpoint`` of what was saved (page cache warm for both;
  Cairn's verifies the checksums first).

Prints each figure (median of the rounds, the first round's async stall
apart: it is the one that allocates) with the ratio reference / Cairn
(above 1: Cairn faster). Goals (issue 50): Cairn's save at least as fast as
TorchCheckpointIO's, its async stall at most AsyncCheckpointIO's. The folder
--dir (a temporary one on the working folder's disk by default) is removed
at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import warnings
from typing import Any, Callable

import lightning.pytorch as pl
from cairn.lightning import AsyncCairnCheckpointIO, CairnCheckpointIO
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.plugins.io import AsyncCheckpointIO

import torch


class Stack(pl.LightningModule):
    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return self.net(batch[0]).square().mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-4)

    def train_dataloader(self) -> Any:
        x = torch.randn(4, self.hparams.width)
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=4)


def make_checkpoint(width: int, layers: int, root: str) -> dict[str, Any]:
    trainer = pl.Trainer(
        max_steps=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Stack(width, layers))
    return trainer._checkpoint_connector.dump_checkpoint()


def timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="lightning_compare_", dir=args.dir or os.getcwd())
    try:
        checkpoint = make_checkpoint(args.width, args.layers, root)
        nbytes = sum(t.numel() * t.element_size() for t in _tensors(checkpoint))
        print(f"state: {nbytes / 2**20:.0f} MiB of tensors, folder {root}")
        torch_io, cairn_io = TorchCheckpointIO(), CairnCheckpointIO()
        torch_async = AsyncCheckpointIO(TorchCheckpointIO())
        cairn_async = AsyncCairnCheckpointIO()
        rows: dict[str, list[float]] = {}

        def add(name: str, value: float) -> None:
            rows.setdefault(name, []).append(value)

        paths = {k: os.path.join(root, f"{k}.ckpt") for k in ("t", "c", "ta", "ca")}
        for _ in range(args.rounds):
            add("save torch", timed(lambda: torch_io.save_checkpoint(checkpoint, paths["t"])))
            add("save cairn", timed(lambda: cairn_io.save_checkpoint(checkpoint, paths["c"])))
            t0 = time.perf_counter()
            torch_async.save_checkpoint(checkpoint, paths["ta"])
            add("stall torch", time.perf_counter() - t0)
            torch_async.teardown()  # waits for the thread
            add("async total torch", time.perf_counter() - t0)
            t0 = time.perf_counter()
            cairn_async.save_checkpoint(checkpoint, paths["ca"])
            add("stall cairn", time.perf_counter() - t0)
            cairn_async.wait()
            add("async total cairn", time.perf_counter() - t0)
            add("load torch", timed(lambda: torch_io.load_checkpoint(paths["t"])))
            add("load cairn", timed(lambda: cairn_io.load_checkpoint(paths["c"])))
        cairn_async.teardown()
        # A resumed run: a fresh process's plugin loads, then saves.
        resumed_torch = AsyncCheckpointIO(TorchCheckpointIO())
        resumed_torch.load_checkpoint(paths["ta"])
        add(
            "resumed stall torch",
            timed(lambda: resumed_torch.save_checkpoint(checkpoint, paths["ta"])),
        )
        resumed_torch.teardown()
        resumed_cairn = AsyncCairnCheckpointIO()
        resumed_cairn.load_checkpoint(paths["ca"])
        resumed_cairn.wait()  # the staging readied meanwhile, as during a resumed run's epoch
        add(
            "resumed stall cairn",
            timed(lambda: resumed_cairn.save_checkpoint(checkpoint, paths["ca"])),
        )
        resumed_cairn.teardown()

        def med(name: str, skip_first: bool = False) -> float:
            values = rows[name][1:] if skip_first and len(rows[name]) > 1 else rows[name]
            return statistics.median(values)

        print(f"{'figure':<34}{'Lightning':>11}{'Cairn':>11}{'ratio':>8}")
        lines = [
            ("save (s)", med("save torch"), med("save cairn")),
            ("async stall, first save (s)", rows["stall torch"][0], rows["stall cairn"][0]),
            ("async stall, later saves (s)", med("stall torch", True), med("stall cairn", True)),
            (
                "async stall, after a load (s)",
                med("resumed stall torch"),
                med("resumed stall cairn"),
            ),
            ("async save to committed (s)", med("async total torch"), med("async total cairn")),
            ("load (s)", med("load torch"), med("load cairn")),
        ]
        for name, ref, ours in lines:
            print(f"{name:<34}{ref:>11.3f}{ours:>11.3f}{ref / ours:>8.2f}")
        print(
            f"save MB/s: Lightning {nbytes / 1e6 / med('save torch'):.0f}, "
            f"Cairn {nbytes / 1e6 / med('save cairn'):.0f}"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _tensors(obj: Any) -> list[Any]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    return []


if __name__ == "__main__":
    main()
