"""The Tuner: Ray Tune's fit() and restore over Cairn's C++ Tuner (python/_tune.cc)."""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

from cairn import _cairn
from cairn.errors import InvalidArgumentError
from cairn.train._config import RunConfig, ScalingConfig, worker_range
from cairn.train._result import Result
from cairn.train._trainer import DataParallelTrainer, _worker_main
from cairn.tune._callback import Callback
from cairn.tune._space import split_space
from cairn.tune._trainable import Trainable
from cairn.tune.stopper import FunctionStopper, Stopper


@dataclass
class TuneConfig:
    """How trials are sampled, scheduled and compared, as Ray Tune's.

    Args:
        metric, mode: what ``get_best_result`` and the schedulers rank by
            (``mode`` "max" or "min").
        num_samples: how many times the param space is sampled (each grid
            point that many times).
        max_concurrent_trials: trials running at once; by default as many
            as the cores allow for the trials' workers.
        scheduler: FIFO (default), ASHA or PBT from
            :mod:`cairn.tune.schedulers`.
        seed: the sampling seed (Cairn's: the same seed draws the same
            trials, and a restored experiment draws on where it stopped).
        time_budget_s: seconds after which the experiment ends (every
            fit() of it counted, restores included): no trial starts after
            that and each running trial stops at its next result.
        search_alg, reuse_actors, trial_name_creator,
        trial_dirname_creator, chdir_to_trial_dir: search_alg is refused
            (only the basic variant generator exists); the others are
            accepted and ignored.
    """

    metric: Optional[str] = None
    mode: Optional[str] = None
    num_samples: int = 1
    max_concurrent_trials: Optional[int] = None
    scheduler: Optional[Any] = None
    search_alg: Optional[Any] = None
    seed: int = 0
    reuse_actors: Optional[bool] = None
    time_budget_s: Optional[float] = None
    trial_name_creator: Optional[Callable[..., str]] = None
    trial_dirname_creator: Optional[Callable[..., str]] = None
    chdir_to_trial_dir: Optional[bool] = None

    def _native(
        self,
        stop: Any,
        callbacks: Optional[list[Any]] = None,
        sample_functions: Optional[dict[str, Any]] = None,
        resources: Optional[dict[str, float]] = None,
        fail_fast: Optional[_FailFast] = None,
    ) -> dict[str, Any]:
        if self.search_alg is not None:
            raise InvalidArgumentError(
                "TuneConfig.search_alg: only the default (grid and random sampling of the "
                "param space) is supported",
                "invalid_argument",
            )
        thresholds, stopper = _stop_parts(stop)
        if fail_fast is not None:  # asked after the user's stopper, if any
            fail_fast.inner = stopper
            stopper = fail_fast
            callbacks = list(callbacks or []) + [fail_fast.callback]
        return {
            "metric": self.metric or "",
            "mode": self.mode or "",
            "num_samples": int(self.num_samples),
            "max_concurrent_trials": int(self.max_concurrent_trials or 0),
            "scheduler": self.scheduler,
            "seed": int(self.seed),
            "stop": thresholds,
            "stopper": stopper,
            "time_budget_s": float(self.time_budget_s or 0.0),
            "resources_per_trial": resources or {"cpu": 0.0, "gpu": 0.0},
            "callbacks": _callbacks(callbacks),
            "sample_functions": sample_functions or {},
        }


class _FailFast(Stopper):
    """FailureConfig(fail_fast=...): ends the experiment at the first trial
    error (a callback sees it, this stopper's stop_all() says so). The
    user's own stopper, if any, is ``inner`` and asked as usual; a dict of
    thresholds stays the C++ Tuner's (saved with the experiment)."""

    def __init__(self) -> None:
        self.inner: Optional[Stopper] = None
        self.failed = False
        outer = self

        class Watch(Callback):
            def on_trial_error(
                self, iteration: int, trials: list[Any], trial: Any, **info: Any
            ) -> None:
                outer.failed = True

        self.callback = Watch()

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return self.inner is not None and bool(self.inner(trial_id, result))

    def stop_all(self) -> bool:
        return self.failed or (self.inner is not None and self.inner.stop_all())


