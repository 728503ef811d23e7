"""A tiny, deterministic Lightning fit through Cairn's CheckpointIO plugins.

Imported by test_lightning.py (``fit`` in the test's process) and run as a
child process by its crash test:

    python lightning_fit.py PLUGIN DIRPATH EPOCHS OUT [resume]

PLUGIN is ``sync`` or ``async``; the fit checkpoints every epoch into DIRPATH
(top 2 by ``val_loss`` and ``last.ckpt``), resumes from ``last.ckpt`` when
``resume`` is given, prints ``saving <n>`` before each save reaches the
plugin (a parent waits for it to kill the fit mid-save), and writes the final
model and optimizer state to OUT with ``torch.save``.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Optional

import lightning.pytorch as pl
from cairn.lightning import AsyncCairnCheckpointIO, CairnCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint

import torch

# The weights (1 MiB, 3 MiB with Adam's state) are big enough for a save to
# take a while, so that a kill lands inside one.
WIDTH = 512
STEPS_PER_EPOCH = 4


class TinyModule(pl.LightningModule):
    """Three linear layers on fixed data; Adam; logs train_loss and val_loss."""

    def __init__(self, width: int = WIDTH, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, 1),
        )
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(8 * STEPS_PER_EPOCH, 16, generator=g)
        self.y = torch.randn(8 * STEPS_PER_EPOCH, 1, generator=g)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)

    def _loader(self) -> Any:
        data = torch.utils.data.TensorDataset(self.x, self.y)
        return torch.utils.data.DataLoader(data, batch_size=8, shuffle=False)

    def train_dataloader(self) -> Any:
        return self._loader()

    def val_dataloader(self) -> Any:
        return self._loader()


class Announcing:
    """Wraps a plugin's save to print ``saving <n>`` first (flushed)."""

    def __init__(self, plugin: Any) -> None:
        self.count = 0
        inner = plugin.save_checkpoint

        def save(checkpoint: Any, path: Any, storage_options: Any = None) -> None:
            self.count += 1
            print(f"saving {self.count} {os.path.basename(str(path))}", flush=True)
            inner(checkpoint, path, storage_options)

        plugin.save_checkpoint = save


def make_plugin(kind: str) -> Any:
    return AsyncCairnCheckpointIO() if kind == "async" else CairnCheckpointIO()


def fit(
    plugin: Any,
    dirpath: str,
    epochs: int,
    *,
    ckpt_path: Optional[str] = None,
    checkpoint: Optional[ModelCheckpoint] = None,
    width: int = WIDTH,
) -> tuple[pl.Trainer, TinyModule]:
    """Fits TinyModule for ``epochs`` epochs, deterministically, with ``plugin``."""
    pl.seed_everything(0, verbose=False)
    model = TinyModule(width)
    if checkpoint is None:
        checkpoint = ModelCheckpoint(
            dirpath=dirpath, monitor="val_loss", save_top_k=2, save_last=True
        )
    trainer = pl.Trainer(
        max_epochs=epochs,
        deterministic=True,
        accelerator="cpu",
        devices=1,
        plugins=[plugin],
        callbacks=[checkpoint],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=dirpath,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers and log intervals
        trainer.fit(model, ckpt_path=ckpt_path)
    return trainer, model


def final_state(trainer: pl.Trainer, model: TinyModule) -> dict[str, Any]:
    """What must be equal bit for bit between two fits: weights and Adam's state."""
    return {
        "model": {k: v.clone() for k, v in model.state_dict().items()},
        "optimizer": trainer.optimizers[0].state_dict(),
        "global_step": trainer.global_step,
    }


def main(argv: list[str]) -> None:
    kind, dirpath, epochs, out = argv[1], argv[2], int(argv[3]), argv[4]
    resume = len(argv) > 5 and argv[5] == "resume"
    plugin = make_plugin(kind)
    Announcing(plugin)
    trainer, model = fit(plugin, dirpath, epochs, ckpt_path="last" if resume else None)
    torch.save(final_state(trainer, model), out)
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv)
