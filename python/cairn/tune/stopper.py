"""cairn.tune.stopper: Ray Tune's stoppers, for ``RunConfig(stop=...)``.

A stopper is asked after every result of every trial (on the Tuner's
thread): ``stopper(trial_id, result)`` True stops that trial (TERMINATED),
``stopper.stop_all()`` True ends the experiment (running trials stop,
pending ones never start). ``RunConfig(stop=...)`` takes a dict of
thresholds (saved with the experiment), a :class:`Stopper`, or a function
``(trial_id, result) -> bool``. A stopper is code: ``Tuner.restore`` needs
it again (``stop=``).
"""

from __future__ import annotations

import abc
import collections
import math
import time
from typing import Any, Callable, Optional

from cairn._args import check_public as _check_public


class Stopper(abc.ABC):
    """Ray's ``tune.Stopper``: subclass it and override ``__call__`` (and
    ``stop_all`` to end the whole experiment)."""

    @abc.abstractmethod
    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        """True stops this trial."""

    def stop_all(self) -> bool:
        """True ends the experiment."""
        return False


class NoopStopper(Stopper):
    """Never stops anything."""

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False


class FunctionStopper(Stopper):
    """A function ``(trial_id, result) -> bool`` as a stopper."""

    def __init__(self, function: Callable[[str, dict[str, Any]], bool]) -> None:
        if not callable(function):
            raise TypeError(f"FunctionStopper: a function, not a {type(function).__name__}")
        self._function = function

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return bool(self._function(trial_id, result))


class MaximumIterationStopper(Stopper):
    """Stops a trial after ``max_iter`` results (its ``training_iteration``)."""

    def __init__(self, max_iter: int) -> None:
        self._max_iter = max_iter

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return int(result.get("training_iteration", 0)) >= self._max_iter


class TimeoutStopper(Stopper):
    """Ends the experiment ``timeout`` seconds (or a ``datetime.timedelta``)
    after the stopper was made."""

    def __init__(self, timeout: Any) -> None:
        seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
        if not isinstance(seconds, (int, float)) or seconds <= 0:
            raise ValueError(f"TimeoutStopper: a positive number of seconds, not {timeout!r}")
        self._deadline = time.monotonic() + float(seconds)

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        return time.monotonic() >= self._deadline


class TrialPlateauStopper(Stopper):
    """Stops a trial whose ``metric`` has plateaued: the standard deviation of
    its last ``num_results`` values is at most ``std``, after at least
    ``grace_period`` results, and (with ``metric_threshold``) the last value
    is past that threshold in ``mode``'s direction ("min": at most it,
    "max": at least it)."""

    def __init__(
        self,
        metric: str,
        std: float = 0.01,
        num_results: int = 4,
        grace_period: int = 4,
        metric_threshold: Optional[float] = None,
        mode: Optional[str] = None,
    ) -> None:
        if metric_threshold is not None and mode not in ("min", "max"):
            raise ValueError('TrialPlateauStopper: metric_threshold needs mode "min" or "max"')
        self._metric = metric
        self._std = std
        self._num_results = num_results
        self._grace_period = grace_period
        self._threshold = metric_threshold
        self._mode = mode
        self._seen: dict[str, int] = collections.defaultdict(int)
        self._window: dict[str, collections.deque[float]] = collections.defaultdict(
            lambda: collections.deque(maxlen=self._num_results)
        )

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        value = result.get(self._metric)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            return False
        self._seen[trial_id] += 1
        window = self._window[trial_id]
        window.append(float(value))
        if self._seen[trial_id] < self._grace_period or len(window) < self._num_results:
            return False
        if self._threshold is not None:
            if self._mode == "min" and value > self._threshold:
                return False
            if self._mode == "max" and value < self._threshold:
                return False
        mean = sum(window) / len(window)
        spread = math.sqrt(sum((v - mean) ** 2 for v in window) / len(window))
        return spread <= self._std


class CombinedStopper(Stopper):
    """Stops a trial (or the experiment) when any of ``stoppers`` does."""

    def __init__(self, *stoppers: Stopper) -> None:
        self._stoppers = stoppers

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return any([s(trial_id, result) for s in self._stoppers])  # every one sees the result

    def stop_all(self) -> bool:
        return any(s.stop_all() for s in self._stoppers)


__all__ = [
    "CombinedStopper",
    "FunctionStopper",
    "MaximumIterationStopper",
    "NoopStopper",
    "Stopper",
    "TimeoutStopper",
    "TrialPlateauStopper",
]


# A wrong type in a public call is a TypeError naming the parameter.
_check_public(globals())