def _stop_parts(stop: Any) -> tuple[dict[str, Any], Optional[Stopper]]:
    """RunConfig.stop as (thresholds, stopper): a dict of metric thresholds
    (saved with the experiment), or a Stopper or a function
    ``(trial_id, result) -> bool`` (code)."""
    if stop is None:
        return {}, None
    if isinstance(stop, dict):
        return dict(stop), None
    if isinstance(stop, Stopper):
        return {}, stop
    if callable(stop):
        return {}, FunctionStopper(stop)
    raise InvalidArgumentError(
        "RunConfig.stop: a dict of metric thresholds ({'training_iteration': 10}), a "
        f"cairn.tune.Stopper or a function (trial_id, result) -> bool, not a "
        f"{type(stop).__name__}",
        "invalid_argument",
    )


def _callbacks(callbacks: Optional[list[Any]]) -> list[Callback]:
    for i, cb in enumerate(callbacks or []):
        if not isinstance(cb, Callback):
            raise InvalidArgumentError(
                f"RunConfig.callbacks[{i}]: a cairn.tune.Callback, not a {type(cb).__name__}",
                "invalid_argument",
            )
    return list(callbacks or [])


class ResultGrid:
    """The trials' results (Ray Tune's ResultGrid): ``len``, indexing, best.

    Each item is a :class:`cairn.train.Result` with ``config``,
    ``trial_id`` and ``status`` ("TERMINATED", "ERROR", ...) added.
    """

    def __init__(self, impl: Any, metric: Optional[str], mode: Optional[str]) -> None:
        self._impl = impl
        self._metric = metric
        self._mode = mode
        self._results = [_trial_result(impl[i]) for i in range(len(impl))]

    def __len__(self) -> int:
        return len(self._results)

    def __getitem__(self, i: int) -> Result:
        return self._results[i]

    def __iter__(self) -> Any:
        return iter(self._results)

    @property
    def num_errors(self) -> int:
        return int(self._impl.num_errors)

    @property
    def num_terminated(self) -> int:
        return int(self._impl.num_terminated)

    @property
    def errors(self) -> list[Exception]:
        return [r.error for r in self._results if r.error is not None]

    @property
    def experiment_path(self) -> str:
        return str(self._impl.experiment_path)

    @property
    def preempted(self) -> bool:
        """Whether ``fit()`` ended early on SIGTERM: the running trials were
        paused with a checkpoint where they made one within
        ``FailureConfig.preemption_grace_s``; ``Tuner.restore`` goes on."""
        return bool(self._impl.preempted)

    def get_best_result(
        self,
        metric: Optional[str] = None,
        mode: Optional[str] = None,
        scope: str = "last",
        filter_nan_and_inf: bool = True,
    ) -> Result:
        """The trial with the best ``metric`` (TuneConfig's by default).

        ``scope``: "last" (each trial's last result), "avg", "all" (its best
        result), as Ray's. Raises cairn.NotFoundError when no trial reported
        the metric, naming it.
        """
        del filter_nan_and_inf  # NaN always ranks worst
        best = self._impl.get_best_result(metric or "", mode or "", scope)
        return next(r for r in self._results if r.trial_id == best.trial_id)

    def get_dataframe(
        self, filter_metric: Optional[str] = None, filter_mode: Optional[str] = None
    ) -> Any:
        """One row per trial as a ``pandas.DataFrame`` (needs pandas), as Ray's:
        its last result, or with ``filter_metric`` and ``filter_mode``
        ("max"/"min") its best result by that metric; with ``trial_id`` and
        the trial's config as ``config/<key>`` columns."""
        try:
            import pandas
        except ImportError as e:
            raise ImportError(
                "ResultGrid.get_dataframe needs pandas (apt-get install "
                "python3-pandas); each result's metrics_history has the rows"
            ) from e
        return pandas.json_normalize(self._rows(filter_metric, filter_mode), sep="/")

    def _rows(
        self, filter_metric: Optional[str], filter_mode: Optional[str]
    ) -> list[dict[str, Any]]:
        """get_dataframe's rows, before pandas."""
        if (filter_metric is None) != (filter_mode is None):
            raise ValueError("get_dataframe: give filter_metric and filter_mode together")
        if filter_mode not in (None, "max", "min"):
            raise ValueError(f'filter_mode must be "max" or "min", not {filter_mode!r}')
        rows = []
        for r in self._results:
            row = r.metrics
            if filter_metric is not None:
                scored = [
                    h
                    for h in r.metrics_history
                    if isinstance(h.get(filter_metric), (int, float))
                    and not isinstance(h.get(filter_metric), bool)
                    and h[filter_metric] == h[filter_metric]
                ]  # NaN never best
                if scored:
                    pick = max if filter_mode == "max" else min
                    row = pick(scored, key=lambda h: h[filter_metric])
            rows.append({**row, "trial_id": r.trial_id, "config": dict(r.config)})
        return rows


