"""The transformers ``Trainer`` inside a :class:`cairn.train.torch.TorchTrainer`
worker, as Ray's ``ray.train.huggingface.transformers``.

- :class:`RayTrainReportCallback`: each checkpoint the ``Trainer`` saves
  becomes a :func:`cairn.train.report`, with the metrics of its log history
  and the checkpoint folder under ``checkpoint/`` in the reported checkpoint.
- :func:`prepare_trainer`: checks the ``Trainer`` for a Cairn worker.

Resume a run from a reported checkpoint as with Ray::

    ckpt = cairn.train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            trainer.train(resume_from_checkpoint=os.path.join(d, "checkpoint"))
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from typing import Any

from cairn._args import check_public as _check_public
from cairn._checkpoint import Checkpoint
from cairn.train._session import report

try:
    from transformers.trainer_callback import TrainerCallback as _Base
except ImportError:  # without transformers the names exist and say so when used
    _Base = object

__all__ = ["RayTrainReportCallback", "prepare_trainer"]

# transformers' per-rank random state files in a checkpoint folder.
_RNG_FILE = re.compile(r"rng_state_(\d+)\.pth")


def _transformers() -> Any:
    try:
        import transformers
        import transformers.trainer
    except ImportError as exc:
        raise ImportError(
            "cairn.train.huggingface.transformers needs the transformers package"
        ) from exc
    return transformers


def _own_files(folder: str, rank: int) -> list[str]:
    """The files of a Trainer checkpoint folder this rank reports.

    Rank 0 reports everything but the other ranks' random states; every
    other rank its own random state file (``rng_state_<rank>.pth``), so the
    ranks' files never collide in the one checkpoint they make together.
    """
    names = []
    for root, _, files in os.walk(folder):
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), folder)
            m = _RNG_FILE.fullmatch(rel)
            if (rank == 0 and (m is None or int(m.group(1)) == 0)) or (
                m is not None and int(m.group(1)) == rank and rank != 0
            ):
                names.append(rel)
    return sorted(names)


class RayTrainReportCallback(_Base):  # type: ignore[misc, valid-type]
    """Reports each checkpoint the transformers ``Trainer`` saves to :mod:`cairn.train`.

    ``on_save`` (after the ``Trainer`` wrote ``checkpoint-<step>`` in
    ``args.output_dir``) calls :func:`cairn.train.report` on every rank with
    the metrics of ``state.log_history`` merged, oldest first (Ray's rule),
    and the checkpoint folder copied under ``checkpoint/``: rank 0 reports
    its files, each other rank its own ``rng_state_<rank>.pth``. The report
    returns once the checkpoint is committed (durable).

    Configure logging, evaluation and saving so that the metric you rank
    checkpoints by is logged by the time a checkpoint is saved (as Ray says:
    ``eval_strategy == save_strategy``, or ``save_steps`` a multiple of
    ``eval_steps``).
    """

    CHECKPOINT_NAME = "checkpoint"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        transformers = _transformers()
        if not issubclass(type(self), transformers.TrainerCallback):
            raise ImportError("transformers was not importable when this module was loaded")
        super().__init__(*args, **kwargs)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Reports the checkpoint the ``Trainer`` just saved (collective)."""
        transformers = _transformers()
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        metrics: dict[str, Any] = {}
        for log in state.log_history:
            metrics.update(log)
        source = transformers.trainer.get_last_checkpoint(args.output_dir)
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if source is not None:
                names = _own_files(source, rank)
                if names:
                    target = os.path.join(tmp, self.CHECKPOINT_NAME)
                    for rel in names:
                        os.makedirs(os.path.dirname(os.path.join(target, rel)), exist_ok=True)
                        shutil.copy2(os.path.join(source, rel), os.path.join(target, rel))
                    checkpoint = Checkpoint.from_directory(tmp)
            report(metrics, checkpoint=checkpoint)


def prepare_trainer(trainer: Any) -> Any:
    """Readies a transformers ``Trainer`` for a :class:`cairn.train.torch.TorchTrainer` worker.

    The worker's ``torch.distributed`` group and torchrun's variables are
    already set, which the ``Trainer`` picks up (DDP on the group, a
    distributed sampler). Ray's version adapts Ray Data iterables; Cairn has
    no Ray Data, so this checks the ``Trainer`` and returns it unchanged.

    Raises:
        TypeError: ``trainer`` is not a ``transformers.Trainer``.
    """
    transformers = _transformers()
    if not isinstance(trainer, transformers.Trainer):
        raise TypeError(f"trainer: a transformers.Trainer, not a {type(trainer).__name__}")
    return trainer


_check_public(globals())
