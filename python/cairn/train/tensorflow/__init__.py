"""cairn.train.tensorflow: TensorflowTrainer and prepare_dataset_shard, as Ray's.

Each worker gets ``TF_CONFIG`` for ``tf.distribute.MultiWorkerMirroredStrategy``
before the training function runs: one gRPC address per rank, on the
address the runtime gives rank 0 (127.0.0.1 with the local launcher), at a
port each worker reserved for itself (:mod:`._rendezvous` says how, and why
no two processes can get the same port). Checkpoints follow TensorFlow's
multi-worker rule: every worker saves (saving may run collective ops), only
the chief's (rank 0's) files are committed; the files other ranks pass to
:func:`cairn.train.report` never reach storage and their directories are
removed once the round returns.

TensorFlow must not be imported by the driver process before ``fit()``
(the workers are forks of it, and TensorFlow's threads do not survive a
fork): import it inside ``train_loop_per_worker``.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Any, Callable, Optional

from cairn._args import check_public as _check_public
from cairn._checkpoint import Checkpoint
from cairn.errors import InvalidArgumentError
from cairn.train import _session
from cairn.train._config import ScalingConfig
from cairn.train._session import TrainContext
from cairn.train._trainer import DataParallelTrainer
from cairn.train.tensorflow._rendezvous import exchange_addresses


@dataclass
class TensorflowConfig:
    """How the workers' TensorFlow cluster is set up, as Ray's (no options:
    every rank is a ``"worker"`` task, rank 0 the chief)."""


def _gpus_requested(scaling: ScalingConfig) -> bool:
    per_worker = scaling.resources_per_worker or {}
    return bool(scaling.use_gpu) or float(per_worker.get("GPU", 0) or 0) > 0


def _tensorflow_has_gpu() -> bool:
    """Whether TensorFlow could use a GPU here, without importing it (the
    driver must not: its workers are forks): the CPU-only wheel cannot, and
    neither can any build on a machine without an NVIDIA device."""
    import importlib.metadata

    try:
        importlib.metadata.distribution("tensorflow-cpu")
        return False
    except importlib.metadata.PackageNotFoundError:
        pass
    return os.path.isdir("/proc/driver/nvidia/gpus") and bool(
        os.listdir("/proc/driver/nvidia/gpus")
    )


def _check_environment(where: str) -> None:
    value = os.environ.get("TF_CONFIG")
    if value is not None:
        raise InvalidArgumentError(
            f"TF_CONFIG is already set in the {where}'s environment ({value[:200]!r}): "
            "TensorflowTrainer writes each worker's TF_CONFIG itself; unset it",
            "invalid_argument",
        )


def _drop_non_chief_files(checkpoint: Checkpoint) -> tuple[Optional[Checkpoint], Any]:
    """The checkpoint filter of a non-chief rank: its files are not uploaded
    (the chief's copy is the checkpoint) and its local directory is removed
    once the round has returned."""
    uri = checkpoint.uri

    def remove() -> None:
        if uri.startswith("file://"):
            # ignore-error: a directory already gone (or never made) is what we want.
            shutil.rmtree(uri[len("file://") :], ignore_errors=True)

    return None, remove


def _setup_tensorflow(
    context: TrainContext, scaling: ScalingConfig
) -> Optional[Callable[[], None]]:
    """Runs in each worker before the training function: TF_CONFIG for the
    attempt's cluster, and the chief-only checkpoint rule."""
    _check_environment(f"worker of rank {context.get_world_rank()}")
    if _gpus_requested(scaling):
        os.environ["CUDA_VISIBLE_DEVICES"] = str(context.get_local_rank())
    values = context._values
    held, addresses = exchange_addresses(
        str(values["master_addr"]),
        int(values["master_port"]),
        context.get_world_rank(),
        context.get_world_size(),
    )
    import json

    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": addresses},
            "task": {"type": "worker", "index": context.get_world_rank()},
        }
    )
    if context.get_world_rank() != 0:
        _session._checkpoint_filter = _drop_non_chief_files

    def teardown() -> None:
        _session._checkpoint_filter = None
        os.environ.pop("TF_CONFIG", None)
        held.close()

    return teardown


