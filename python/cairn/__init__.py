"""Cairn: crash-safe checkpoints for distributed training, from Python.

The same C++ core as Cairn's library, CLI, Trainer and Tuner, under the
names a Ray or PyTorch user knows::

    import cairn

    ckpt = cairn.Checkpoint.from_directory("/tmp/my_state")
    with cairn.CheckpointManager("/mnt/ckpt", "exp", cairn.CheckpointConfig(
            num_to_keep=3, checkpoint_score_attribute="val/loss",
            checkpoint_score_order="min")) as manager:
        manager.register_checkpoint({"val": {"loss": 0.3}}, ckpt)
        with manager.latest().checkpoint.as_directory() as path:
            ...

Paths and URIs are those of the C++ API: a local path, ``file://``,
``s3://bucket/prefix``, ``memory://bucket/prefix``. Every failure raises a
:class:`cairn.Error` subclass (see :mod:`cairn.errors`) with the C++ message
unchanged. Calls that do I/O release the GIL, so other Python threads run
while a checkpoint is written or read.
"""

from __future__ import annotations

from cairn import errors
from cairn._args import check_public as _check_public
from cairn._cairn import CUDA, __version__
from cairn._checkpoint import Checkpoint, VerifyProblem
from cairn._manager import (
    CheckpointConfig,
    CheckpointManager,
    CheckpointRecord,
    MemoryTierConfig,
)
from cairn._tensors import flatten_state_dict, load, load_metadata, save
from cairn.errors import (
    AlreadyExistsError,
    CorruptionError,
    Error,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    LockedError,
    NoSpaceError,
    NotFoundError,
    PermissionDeniedError,
    UnavailableError,
)

__all__ = [
    "__version__",
    "CUDA",
    "errors",
    "Checkpoint",
    "VerifyProblem",
    "CheckpointConfig",
    "MemoryTierConfig",
    "CheckpointManager",
    "CheckpointRecord",
    "save",
    "load",
    "load_metadata",
    "flatten_state_dict",
    "Error",
    "AlreadyExistsError",
    "CorruptionError",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "LockedError",
    "NoSpaceError",
    "NotFoundError",
    "PermissionDeniedError",
    "UnavailableError",
]


# A wrong type in a public call is a TypeError naming the parameter.
_check_public(globals())
