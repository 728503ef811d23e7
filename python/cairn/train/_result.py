"""What a run ends with (Ray Train's Result), read from the C++ Trainer's."""

from __future__ import annotations

import math
import os
from typing import Any, Optional

from cairn import _cairn
from cairn._checkpoint import Checkpoint


class TrainingFailedError(RuntimeError):
    """A run that failed: the rank, the cause and the tail of its stderr
    (a Python worker's traceback included), as the C++ Trainer words it.

    ``fit()`` raises it, as Ray's does, once the restarts ``FailureConfig``
    allows are spent; ``result`` is the run's :class:`Result` (what was
    committed before the failure stays: ``result.checkpoint``).
    """

    def __init__(self, message: str, result: Optional[Result] = None) -> None:
        super().__init__(message)
        self.result = result


class WorkerGroupError(TrainingFailedError):
    """A run whose workers failed (a worker's training function raised, or its
    process died) more often than ``FailureConfig`` allows: what ``fit()``
    raises then, as Ray Train's (V2). A :class:`TrainingFailedError`, so code
    written for either catches it.
    """


class Result:
    """The outcome of ``fit()``, as Ray's ``Result``.

    Attributes:
        metrics: rank 0's last reported metrics (``{}`` if none), with what
            the runtime adds to each round's row (``training_iteration``,
            ``time_total_s``, ``timestamp``, ...).
        checkpoint: the latest committed checkpoint, or None.
        best_checkpoints: the kept checkpoints as (checkpoint, metrics), in
            Ray's order: by ``CheckpointConfig.checkpoint_score_attribute``
            from the worst kept to the best (``best_checkpoints[-1]`` is the
            best), oldest first without one.
        config: the run's configuration, ``{"train_loop_config": ...}`` for
            a Trainer's run (``{}`` without one); a trial's config in a
            ``ResultGrid``.
        path: the experiment's folder (a path or URI).
        error: a :class:`TrainingFailedError` when the run failed or was
            preempted, else None. ``fit()`` raises it when the run failed
            (not when it was preempted: that run ends with its emergency
            checkpoint, to be restored).
        preempted: the run ended on SIGTERM after its emergency checkpoint.
        metrics_history: every report round's row (``result.json``'s lines).
        restores: what each attempt of this ``fit()`` started from, in order:
            ``{"attempt": n, "checkpoint": "checkpoint_000012", "tier": t,
            "world_size": w, "rank_tiers": [...], "damaged": [...]}`` with ``t`` "memory"
            (``CheckpointConfig(memory_tier=...)``), "persistent" or
            "external" (``resume_from_checkpoint``), ``w`` the ranks the
            attempt ran with (an elastic group's vary), and, with the memory
            tier across hosts, by rank "memory" or "peer" (its files came
            from a peer host's replica; otherwise the list is empty);
            ``damaged`` describes each copy in memory that failed its
            checksums and was dropped before the attempt took the next copy.
    """

    def __init__(
        self,
        metrics: Any = None,
        checkpoint: Optional[Checkpoint] = None,
        error: Optional[BaseException] = None,
        path: Optional[str] = None,
        metrics_dataframe: Any = None,
        best_checkpoints: Optional[list[tuple[Checkpoint, dict[str, Any]]]] = None,
    ) -> None:
        """A Result built from its fields, as Ray's ``Result(metrics,
        checkpoint, error, path, metrics_dataframe, best_checkpoints)``; Cairn
        itself builds one from the C++ Trainer's result (passed as
        ``metrics``).

        Raises:
            TypeError: ``metrics`` is neither a dict, None nor the C++ result.
        """
        self._dataframe = metrics_dataframe
        self.metrics: dict[str, Any] = {}
        self.checkpoint: Optional[Checkpoint] = checkpoint
        self.best_checkpoints: list[tuple[Checkpoint, dict[str, Any]]] = []
        self.config: dict[str, Any] = {}
        self.path: str = "" if path is None else os.fspath(path)
        self.error: Optional[BaseException] = error
        self.preempted: bool = False
        self.metrics_history: list[dict[str, Any]] = []
        self.restores: list[dict[str, Any]] = []
        if isinstance(metrics, _cairn.TrainResult):
            self._from_impl(metrics)
            return
        if metrics is not None and not isinstance(metrics, dict):
            raise TypeError(f"Result(metrics): a dict, not {type(metrics).__name__}")
        self.metrics = dict(metrics or {})
        self.best_checkpoints = list(best_checkpoints or [])
        self.metrics_history = [self.metrics] if self.metrics else []

    def _from_impl(self, impl: _cairn.TrainResult) -> None:
        self._impl = impl
        history = impl.metrics_history
        # As Ray's: the last round's row, with what the runtime adds to it
        # (training_iteration, time_total_s, timestamp, ...).
        self.metrics = {**(history[-1] if history else {}), **(impl.metrics or {})}
        self.checkpoint = None if impl.checkpoint is None else Checkpoint(impl.checkpoint)
        # The C++ Result lists the best first; Ray's ends with it.
        self.best_checkpoints = [
            (Checkpoint(b.checkpoint), b.metrics) for b in reversed(impl.best_checkpoints)
        ]
        self.path = impl.path
        self.error = None if impl.error is None else TrainingFailedError(impl.error)
        self.preempted = impl.preempted
        self.metrics_history = history
        self.restores = impl.restores

    @classmethod
    def from_path(cls, path: str | os.PathLike[str], storage_filesystem: Any = None) -> Result:
        """The Result of the run stored at ``path`` (an experiment folder or URI).

        ``storage_filesystem``, as Ray's, may be a ``pyarrow.fs``
        LocalFileSystem or S3FileSystem on which ``path`` lies ("bucket/key"
        for S3); only its kind is used (Cairn reads with its own clients).

        Raises:
            cairn.NotFoundError: nothing was run there.
            TypeError: ``storage_filesystem`` is of another kind.
        """
        from cairn._checkpoint import _location

        location = _location(os.fspath(path), storage_filesystem)
        result = cls(_cairn.TrainResult.from_path(location))
        result.config = _saved_config(result.path)
        return result

    def get_best_checkpoint(self, metric: str, mode: str) -> Optional[Checkpoint]:
        """The kept checkpoint whose reported ``metric`` is the best (``mode``
        "max" or "min"), as Ray's; checkpoints reported without it, or with
        NaN, are left out. None when no kept checkpoint has it.

        Raises:
            ValueError: ``mode`` is neither "max" nor "min".
        """
        if mode not in ("max", "min"):
            raise ValueError(f'mode must be "max" or "min", not {mode!r}')
        best: Optional[tuple[float, Checkpoint]] = None
        for checkpoint, metrics in self.best_checkpoints:
            value = _flat(metrics).get(metric)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if math.isnan(value):
                continue
            score = value if mode == "max" else -value
            if best is None or score > best[0]:
                best = (score, checkpoint)
        return None if best is None else best[1]

    @property
    def metrics_dataframe(self) -> Any:
        """``metrics_history`` as a ``pandas.DataFrame`` (needs pandas), or the
        one given to the constructor."""
        if self._dataframe is not None:
            return self._dataframe
        try:
            import pandas
        except ImportError as e:
            raise ImportError(
                "Result.metrics_dataframe needs pandas "
                "(apt-get install python3-pandas); metrics_history has the rows"
            ) from e
        return pandas.json_normalize(self.metrics_history, sep="/")

    def __repr__(self) -> str:
        return (
            f"Result(metrics={self.metrics!r}, path={self.path!r}, "
            f"checkpoint={self.checkpoint!r}, error={self.error!r})"
        )


def _flat(metrics: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested metrics as "a/b" keys, as Ray names a nested metric."""
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        out[name] = value
        if isinstance(value, dict):
            out.update(_flat(value, name + "/"))
    return out


def _saved_config(path: str) -> dict[str, Any]:
    """The configuration stored with the run at ``path``: a Tuner trial's
    ``params.json``, or a Trainer run's ``train_loop_config`` (as
    ``{"train_loop_config": ...}``); ``{}`` when neither was stored (a
    configuration that is not JSON is not)."""
    import json

    from cairn.errors import Error

    folder = _cairn.Checkpoint.from_directory(path)
    try:
        params = json.loads(folder.read_file("params.json"))
        return params if isinstance(params, dict) else {}
    except (Error, ValueError):
        pass  # not a trial
    try:
        state = json.loads(folder.read_file("trainer_state.json"))
    except (Error, ValueError):
        return {}
    config = state.get("train_loop_config") if isinstance(state, dict) else None
    return {} if config is None else {"train_loop_config": config}