def _trial_result(impl: Any) -> Result:
    r = Result(impl)
    r.config = impl.config  # type: ignore[attr-defined]
    r.trial_id = impl.trial_id  # type: ignore[attr-defined]
    r.status = impl.status  # type: ignore[attr-defined]
    return r


class _WithResources:
    """A trainable with what each of its trials needs (:func:`with_resources`)."""

    def __init__(self, trainable: Any, resources: dict[str, float]) -> None:
        self.trainable = trainable
        self.resources = resources


def with_resources(trainable: Any, resources: dict[str, float]) -> Any:
    """``trainable`` with the resources each trial needs, as Ray's
    ``tune.with_resources``: ``{"cpu": 2, "gpu": 0.5}``.

    ``cpu`` sets how many trials run at once when ``max_concurrent_trials``
    is not given (the cores divided by it). ``gpu`` is a whole number of
    GPUs, held by that trial alone, or a fraction of one, shared with other
    fractional trials up to a whole; a trial waits until its GPUs are free
    and sees only them (``CUDA_VISIBLE_DEVICES``). The GPUs handed out are
    those of the Tuner's own ``CUDA_VISIBLE_DEVICES``, else the machine's.
    Other keys, or a request no machine here could serve, are
    cairn.InvalidArgumentError naming it.
    """
    if not isinstance(resources, dict):
        raise InvalidArgumentError(
            f"with_resources: a dict such as {{'cpu': 1, 'gpu': 0.5}}, not a "
            f"{type(resources).__name__}",
            "invalid_argument",
        )
    out = {"cpu": 0.0, "gpu": 0.0}
    for key, value in resources.items():
        if key not in out:
            raise InvalidArgumentError(
                f"with_resources: unknown resource {key!r} (cpu and gpu are known)",
                "invalid_argument",
            )
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidArgumentError(
                f"with_resources: {key} must be a number, not {value!r}", "invalid_argument"
            )
        out[key] = float(value)
    return _WithResources(trainable, out)


def _unwrap(trainable: Any) -> tuple[Any, Optional[dict[str, float]]]:
    if isinstance(trainable, _WithResources):
        return trainable.trainable, trainable.resources
    return trainable, None


def _parts(trainable: Any, run: Optional[RunConfig]) -> tuple[Any, Any, ScalingConfig, RunConfig]:
    """(function, class, scaling, run config) for the C++ Tuner. ``run`` is
    the Tuner's RunConfig, None when none was given: as in Ray, a given one
    replaces a TorchTrainer's own, which is used otherwise."""
    if isinstance(trainable, DataParallelTrainer):
        trainer = trainable
        setup = trainer._setup_fn()
        metadata = getattr(trainer, "_metadata", None)
        base = dict(trainer._config or {})

        def fn(config: Any) -> None:
            merged = {**base, **dict((config or {}).get("train_loop_config", {}))}
            _worker_main(trainer._fn, merged, trainer._scaling, setup, metadata)

        return fn, None, trainer._scaling, run if run is not None else trainer._run
    run = run if run is not None else RunConfig()
    if inspect.isclass(trainable):
        if not issubclass(trainable, Trainable):
            raise InvalidArgumentError(
                f"trainable {trainable.__name__}: a class trainable subclasses "
                "cairn.tune.Trainable",
                "invalid_argument",
            )
        return None, trainable, ScalingConfig(), run
    if callable(trainable):
        user = trainable

        def fn(config: Any) -> None:
            _worker_main(user, config, ScalingConfig(), None)

        return fn, None, ScalingConfig(), run
    raise InvalidArgumentError(
        f"trainable: a function, a Trainable subclass or a TorchTrainer, not a "
        f"{type(trainable).__name__}",
        "invalid_argument",
    )


