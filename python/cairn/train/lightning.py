"""Ray Train's Lightning names for Cairn's Trainer (``ray.train.lightning``).

A Lightning script written for Ray Train runs under
:class:`cairn.train.torch.TorchTrainer` with its imports changed::

    from cairn.train.lightning import (
        RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback, prepare_trainer,
    )

    trainer = pl.Trainer(
        devices="auto", accelerator="auto", strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()], callbacks=[RayTrainReportCallback()],
        enable_checkpointing=False,
    )
    trainer = prepare_trainer(trainer)

- :class:`RayDDPStrategy` is Lightning's ``DDPStrategy`` on the worker's
  device (:func:`cairn.train.torch.get_device`), over the process group the
  Trainer already started (Gloo, or NCCL with ``use_gpu``), its sampler split
  by the group's world size and rank.
- :class:`RayLightningEnvironment` gives Lightning the ranks and sizes of
  :func:`cairn.train.get_context`; Lightning cannot change them.
- :func:`prepare_trainer` checks that a ``pl.Trainer`` uses both.
- :class:`RayTrainReportCallback` saves ``checkpoint.ckpt`` with
  ``trainer.save_checkpoint`` at the end of every training epoch and reports
  it with the epoch's ``callback_metrics`` (plus ``epoch`` and ``step``)
  through :func:`cairn.train.report`, which commits it manifest-last: a run
  restarted after a failure finds it with :func:`cairn.train.get_checkpoint`.

Ray's ``RayFSDPStrategy`` and ``RayDeepSpeedStrategy`` are names whose
construction raises ``NotImplementedError``, as do the callback's Ray Train v2
arguments ``checkpoint_upload_mode`` and ``validation``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.plugins.environments import LightningEnvironment
from lightning.pytorch.strategies import DDPStrategy

from cairn._args import check_public as _check_public
from cairn._checkpoint import Checkpoint
from cairn.train._session import get_context, report


class RayDDPStrategy(DDPStrategy):
    """Lightning's ``DDPStrategy`` for a :class:`~cairn.train.torch.TorchTrainer` worker.

    Takes ``DDPStrategy``'s arguments. The process group is the one the
    Trainer set up before the training function ran (``TorchConfig`` chooses
    its backend and timeout), so Lightning does not start another; the root
    device is :func:`cairn.train.torch.get_device`.
    """

    @property
    def root_device(self) -> Any:
        from cairn.train.torch import get_device

        return get_device()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}


class RayLightningEnvironment(LightningEnvironment):
    """Lightning's cluster environment with the ranks of :func:`cairn.train.get_context`."""

    def world_size(self) -> int:
        return get_context().get_world_size()

    def global_rank(self) -> int:
        return get_context().get_world_rank()

    def local_rank(self) -> int:
        return get_context().get_local_rank()

    def node_rank(self) -> int:
        return get_context().get_node_rank()

    def set_world_size(self, size: int) -> None:
        """Ignored: the world size is the Trainer's."""

    def set_global_rank(self, rank: int) -> None:
        """Ignored: the rank is the Trainer's."""

    def teardown(self) -> None:
        """Nothing to undo: the Trainer owns the process group."""


def prepare_trainer(trainer: Any) -> Any:
    """Checks that ``trainer`` (a ``pl.Trainer``) runs on Cairn's workers; returns it.

    Raises:
        RuntimeError: the strategy is not a :class:`RayDDPStrategy`, or the
            cluster environment not a :class:`RayLightningEnvironment`
            (naming the class found), as Ray's ``prepare_trainer`` does.
    """
    if not isinstance(trainer.strategy, RayDDPStrategy):
        raise RuntimeError(
            f"Invalid strategy class: {type(trainer.strategy)}. To use PyTorch Lightning "
            "with cairn.train, the strategy object should be a RayDDPStrategy or a subclass "
            "(Cairn has no RayFSDPStrategy or RayDeepSpeedStrategy)."
        )
    environment = getattr(trainer.strategy, "cluster_environment", None)
    if environment is not None and not isinstance(environment, RayLightningEnvironment):
        raise RuntimeError(
            "Invalid cluster environment plugin. The expected class is "
            f"`cairn.train.lightning.RayLightningEnvironment` but got {type(environment)}!"
        )
    return trainer


class RayTrainReportCallback(pl.callbacks.Callback):
    """Reports a Lightning checkpoint and the epoch's metrics at every training epoch's end.

    Each report's checkpoint is a folder holding ``checkpoint.ckpt``
    (:attr:`CHECKPOINT_NAME`), written by ``trainer.save_checkpoint`` (the
    trainer's ``CheckpointIO``; global rank 0 writes it, the other ranks report
    an empty folder, as in Ray). Metrics are ``trainer.callback_metrics`` as
    Python numbers, plus ``epoch`` and ``step``. The report is collective and
    the checkpoint committed when it returns; the local copy is then removed.

    Raises:
        NotImplementedError: ``checkpoint_upload_mode`` or ``validation``
            (Ray Train v2's arguments) given.
    """

    CHECKPOINT_NAME = "checkpoint.ckpt"

    def __init__(self, checkpoint_upload_mode: Any = None, validation: bool = False) -> None:
        super().__init__()
        if checkpoint_upload_mode is not None or validation:
            raise NotImplementedError(
                "RayTrainReportCallback(checkpoint_upload_mode=..., validation=...): "
                "Ray Train v2's arguments; cairn.train commits each report before it returns"
            )
        context = get_context()
        self.tmpdir_prefix = os.path.join(
            tempfile.gettempdir(),
            f"lightning_checkpoints-name={context.get_experiment_name()}"
            f"-world_rank={context.get_world_rank()}-pid={os.getpid()}",
        )
        if os.path.isdir(self.tmpdir_prefix):
            shutil.rmtree(self.tmpdir_prefix)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        tmpdir = os.path.join(self.tmpdir_prefix, str(trainer.current_epoch))
        os.makedirs(tmpdir, exist_ok=True)
        metrics = {k: v.item() for k, v in trainer.callback_metrics.items()}
        metrics["epoch"] = trainer.current_epoch
        metrics["step"] = trainer.global_step
        trainer.save_checkpoint(os.path.join(tmpdir, self.CHECKPOINT_NAME), weights_only=False)
        report(metrics, checkpoint=Checkpoint.from_directory(tmpdir))
        trainer.strategy.barrier()
        shutil.rmtree(tmpdir)


class RayFSDPStrategy:
    """Ray's FSDP strategy for Lightning: not in Cairn (``NotImplementedError``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "cairn.train.lightning.RayFSDPStrategy: Cairn runs Lightning with RayDDPStrategy only"
        )


class RayDeepSpeedStrategy:
    """Ray's DeepSpeed strategy for Lightning: not in Cairn (``NotImplementedError``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "cairn.train.lightning.RayDeepSpeedStrategy: Cairn runs Lightning with "
            "RayDDPStrategy only"
        )


__all__ = [
    "RayDDPStrategy",
    "RayLightningEnvironment",
    "RayTrainReportCallback",
    "prepare_trainer",
    "RayFSDPStrategy",
    "RayDeepSpeedStrategy",
]

# A wrong type in a public call is a TypeError naming the parameter.
_check_public(globals())