class TensorflowTrainer(DataParallelTrainer):
    """Ray's ``TensorflowTrainer``: a :class:`~cairn.train.DataParallelTrainer`
    whose workers form one TensorFlow cluster (``TF_CONFIG``), ready for
    ``tf.distribute.MultiWorkerMirroredStrategy()`` in ``train_loop_per_worker``.

    Raises:
        cairn.InvalidArgumentError: ``TF_CONFIG`` is set in this process's
            environment; GPUs asked for (``use_gpu`` or ``resources_per_worker``)
            where TensorFlow has none (the CPU-only wheel, no NVIDIA device).
        NotImplementedError: ``datasets`` or ``dataset_config`` (Ray Data),
            which Cairn does not provide.
        TypeError: ``tensorflow_config`` is not a :class:`TensorflowConfig`.
    """

    _backend_setup = staticmethod(_setup_tensorflow)

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: Optional[dict[str, Any]] = None,
        tensorflow_config: Optional[TensorflowConfig] = None,
        scaling_config: Optional[ScalingConfig] = None,
        dataset_config: Optional[Any] = None,
        run_config: Optional[Any] = None,
        datasets: Optional[dict[str, Any]] = None,
        metadata: Optional[dict[str, Any]] = None,
        resume_from_checkpoint: Optional[Checkpoint] = None,
    ) -> None:
        if tensorflow_config is not None and not isinstance(tensorflow_config, TensorflowConfig):
            raise TypeError(
                f"tensorflow_config: a TensorflowConfig, not a {type(tensorflow_config).__name__}"
            )
        if datasets is not None:
            raise NotImplementedError(
                "TensorflowTrainer(datasets=...): Ray Data datasets are not provided by Cairn; "
                "build a tf.data.Dataset in train_loop_per_worker (prepare_dataset_shard)"
            )
        if dataset_config is not None:
            raise NotImplementedError(
                "TensorflowTrainer(dataset_config=...): Ray Data is not provided by Cairn"
            )
        _check_environment("driver")
        if _gpus_requested(scaling_config or ScalingConfig()) and not _tensorflow_has_gpu():
            raise InvalidArgumentError(
                "scaling_config asks for GPUs (use_gpu or resources_per_worker['GPU']) but "
                "TensorFlow has none here (tensorflow-cpu is installed, or no NVIDIA device)",
                "invalid_argument",
            )
        super().__init__(
            train_loop_per_worker,
            train_loop_config=train_loop_config,
            scaling_config=scaling_config,
            run_config=run_config,
            resume_from_checkpoint=resume_from_checkpoint,
            metadata=metadata,
        )


def prepare_dataset_shard(tf_dataset_shard: Any) -> Any:
    """``tf_dataset_shard`` with tf.data auto-sharding off and autotuned
    prefetching, as Ray's: the dataset is already this worker's shard, so
    ``MultiWorkerMirroredStrategy`` must not shard it again."""
    import tensorflow as tf

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return tf_dataset_shard.with_options(options).prefetch(tf.data.AUTOTUNE)


# Names of Ray's ray.train.tensorflow that Cairn does not provide, with what to use.
_NOT_PROVIDED = {
    "TensorflowCheckpoint": (
        "ray.train.tensorflow.TensorflowCheckpoint is not provided by Cairn: report a "
        "cairn.train.Checkpoint.from_directory of the saved model (the Keras callback "
        "cairn.train.tensorflow.keras.ReportCheckpointCallback does), and load it with "
        "cairn.train.tensorflow.keras.get_model"
    ),
}


def __getattr__(name: str) -> Any:
    """Ray's names that Cairn does not provide raise NotImplementedError naming them."""
    if name in _NOT_PROVIDED:
        raise NotImplementedError(_NOT_PROVIDED[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "TensorflowConfig",
    "TensorflowTrainer",
    "prepare_dataset_shard",
]


# A wrong type in a public call is a TypeError naming the parameter.
_check_public(globals())
