"""The run's configuration, with Ray Train's names (ScalingConfig, RunConfig, FailureConfig)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from cairn._manager import CheckpointConfig
from cairn.errors import InvalidArgumentError


@dataclass
class ScalingConfig:
    """How many workers run the training function, and where.

    Args:
        num_workers: worker processes (the ranks), each running
            ``train_loop_per_worker``; or ``(min, max)`` for an elastic group
            (as Ray Train's elastic training): when a launcher's process is
            lost (a node of a torchrun-style launch), the group restarts
            with the ranks that remain, renumbered, down to ``min``; a
            process started again for the lost rank joins at the next
            restart; under ``mpirun`` (which ends the whole job when one
            process dies) a restored run may have any world size in the
            range. ``train.get_context().get_world_size()`` says each
            attempt's size; ``Result.restores`` lists it.
        use_gpu: give each worker a GPU (``LOCAL_RANK``'s) and use NCCL for
            ``torch.distributed``; Gloo on CPU otherwise.
        launcher: ``"auto"`` (MPI when the program runs under ``mpirun``,
            else torchrun-style when ``RANK``, ``WORLD_SIZE``,
            ``MASTER_ADDR`` and ``MASTER_PORT`` are set, else local),
            ``"local"`` (fork the workers on this machine), ``"mpi"`` (one
            worker per MPI process) or ``"env"`` (one worker per process
            started by ``torchrun``, a Kubernetes job or a shell loop; under
            MPI or ``"env"``, ``num_workers`` is the launcher's world size or
            0).
        resources_per_worker, trainer_resources, placement_strategy,
            accelerator_type: accepted for Ray compatibility and ignored
            (Cairn places one worker per process, not per Ray resource).
    """

    num_workers: int | tuple[int, int] = 1
    use_gpu: bool = False
    launcher: str = "auto"
    resources_per_worker: Optional[dict[str, Any]] = None
    trainer_resources: Optional[dict[str, Any]] = None
    placement_strategy: str = "PACK"
    accelerator_type: Optional[str] = None


def worker_range(scaling: ScalingConfig) -> tuple[int, int]:
    """``(min_workers, num_workers)`` for the native Trainer: min 0 for a
    fixed group. Raises InvalidArgumentError for anything but an int or a
    pair of ints."""
    n = scaling.num_workers
    if (
        isinstance(n, tuple)
        and len(n) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) for x in n)
    ):
        return n[0], n[1]
    if isinstance(n, int) and not isinstance(n, bool):
        return 0, n
    raise InvalidArgumentError(
        f"ScalingConfig.num_workers: an int or a (min, max) pair of ints, not {n!r}",
        "invalid_argument",
    )


@dataclass
class FailureConfig:
    """What to do when a worker fails.

    Args:
        max_failures: how many times the whole group restarts from the
            latest committed checkpoint (``train.get_checkpoint()``) after a
            worker fails; 0 never, -1 without limit.
        report_timeout_s: once one rank reports, how long every other rank
            may take to reach the same report before the group fails naming
            the late ranks.
        preemption_grace_s: after SIGTERM, how long the workers have to
            report an emergency checkpoint (``train.should_checkpoint()``).
    """

    max_failures: int = 0
    report_timeout_s: float = 1800.0
    preemption_grace_s: float = 120.0
    # A Tuner's: True ends the experiment at the first trial error (no trial
    # starts after it, running ones stop at their next result), "raise" also
    # raises that error from fit(). A Trainer stops its group at once anyway.
    fail_fast: Any = False


@dataclass
class RunConfig:
    """Where the run's results go and how its checkpoints are kept.

    Args:
        name: the experiment's folder under ``storage_path``; a generated
            ``cairn_train_<date>_<time>.<µs>_<random>`` when empty.
        storage_path: a local path or URI (``s3://bucket/prefix``); the
            environment variable ``CAIRN_STORAGE_PATH``, else
            ``~/cairn_results``, when None.
        checkpoint_config: retention (``num_to_keep``, the score attribute
            and order) as :class:`cairn.CheckpointConfig`.
        failure_config: restarts, see :class:`FailureConfig`.
        resume_existing: run again in an experiment folder that already
            holds a finished run (otherwise that is an error, so that two
            runs never mix their checkpoints by accident).
        storage_filesystem: Ray's pyarrow filesystem for ``storage_path``;
            only None is taken (give an ``s3://`` URI as ``storage_path``:
            Cairn has its own S3 client, docs/s3.md).
        verbose, callbacks, stop, sync_config, log_to_file,
            progress_reporter: accepted for Ray compatibility and ignored by
            the trainer (Cairn writes straight to ``storage_path``: there
            is nothing to sync).
    """

    name: Optional[str] = None
    storage_path: Optional[str | os.PathLike[str]] = None
    checkpoint_config: Optional[CheckpointConfig] = None
    failure_config: Optional[FailureConfig] = None
    resume_existing: bool = False
    verbose: Optional[int] = None
    callbacks: Optional[list[Any]] = None
    stop: Optional[Any] = None
    sync_config: Optional[Any] = None
    storage_filesystem: Optional[Any] = None
    log_to_file: Any = False
    progress_reporter: Optional[Any] = None

    def __post_init__(self) -> None:
        if self.storage_filesystem is not None:
            raise InvalidArgumentError(
                "RunConfig.storage_filesystem: a pyarrow filesystem is not taken; give "
                "storage_path as a local path or an s3://bucket/prefix URI (configured as "
                "aws-cli is)",
                "invalid_argument",
            )

    def _native(self) -> dict[str, Any]:
        """The C++ RunConfig's fields (python/_train.cc)."""
        failure = self.failure_config or FailureConfig()
        return {
            "name": self.name or "",
            "storage_path": "" if self.storage_path is None else os.fspath(self.storage_path),
            "resume_existing": bool(self.resume_existing),
            "checkpoint_config": self.checkpoint_config or CheckpointConfig(),
            "max_failures": int(failure.max_failures),
            "report_timeout_s": float(failure.report_timeout_s),
            "preemption_grace_s": float(failure.preemption_grace_s),
        }


@dataclass
class SyncConfig:
    """Ray's upload settings for results: accepted and ignored. Cairn's
    workers and driver write checkpoints and results straight to
    ``RunConfig.storage_path`` (local or ``s3://``), so nothing is synced
    afterwards."""

    sync_period: int = 300
    sync_timeout: int = 1800
    sync_artifacts: bool = False
    sync_artifacts_on_checkpoint: bool = True
