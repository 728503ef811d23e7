"""What a training function calls inside a worker: report, get_checkpoint, get_context."""

from __future__ import annotations

from typing import Any, Callable, Optional

from cairn import _cairn
from cairn._checkpoint import Checkpoint

# The Trainer's ``metadata`` argument and the run's resources (Ray's
# trial resources), set in each worker (a fork) before the training
# function runs.
_metadata: dict[str, Any] = {}
_resources: dict[str, float] = {"CPU": 1.0, "GPU": 0.0}

# A framework trainer's say in which ranks' checkpoint files are uploaded
# (set in a worker by its set-up, before the training function runs): given
# the checkpoint passed to report(), it returns the one to upload (None: this
# rank contributes no files) and what to run once the round has returned.
CheckpointFilter = Callable[
    [Checkpoint], "tuple[Optional[Checkpoint], Optional[Callable[[], None]]]"
]
_checkpoint_filter: Optional[CheckpointFilter] = None


class TrainContext:
    """This worker's place in the run (``train.get_context()``), as Ray's.

    Ranks: ``world_rank`` in ``[0, world_size)``; ``local_rank`` among the
    workers on this node; ``node_rank`` the node's index. ``attempt`` counts
    group restarts (0 for the first start).
    """

    def __init__(self, values: dict[str, Any]) -> None:
        self._values = values

    def get_world_rank(self) -> int:
        return int(self._values["world_rank"])

    def get_world_size(self) -> int:
        return int(self._values["world_size"])

    def get_local_rank(self) -> int:
        return int(self._values["local_rank"])

    def get_local_world_size(self) -> int:
        return int(self._values["local_world_size"])

    def get_node_rank(self) -> int:
        return int(self._values["node_rank"])

    def get_experiment_name(self) -> str:
        """The experiment's name: the Tuner's experiment in a trial (as
        Ray's), else the run's ``RunConfig.name``."""
        tune_experiment = _cairn.train_environment_value("CAIRN_TUNE_EXPERIMENT")
        if tune_experiment:
            return tune_experiment.rstrip("/").rsplit("/", 1)[-1]
        return str(self._values["experiment_name"])

    def get_trial_id(self) -> str:
        """The trial's id in a Tuner (``trial_00003``, as in ``ResultGrid``);
        outside one, the run's name (Ray runs a Trainer as one trial)."""
        return _cairn.train_environment_value("CAIRN_TRIAL_ID") or str(
            self._values["experiment_name"]
        )

    def get_trial_name(self) -> str:
        """The trial's name: its id (its folder's name), as :meth:`get_trial_id`."""
        return self.get_trial_id()

    def get_trial_resources(self) -> dict[str, float]:
        """The trial's resources, as Ray's dict: in a Tuner what
        ``with_resources`` asked for (CPUs, else one per worker; GPUs); in a
        Trainer's run one CPU per worker, and one GPU per worker with
        ``ScalingConfig(use_gpu=True)``."""
        tuned = _cairn.train_environment_value("CAIRN_TRIAL_RESOURCES")
        if tuned:
            import json

            return {k: float(v) for k, v in json.loads(tuned).items()}
        return dict(_resources)

    def get_metadata(self) -> dict[str, Any]:
        """The ``metadata`` dict given to the Trainer (``{}`` without one)."""
        return dict(_metadata)

    def get_storage(self) -> str:
        """The run's storage path (as resolved: absolute, or a URI)."""
        return str(self._values["storage_path"])

    def get_trial_dir(self) -> str:
        """The experiment's folder: storage path / experiment name."""
        return str(self._values["experiment_path"])

    @property
    def attempt(self) -> int:
        return int(self._values["attempt"])

    def __repr__(self) -> str:
        return f"TrainContext({self._values!r})"


def report(
    metrics: dict[str, Any],
    checkpoint: Optional[Checkpoint] = None,
    *,
    async_report: bool = False,
    max_in_flight: int = 1,
) -> None:
    """Reports this round's metrics, and a checkpoint, from every worker.

    Collective, as in Ray: every rank calls it the same number of times.
    Metrics come from rank 0 (the others' are ignored). Each rank that passes
    a checkpoint (a directory, or :meth:`Checkpoint.from_dict`) uploads its
    files into one new checkpoint of the run, which the driver commits
    (manifest last) once every rank's files are durable; ``report`` returns
    after that commit, so a reported checkpoint is durable when it returns.
    The directory may be deleted once it returns.

    With ``async_report`` the checkpoint is frozen (hard links or a copy)
    and the round goes on in the background: ``report`` returns at once,
    up to ``max_in_flight`` rounds may be pending; :func:`wait_for_reports`
    waits for them.

    Raises:
        cairn.Error: outside a worker (FailedPreconditionError), or the group
            is stopping because another rank failed.
        TypeError: metrics that are not JSON values.
    """
    after: Optional[Callable[[], None]] = None
    if checkpoint is not None and _checkpoint_filter is not None:
        checkpoint, after = _checkpoint_filter(checkpoint)
    try:
        _cairn.train_report(
            metrics,
            None if checkpoint is None else checkpoint._impl,
            bool(async_report),
            int(max_in_flight),
        )
    finally:
        if after is not None:
            after()


def get_checkpoint() -> Optional[Checkpoint]:
    """The checkpoint to resume from, or None on a fresh start.

    After a restart (``FailureConfig.max_failures``) the latest committed
    checkpoint of the run; on the first start the one given as
    ``resume_from_checkpoint``, or that of a restored run.
    """
    impl = _cairn.train_get_checkpoint()
    return None if impl is None else Checkpoint(impl)


def get_context() -> TrainContext:
    """This worker's ranks, sizes and experiment (see :class:`TrainContext`)."""
    return TrainContext(_cairn.train_get_context())


def should_checkpoint() -> bool:
    """True once the run is being preempted (SIGTERM): report a checkpoint now.

    It turns true after the same report on every rank.
    """
    return bool(_cairn.train_should_checkpoint())


def wait_for_reports() -> None:
    """Waits until every asynchronous report of this worker is committed."""
    _cairn.train_wait_for_reports()
