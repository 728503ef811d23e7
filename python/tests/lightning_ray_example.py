# The Ray Train guide's "lightning restore example" (Checkpointing: restore
# training state, PyTorch Lightning tab), with its imports changed
# (ray -> cairn) and the guide's "..." filled in: a tiny LightningModule and
# data module, and the Trainer arguments of the guide's Lightning quickstart
# (RayDDPStrategy, RayLightningEnvironment, prepare_trainer) for 2 workers.
# `lightning.pytorch` stands for the guide's `pytorch_lightning`: with both
# installed, Ray's callback (and Cairn's) is a `lightning.pytorch` one.
#
# Test hooks, none in the guide: the run's name and storage come from argv
# (NAME STORAGE), rank 1 SIGKILLs itself at the start of epoch
# $CAIRN_EXAMPLE_KILL_AT of the first attempt, and FailureConfig(max_failures=1)
# lets the Trainer restart the group from the latest checkpoint; with
# $CAIRN_EXAMPLE_PLUGIN=cairn the Lightning Trainer saves through
# cairn.lightning.CairnCheckpointIO. Run by test_lightning.py.
import os
import signal
import sys

import lightning.pytorch as pl
from cairn import train
from cairn.train.lightning import (
    RayDDPStrategy,
    RayLightningEnvironment,
    RayTrainReportCallback,
    prepare_trainer,
)
from cairn.train.torch import TorchTrainer

import torch

HOOK_PLUGINS = []
if os.environ.get("CAIRN_EXAMPLE_PLUGIN") == "cairn":
    from cairn.lightning import CairnCheckpointIO

    HOOK_PLUGINS.append(CairnCheckpointIO())


class MyLightningModule(pl.LightningModule):
    def __init__(self, lr=1e-2):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, sync_dist=True)
        return loss

    def on_train_epoch_start(self):
        context = train.get_context()
        kill_at = os.environ.get("CAIRN_EXAMPLE_KILL_AT")
        if (
            kill_at is not None
            and self.current_epoch == int(kill_at)
            and context.attempt == 0
            and context.get_world_rank() == 1
        ):
            os.kill(os.getpid(), signal.SIGKILL)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


class MyLightningDataModule(pl.LightningDataModule):
    def train_dataloader(self):
        g = torch.Generator().manual_seed(3)
        data = torch.utils.data.TensorDataset(
            torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)
        )
        return torch.utils.data.DataLoader(data, batch_size=8)


def train_func():
    pl.seed_everything(0, verbose=False)
    model = MyLightningModule()
    datamodule = MyLightningDataModule()
    trainer = pl.Trainer(
        max_epochs=4,
        devices="auto",
        accelerator="auto",
        strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()] + HOOK_PLUGINS,
        callbacks=[RayTrainReportCallback()],
        enable_checkpointing=False,
        enable_progress_bar=False,
        logger=False,
        deterministic=True,
    )
    trainer = prepare_trainer(trainer)
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as ckpt_dir:
            ckpt_path = os.path.join(ckpt_dir, RayTrainReportCallback.CHECKPOINT_NAME)
            trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    else:
        trainer.fit(model, datamodule=datamodule)


ray_trainer = TorchTrainer(
    train_func,
    scaling_config=train.ScalingConfig(num_workers=2),
    run_config=train.RunConfig(
        name=sys.argv[1],
        storage_path=sys.argv[2],
        checkpoint_config=train.CheckpointConfig(num_to_keep=2),
        failure_config=train.FailureConfig(max_failures=1),
    ),
)
result = ray_trainer.fit()
print("restores", len(result.restores), flush=True)
