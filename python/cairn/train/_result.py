"""What a run ends with (Ray Train's Result), read from the C++ Trainer's."""

from __future__ import annotations

import os
from typing import Any, Optional

from cairn import _cairn
from cairn._checkpoint import Checkpoint


class TrainingFailedError(RuntimeError):
    """A run that failed: the rank, the cause and the tail of its stderr
    (a Python worker's traceback included), as the C++ Trainer words it."""


class Result:
    """The outcome of ``fit()``, as Ray's ``Result``.

    Attributes:
        metrics: rank 0's last reported metrics (``{}`` if none), with what
            the runtime adds to each round's row (``training_iteration``,
            ``time_total_s``, ``timestamp``, ...).
        checkpoint: the latest committed checkpoint, or None.
        best_checkpoints: the kept checkpoints as (checkpoint, metrics),
            best first by ``CheckpointConfig.checkpoint_score_attribute``
            (newest first without one).
        path: the experiment's folder (a path or URI).
        error: a :class:`TrainingFailedError` when the run failed or was
            preempted, else None. ``fit()`` does not raise it.
        preempted: the run ended on SIGTERM after its emergency checkpoint.
        metrics_history: every report round's row (``result.json``'s lines).
        restores: what each attempt of this ``fit()`` started from, in order:
            ``{"attempt": n, "checkpoint": "checkpoint_000012", "tier": t,
            "world_size": w}`` with ``t`` "memory"
            (``CheckpointConfig(memory_tier=...)``), "persistent" or
            "external" (``resume_from_checkpoint``), and ``w`` the ranks the
            attempt ran with (an elastic group's vary).
    """

    def __init__(self, impl: _cairn.TrainResult) -> None:
        self._impl = impl
        history = impl.metrics_history
        # As Ray's: the last round's row, with what the runtime adds to it
        # (training_iteration, time_total_s, timestamp, ...).
        self.metrics: dict[str, Any] = {**(history[-1] if history else {}),
                                        **(impl.metrics or {})}
        self.checkpoint: Optional[Checkpoint] = (
            None if impl.checkpoint is None else Checkpoint(impl.checkpoint))
        self.best_checkpoints: list[tuple[Checkpoint, dict[str, Any]]] = [
            (Checkpoint(b.checkpoint), b.metrics) for b in impl.best_checkpoints]
        self.path: str = impl.path
        self.error: Optional[TrainingFailedError] = (
            None if impl.error is None else TrainingFailedError(impl.error))
        self.preempted: bool = impl.preempted
        self.metrics_history: list[dict[str, Any]] = history
        self.restores: list[dict[str, Any]] = impl.restores

    @classmethod
    def from_path(cls, path: str | os.PathLike[str]) -> "Result":
        """The Result of the run stored at ``path`` (an experiment folder or URI).

        Raises:
            cairn.NotFoundError: nothing was run there.
        """
        return cls(_cairn.TrainResult.from_path(path))

    @property
    def metrics_dataframe(self) -> Any:
        """``metrics_history`` as a ``pandas.DataFrame`` (needs pandas)."""
        try:
            import pandas
        except ImportError as e:
            raise ImportError("Result.metrics_dataframe needs pandas "
                              "(apt-get install python3-pandas); metrics_history has the rows"
                              ) from e
        return pandas.json_normalize(self.metrics_history, sep="/")

    def __repr__(self) -> str:
        return (f"Result(metrics={self.metrics!r}, path={self.path!r}, "
                f"checkpoint={self.checkpoint!r}, error={self.error!r})")
