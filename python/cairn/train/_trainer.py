"""The trainer: Ray Train's fit() over Cairn's C++ Trainer (python/_train.cc)."""

from __future__ import annotations

import inspect
import os
import sys
import traceback
from typing import Any, Callable, Optional

from cairn import _cairn
from cairn._checkpoint import Checkpoint
from cairn.errors import InvalidArgumentError
from cairn.train import _session
from cairn.train._config import RunConfig, ScalingConfig, worker_range
from cairn.train._result import Result, WorkerGroupError, _saved_config
from cairn.train._session import TrainContext, get_context

# Setup for a framework's process group, run in each worker before the
# training function: returns what tears it down (or None).
BackendSetup = Callable[[TrainContext, ScalingConfig], Optional[Callable[[], None]]]


def _takes_config(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: assume it takes the config
        return True
    positional = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ]
    return bool(positional)


def _std_streams_on_fds_1_and_2() -> None:
    """Points sys.stdout and sys.stderr at the worker's fds 1 and 2.

    The runtime closes every inherited descriptor above 2 in a worker and
    sends fd 2 to the driver (which keeps its tail for ``Result.error``); a
    stream the driver had elsewhere (a test runner's capture, a file) would
    write to a closed descriptor.
    """
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        try:
            ok = stream.fileno() == fd
        except (AttributeError, OSError, ValueError):
            ok = False
        if not ok:
            setattr(sys, name, open(fd, "w", buffering=1, closefd=False, errors="backslashreplace"))


# What the C++ runtime sets (or removes) in a forked worker's C environment
# after the interpreter started: torchrun's variables for the worker's group,
# CAIRN_WORKER, TORCHELASTIC_USE_AGENT_STORE (removed: torchrun's store is
# not this group's) and, in a Tuner trial, CUDA_VISIBLE_DEVICES (its GPUs).
_RUNTIME_VARIABLES = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "CAIRN_WORKER",
    "TORCHELASTIC_USE_AGENT_STORE",
    "CUDA_VISIBLE_DEVICES",
)


def _sync_environ() -> None:
    """Tells ``os.environ`` (a copy made at start-up) of the variables the
    runtime set in this worker's C environment since."""
    for name in _RUNTIME_VARIABLES:
        value = _cairn.train_environment_value(name)
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


# The process that imported the package: the driver. A worker or trial
# process with another pid is a fork of it.
_DRIVER_PID = os.getpid()


def _one_torch_thread_in_a_fork() -> None:
    """In a process forked from the driver: torch's intra-op work on one thread.

    torch's CPU wheel runs its intra-op parallelism on GNU OpenMP, whose
    thread team does not survive fork(): in a child of a process that ran a
    parallel region, the next region with more than one thread waits forever
    for threads that were not forked. One thread runs the same work without
    a team. Ray's default is the same (a worker of one CPU gets
    OMP_NUM_THREADS=1). Processes started by mpirun, torchrun or Slurm import
    the package themselves, are no forks, and keep torch's default.
    """
    if os.getpid() == _DRIVER_PID:
        return
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def _worker_main(
    fn: Callable[..., Any],
    config: Any,
    scaling: ScalingConfig,
    setup: Optional[BackendSetup],
    metadata: Optional[dict[str, Any]] = None,
) -> None:
    """What each worker process runs: the rendezvous, then ``fn``.

    A worker is a fork of the driver; ``os.environ`` is told first of the
    variables the runtime set for it (:func:`_sync_environ`). An exception
    is printed with its traceback on the worker's stderr, whose tail the
    driver puts in ``Result.error``, and ends the worker as failed.
    """
    _std_streams_on_fds_1_and_2()
    _one_torch_thread_in_a_fork()
    _session._metadata = dict(metadata or {})
    try:
        context = get_context()
        workers = float(context.get_world_size())
        _session._resources = {"CPU": workers, "GPU": workers if scaling.use_gpu else 0.0}
        _sync_environ()
        teardown = setup(context, scaling) if setup is not None else None
        try:
            if _takes_config(fn):
                fn({} if config is None else config)
            else:
                fn()
        finally:
            if teardown is not None:
                teardown()
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