class Tuner:
    """Runs trials of ``trainable`` over ``param_space``, as Ray Tune's Tuner.

    ``trainable`` is a function of the config that calls
    :func:`cairn.tune.report` (each trial one Trainer run of one worker), a
    :class:`Trainable` subclass, or a ``TorchTrainer`` (each trial a run of
    its workers; ``param_space["train_loop_config"]`` is merged over the
    trainer's). Behind it runs Cairn's C++ Tuner: trials in processes of
    their own, checkpoints committed manifest-last, the experiment's state
    in ``tuner_state.json`` so :meth:`restore` goes on after the driver
    itself died. Results go to ``run_config.storage_path/name``.
    """

    def __init__(
        self,
        trainable: Any,
        *,
        param_space: Optional[dict[str, Any]] = None,
        tune_config: Optional[TuneConfig] = None,
        run_config: Optional[RunConfig] = None,
    ) -> None:
        self._tune = tune_config or TuneConfig()
        trainable, resources = _unwrap(trainable)
        fn, cls, scaling, run = _parts(trainable, run_config)
        fail_fast = run.failure_config.fail_fast if run.failure_config is not None else False
        if fail_fast not in (False, True, "raise"):
            raise InvalidArgumentError(
                f'FailureConfig.fail_fast: False, True or "raise", not {fail_fast!r}',
                "invalid_argument",
            )
        self._fail_fast = fail_fast
        space, functions = split_space(param_space or {})
        min_workers, num_workers = worker_range(scaling)
        if min_workers:
            raise InvalidArgumentError(
                "Tuner: ScalingConfig.num_workers as a (min, max) range is for the Trainer; "
                "a trial runs with a fixed number of workers",
                "invalid_argument",
            )
        self._impl: Any = _cairn.Tuner(
            fn,
            cls,
            space,
            self._tune._native(
                run.stop, run.callbacks, functions, resources, _FailFast() if fail_fast else None
            ),
            run._native(),
            num_workers,
            scaling.launcher,
        )

    def fit(self) -> ResultGrid:
        """Runs the experiment to its end; trial failures are in the results.

        The GIL is released meanwhile; Ctrl-C (main thread) stops the trials
        with their checkpoints, then raises KeyboardInterrupt (restorable).
        """
        grid = ResultGrid(self._impl.fit(), self._tune.metric, self._tune.mode)
        self._grid = grid
        if getattr(self, "_fail_fast", False) == "raise" and grid.errors:
            raise grid.errors[0]
        return grid

    def get_results(self) -> ResultGrid:
        """The results, as Ray's: those of the last :meth:`fit`, or for a
        Tuner from :meth:`restore` not yet fit, the experiment's as its
        saved state stands (nothing runs: each trial's status, config and
        error as last saved, its metrics and checkpoints from its folder).

        Raises:
            cairn.FailedPreconditionError: neither fit nor restored.
        """
        grid = getattr(self, "_grid", None)
        if grid is not None:
            return grid
        return ResultGrid(self._impl.get_results(), self._tune.metric, self._tune.mode)

    @classmethod
    def can_restore(cls, path: str | os.PathLike[str]) -> bool:
        """Whether ``path`` holds a Tuner experiment :meth:`restore` can go on with."""
        return bool(_cairn.Tuner.can_restore(path))

    @classmethod
    def restore(
        cls,
        path: str | os.PathLike[str],
        trainable: Any,
        *,
        resume_unfinished: bool = True,
        resume_errored: bool = False,
        restart_errored: bool = False,
        param_space: Optional[dict[str, Any]] = None,
        callbacks: Optional[list[Any]] = None,
        scheduler: Optional[Any] = None,
        stop: Optional[Any] = None,
    ) -> Tuner:
        """The experiment at ``path``, to :meth:`fit` again.

        Finished trials stay finished; unfinished ones resume from their
        latest checkpoint (``resume_unfinished``); errored ones resume
        (``resume_errored``) or start over (``restart_errored``). The
        trainable is needed again (it is code); the param space, config
        and scheduler state are the saved ones: an ASHA or PBT scheduler is
        rebuilt from its saved options. ``param_space`` is read only for its
        ``tune.sample_from`` functions (code too), needed while trials remain
        to be created: give the space the experiment started with.
        ``scheduler`` (Cairn's; Ray pickles it) is needed only for a PBT
        whose ``hyperparam_mutations`` hold functions: the same scheduler
        again, into which the saved state is restored. ``stop``: a
        :class:`Stopper` or function the experiment started with (code, not
        saved); a dict of thresholds is saved and needs nothing.
        """
        _, functions = split_space(param_space or {})
        fn, klass, _, _ = _parts(_unwrap(trainable)[0], RunConfig())  # resources: the saved
        self = cls.__new__(cls)
        self._tune = TuneConfig()
        thresholds, stopper = _stop_parts(stop)
        if thresholds:
            raise InvalidArgumentError(
                "Tuner.restore(stop=...): the experiment's dict of thresholds is saved with it; "
                "give only a Stopper or a function here",
                "invalid_argument",
            )
        self._impl = _cairn.Tuner.restore(
            path,
            fn,
            klass,
            resume_unfinished,
            resume_errored,
            restart_errored,
            scheduler,
            _callbacks(callbacks),
            functions,
            stopper,
        )
        return self
