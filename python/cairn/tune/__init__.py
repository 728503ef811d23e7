"""cairn.tune: Ray Tune's API over Cairn's C++ Tuner.

A Ray Tune script runs with only its imports changed::

    from cairn import tune
    from cairn.tune.schedulers import ASHAScheduler

    def trainable(config):
        for step in range(100):
            tune.report({"loss": (config["lr"] - 0.01) ** 2 / (step + 1)})

    results = tune.Tuner(trainable,
                         param_space={"lr": tune.loguniform(1e-4, 1e-1)},
                         tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=8,
                                                     scheduler=ASHAScheduler(max_t=100)),
                         run_config=tune.RunConfig(name="search",
                                                   storage_path="/tmp/results")).fit()
    print(results.get_best_result().config)

Each trial is a run of Cairn's Trainer in processes of its own; the
experiment's state is saved as it goes, so ``Tuner.restore`` continues after
a crash of the driver (docs/python.md, "Tuning").
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable, Sequence
from typing import Any, Callable

from cairn import _cairn
from cairn._args import check_public as _check_public
from cairn._checkpoint import Checkpoint
from cairn._manager import CheckpointConfig
from cairn.errors import Error as TuneError
from cairn.train._config import FailureConfig, RunConfig, ScalingConfig, SyncConfig
from cairn.train._result import Result
from cairn.train._session import get_checkpoint, get_context, report

# As after ``from ray import tune``: tune.result.SHOULD_CHECKPOINT,
# tune.schedulers.ASHAScheduler.
from cairn.tune import result, schedulers, stopper
from cairn.tune._callback import Callback
from cairn.tune._space import SampleFrom
from cairn.tune._trainable import Trainable
from cairn.tune._tuner import ResultGrid, TuneConfig, Tuner, with_resources
from cairn.tune.stopper import Stopper


def grid_search(values: Iterable[Any]) -> dict[str, Any]:
    """Every value, one trial each (times ``num_samples``)."""
    return _cairn.tune_grid_search(list(values))


def choice(categories: Sequence[Any]) -> dict[str, Any]:
    """One of ``categories``, drawn uniformly per trial."""
    return _cairn.tune_choice(list(categories))


def uniform(lower: float, upper: float) -> dict[str, Any]:
    """A float drawn uniformly from [lower, upper)."""
    return _cairn.tune_uniform(float(lower), float(upper))


def loguniform(lower: float, upper: float) -> dict[str, Any]:
    """A float drawn uniformly in log space from [lower, upper)."""
    return _cairn.tune_loguniform(float(lower), float(upper))


def randint(lower: int, upper: int) -> dict[str, Any]:
    """An int drawn uniformly from [lower, upper)."""
    return _cairn.tune_randint(int(lower), int(upper))


def quniform(lower: float, upper: float, q: float) -> dict[str, Any]:
    """A float drawn uniformly from [lower, upper], rounded to a multiple of q."""
    return _cairn.tune_quniform(float(lower), float(upper), float(q))


def qloguniform(lower: float, upper: float, q: float, base: float = 10) -> dict[str, Any]:
    """A float drawn log-uniformly from [lower, upper], rounded to a multiple
    of q (``base`` changes nothing: the draw is uniform in any log)."""
    del base
    return _cairn.tune_qloguniform(float(lower), float(upper), float(q))


def qrandint(lower: int, upper: int, q: int = 1) -> dict[str, Any]:
    """A multiple of q in [lower, upper] (upper included, as Ray's)."""
    return _cairn.tune_qrandint(int(lower), int(upper), int(q))


def lograndint(lower: int, upper: int, base: float = 10) -> dict[str, Any]:
    """An int drawn log-uniformly from [lower, upper) (``base`` changes nothing)."""
    del base
    return _cairn.tune_lograndint(int(lower), int(upper))


def qlograndint(lower: int, upper: int, q: int, base: float = 10) -> dict[str, Any]:
    """An int drawn log-uniformly from [lower, upper], rounded to a multiple of q."""
    del base
    return _cairn.tune_qlograndint(int(lower), int(upper), int(q))


def randn(mean: float = 0.0, sd: float = 1.0) -> dict[str, Any]:
    """A float from the normal distribution N(mean, sd**2)."""
    return _cairn.tune_randn(float(mean), float(sd))


def qrandn(mean: float, sd: float, q: float) -> dict[str, Any]:
    """A normal draw rounded to a multiple of q."""
    return _cairn.tune_qrandn(float(mean), float(sd), float(q))


def sample_from(func: Callable[..., Any]) -> SampleFrom:
    """A value computed per trial by ``func``, as Ray's ``tune.sample_from``.

    ``func(spec)`` sees ``spec.config`` (or ``spec["config"]``): the trial's
    configuration with its grid and random values in place; ``func()``
    without a parameter is called as it is. It runs in the Tuner's process,
    once per trial, when the trial is created; its value (JSON-able: numbers,
    strings, lists, dicts, numpy scalars and arrays) is the trial's, saved
    with the experiment. A function that reads another ``sample_from`` value
    is called again after that one is computed; functions that wait for each
    other, or one that raises, end ``fit()`` with cairn.InvalidArgumentError
    naming the key. ``Tuner.restore`` needs the functions again (pass the
    same ``param_space``) while trials remain to be created.
    """
    return SampleFrom(func)


def with_parameters(trainable: Any, **kwargs: Any) -> Any:
    """``trainable`` with extra arguments, as Ray's ``tune.with_parameters``.

    A function trainable is called as ``trainable(config, **kwargs)``; a
    :class:`Trainable` subclass gets them in ``setup(config, **kwargs)``.
    The objects are passed as they are: trials are forks of this process,
    so nothing is copied into an object store or pickled.
    """
    if inspect.isclass(trainable):
        if not issubclass(trainable, Trainable):
            raise TypeError(
                f"with_parameters: {trainable.__name__} does not subclass cairn.tune.Trainable"
            )
        base = trainable

        def setup(self: Any, config: dict[str, Any], **more: Any) -> Any:
            return base.setup(self, config, **{**kwargs, **more})

        return type(
            base.__name__,
            (base,),
            {"setup": setup, "__module__": base.__module__, "__qualname__": base.__qualname__},
        )
    if not callable(trainable):
        raise TypeError(
            f"with_parameters: a function or a Trainable subclass, not a {type(trainable).__name__}"
        )

    @functools.wraps(trainable)
    def inner(config: dict[str, Any]) -> Any:
        return trainable(config, **kwargs)

    return inner


__all__ = [
    "Callback",
    "Checkpoint",
    "CheckpointConfig",
    "FailureConfig",
    "Result",
    "ResultGrid",
    "RunConfig",
    "SampleFrom",
    "ScalingConfig",
    "Trainable",
    "TuneConfig",
    "Tuner",
    "choice",
    "get_checkpoint",
    "get_context",
    "grid_search",
    "loguniform",
    "lograndint",
    "qloguniform",
    "qlograndint",
    "qrandint",
    "qrandn",
    "quniform",
    "randint",
    "randn",
    "report",
    "result",
    "sample_from",
    "schedulers",
    "Stopper",
    "stopper",
    "SyncConfig",
    "TuneError",
    "uniform",
    "with_parameters",
    "with_resources",
]


# A wrong type in a public call is a TypeError naming the parameter.
_check_public(globals())