class DataParallelTrainer:
    """Runs ``train_loop_per_worker`` in ``scaling_config.num_workers`` processes.

    As Ray's: each worker calls :func:`cairn.train.report` with metrics and
    checkpoints; :meth:`fit` returns a :class:`Result` when the run ends.
    Behind it runs Cairn's C++ Trainer: workers forked from this process
    (or one per MPI process under ``mpirun``), a collective report, a
    manifest-last commit of each checkpoint, restarts from the latest
    committed one (``FailureConfig.max_failures``), and the run's state in
    the experiment folder so that :meth:`restore` goes on after the driver
    itself died.

    ``train_loop_config`` is handed to the function as it is (the workers
    are forks, nothing is pickled); it is also stored as JSON for
    :meth:`restore` when it is made of JSON values.

    Call :meth:`fit` from the thread that lives for the whole run, with no
    other thread holding locks the workers need (they are forks).
    """

    _backend_setup: Optional[BackendSetup] = None

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: Optional[dict[str, Any]] = None,
        scaling_config: Optional[ScalingConfig] = None,
        run_config: Optional[RunConfig] = None,
        resume_from_checkpoint: Optional[Checkpoint] = None,
        datasets: Optional[dict[str, Any]] = None,
        dataset_config: Optional[Any] = None,
        metadata: Optional[dict[str, Any]] = None,
    ) -> None:
        if not callable(train_loop_per_worker):
            raise InvalidArgumentError(
                f"train_loop_per_worker: a function, not a {type(train_loop_per_worker).__name__}",
                "invalid_argument",
            )
        if datasets:
            raise InvalidArgumentError(
                "datasets: Ray Data datasets are not supported; load data in "
                "train_loop_per_worker (prepare_data_loader shards a DataLoader)",
                "invalid_argument",
            )
        del dataset_config  # accepted for Ray compatibility (no Ray Data here)
        self._metadata = dict(metadata or {})
        self._fn = train_loop_per_worker
        self._config = train_loop_config
        self._scaling = scaling_config or ScalingConfig()
        self._run = run_config or RunConfig()
        min_workers, num_workers = worker_range(self._scaling)
        self._impl: Any = _cairn.Trainer(
            self._worker(),
            _json_or_none(train_loop_config),
            num_workers,
            self._scaling.launcher,
            self._run._native(),
            None if resume_from_checkpoint is None else resume_from_checkpoint._impl,
            min_workers,
        )

    def _setup_fn(self) -> Optional[BackendSetup]:
        """What each worker runs before the function (the backend's set-up)."""
        return type(self)._backend_setup

    def _worker(self) -> Callable[[Any], None]:
        return _worker_of(
            self._fn,
            self._config,
            self._scaling,
            self._setup_fn(),
            getattr(self, "_metadata", None),
        )

    def fit(self) -> Result:
        """Runs the training to its end and returns its Result.

        A worker failure restarts the group from the latest committed
        checkpoint as often as ``FailureConfig.max_failures`` allows; after
        that the run has failed and, as Ray's, ``fit()`` raises. A run ended
        by SIGTERM (preemption) returns its Result with ``preempted`` set.
        The GIL is released meanwhile.

        Raises:
            WorkerGroupError: (a TrainingFailedError, as Ray Train V2's) the
                run failed: its message names the rank
                and the cause (a Python worker's traceback included);
                ``error.result`` is the run's Result, whose checkpoint is
                the latest committed before the failure.
            cairn.Error: the run could not start (the experiment folder is
                locked by another run, or holds a finished run and
                ``resume_existing`` is False, a bad configuration).
        """
        result = Result(self._impl.fit())
        if self._config is not None:
            result.config = {"train_loop_config": self._config}
        else:  # a restore given no config goes on with the saved one
            result.config = _saved_config(result.path)
        if result.error is not None and not result.preempted:
            raise WorkerGroupError(
                f"{result.error}\n(the run is at {result.path}: "
                f"{type(self).__name__}.restore(path, train_loop_per_worker) goes on from its "
                "latest checkpoint; FailureConfig(max_failures=...) restarts it by itself)",
                result,
            )
        return result

    @classmethod
    def can_restore(cls, path: str | os.PathLike[str]) -> bool:
        """Whether ``path`` holds a run that :meth:`restore` can go on with."""
        return bool(_cairn.Trainer.can_restore(path))

    @classmethod
    def restore(
        cls,
        path: str | os.PathLike[str],
        train_loop_per_worker: Optional[Callable[..., Any]] = None,
        train_loop_config: Optional[dict[str, Any]] = None,
        scaling_config: Optional[ScalingConfig] = None,
    ) -> DataParallelTrainer:
        """The run at ``path`` (an experiment folder), to :meth:`fit` again.

        The run goes on from its latest committed checkpoint with its saved
        configuration (workers, retention, failures). The function is
        needed again (it is code, not data); ``train_loop_config`` replaces
        the saved one when given, else the saved JSON is used.

        Raises:
            cairn.NotFoundError: no run at ``path``.
            cairn.InvalidArgumentError: no function given.
        """
        if train_loop_per_worker is None:
            raise InvalidArgumentError(
                f"{os.fspath(path)}: restore needs train_loop_per_worker (functions are not "
                "stored with the run)",
                "invalid_argument",
            )
        self = cls.__new__(cls)
        self._fn = train_loop_per_worker
        self._config = train_loop_config
        self._scaling = scaling_config or ScalingConfig()
        self._run = RunConfig()
        self._impl = _cairn.Trainer.restore(path, self._worker(), _json_or_none(train_loop_config))
        return self


def _worker_of(
    fn: Callable[..., Any],
    config: Any,
    scaling: ScalingConfig,
    setup: Optional[BackendSetup],
    metadata: Optional[dict[str, Any]] = None,
) -> Callable[[Any], None]:
    """The callable the C++ worker calls with the run's JSON configuration.

    The Python object given to the trainer is used when there is one (it
    need not be JSON; the workers are forks); else the JSON one (a restored
    run's saved configuration).
    """

    def worker(saved: Any) -> None:
        _worker_main(fn, config if config is not None else saved, scaling, setup, metadata)

    return worker


def _json_or_none(config: Any) -> Any:
    """``config`` when it is made of JSON values, else None (not stored)."""
    import json

    try:
        json.dumps(config, allow_nan=True)
    except (TypeError, ValueError):
        return None
    return config
