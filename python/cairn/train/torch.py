"""cairn.train.torch: TorchTrainer, prepare_model and prepare_data_loader, as Ray's.

In each worker ``torch.distributed`` is initialised for the group before the
training function runs (Gloo on CPU; NCCL with ``ScalingConfig(use_gpu=True)``
when CUDA is there), at the rendezvous address and port the C++ runtime
reserves for each start of the group, and torn down after it.
"""

from __future__ import annotations

import collections
import datetime
import os
import random
from dataclasses import dataclass
from typing import Any, Callable, Optional

from cairn import _checkpoint
from cairn._args import check_public as _check_public
from cairn.train._config import ScalingConfig
from cairn.train._session import TrainContext, get_context
from cairn.train._trainer import DataParallelTrainer

_use_gpu = False  # this worker's ScalingConfig.use_gpu


@dataclass
class TorchConfig:
    """How the workers' ``torch.distributed`` group is set up, as Ray's.

    Args:
        backend: "gloo" or "nccl"; None for NCCL with GPUs
            (``ScalingConfig(use_gpu=True)`` and CUDA present), else Gloo.
        init_method: "env" or "tcp"; both rendezvous at the address and
            port the runtime reserves for each start of the group.
        timeout_s: how long collective operations wait.
    """

    backend: Optional[str] = None
    init_method: str = "env"
    timeout_s: int = 1800


def _setup_torch(
    context: TrainContext, scaling: ScalingConfig, torch_config: Optional[TorchConfig] = None
) -> Optional[Callable[[], None]]:
    import torch.distributed as dist

    import torch

    config = torch_config or TorchConfig()
    global _use_gpu
    _use_gpu = bool(scaling.use_gpu) and torch.cuda.is_available()
    if _use_gpu:
        torch.cuda.set_device(context.get_local_rank())
    values = context._values
    dist.init_process_group(
        backend=config.backend or ("nccl" if _use_gpu else "gloo"),
        init_method=f"tcp://{values['master_addr']}:{values['master_port']}",
        rank=context.get_world_rank(),
        world_size=context.get_world_size(),
        timeout=datetime.timedelta(seconds=config.timeout_s),
    )

    _checkpoint._dict_encoders.append(_unwrap_ddp)

    def teardown() -> None:
        if _unwrap_ddp in _checkpoint._dict_encoders:
            _checkpoint._dict_encoders.remove(_unwrap_ddp)
        if dist.is_initialized():
            dist.destroy_process_group()

    return teardown


def _unwrap_ddp(data: dict[Any, Any]) -> dict[Any, Any]:
    """``data`` with what DDP adds taken off its first-level values, as Ray's
    TorchTrainer does for dict checkpoints: a DistributedDataParallel model
    becomes its module, and a state dict (tensors) whose keys all start
    with "module." (``prepare_model(m).state_dict()``) loses that prefix."""
    from torch.nn.parallel import DistributedDataParallel

    import torch

    out = dict(data)
    for key, value in data.items():
        if isinstance(value, DistributedDataParallel):
            out[key] = value.module
        elif (
            isinstance(value, dict)
            and value
            and all(isinstance(k, str) and k.startswith("module.") for k in value)
            and any(isinstance(v, torch.Tensor) for v in value.values())
        ):
            stripped = type(value)() if isinstance(value, collections.OrderedDict) else {}
            for k, v in value.items():
                stripped[k[len("module.") :]] = v
            if hasattr(value, "_metadata"):  # a state dict's version info, as torch keeps it
                stripped._metadata = type(
                    value._metadata
                )(  # type: ignore[attr-defined]
                    (k[len("module.") :] if k.startswith("module.") else k, v)
                    for k, v in value._metadata.items()
                )
            out[key] = stripped
    return out


class TorchTrainer(DataParallelTrainer):
    """Ray's ``TorchTrainer``: a :class:`~cairn.train.DataParallelTrainer`
    whose workers join one ``torch.distributed`` process group, set up as
    ``torch_config`` says (:class:`TorchConfig`)."""

    _backend_setup = staticmethod(_setup_torch)

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: Optional[dict[str, Any]] = None,
        torch_config: Optional[TorchConfig] = None,
        scaling_config: Optional[ScalingConfig] = None,
        run_config: Optional[Any] = None,
        resume_from_checkpoint: Optional[Any] = None,
        datasets: Optional[dict[str, Any]] = None,
        dataset_config: Optional[Any] = None,
        metadata: Optional[dict[str, Any]] = None,
    ) -> None:
        if torch_config is not None and not isinstance(torch_config, TorchConfig):
            raise TypeError(f"torch_config: a TorchConfig, not a {type(torch_config).__name__}")
        if torch_config is not None and torch_config.backend not in (None, "gloo", "nccl"):
            raise ValueError(f"TorchConfig.backend {torch_config.backend!r}: 'gloo' or 'nccl'")
        self._torch_config = torch_config
        super().__init__(
            train_loop_per_worker,
            train_loop_config=train_loop_config,
            scaling_config=scaling_config,
            run_config=run_config,
            resume_from_checkpoint=resume_from_checkpoint,
            datasets=datasets,
            dataset_config=dataset_config,
            metadata=metadata,
        )

    def _setup_fn(self) -> Callable[[TrainContext, ScalingConfig], Optional[Callable[[], None]]]:
        torch_config = getattr(self, "_torch_config", None)

        def setup(context: TrainContext, scaling: ScalingConfig) -> Optional[Callable[[], None]]:
            return _setup_torch(context, scaling, torch_config)

        return setup


def get_device() -> Any:
    """This worker's device: ``cuda:<LOCAL_RANK>`` with GPUs, else ``cpu``."""
    import torch

    if _use_gpu:
        return torch.device("cuda", get_context().get_local_rank())
    return torch.device("cpu")


def get_devices() -> list[Any]:
    """This worker's devices, as Ray's: ``[get_device()]``."""
    return [get_device()]


def prepare_optimizer(optimizer: Any) -> Any:
    """``optimizer`` as it is: DDP needs nothing more (Ray's is the same
    without automatic mixed precision)."""
    return optimizer


def backward(tensor: Any) -> None:
    """``tensor.backward()``, as Ray's without automatic mixed precision."""
    tensor.backward()


def enable_reproducibility(seed: int = 0) -> None:
    """Seeds Python, NumPy and torch with ``seed`` and asks torch for
    deterministic algorithms (as Ray's: slower, and some operations then
    raise). Call it at the top of ``train_loop_per_worker``."""
    import torch

    random.seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:  # numpy is optional
        pass
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"


def prepare_model(
    model: Any,
    move_to_device: bool = True,
    parallel_strategy: Optional[str] = "ddp",
    parallel_strategy_kwargs: Optional[dict[str, Any]] = None,
) -> Any:
    """The model on this worker's device, wrapped in DistributedDataParallel.

    With more than one worker and ``parallel_strategy="ddp"``, a plain
    ``loss.backward()`` then averages gradients across the workers. With one
    worker, or ``parallel_strategy=None``, the model is returned unwrapped.
    """
    from torch.nn.parallel import DistributedDataParallel

    import torch

    if move_to_device:
        model = model.to(get_device())
    if parallel_strategy is None or get_context().get_world_size() <= 1:
        return model
    if parallel_strategy != "ddp":
        raise ValueError(f"parallel_strategy {parallel_strategy!r}: 'ddp' or None")
    kwargs = dict(parallel_strategy_kwargs or {})
    if _use_gpu:
        kwargs.setdefault("device_ids", [torch.cuda.current_device()])
    return DistributedDataParallel(model, **kwargs)


def prepare_data_loader(
    data_loader: Any, add_dist_sampler: bool = True, move_to_device: bool = True
) -> Any:
    """``data_loader`` with a DistributedSampler: each worker reads its share.

    Shuffling is kept (a RandomSampler becomes a shuffling
    DistributedSampler); call ``loader.sampler.set_epoch(epoch)`` as with
    any DistributedSampler. With ``move_to_device`` and GPUs, batches come
    on this worker's device.
    """
    from torch.utils.data import DataLoader, RandomSampler
    from torch.utils.data.distributed import DistributedSampler

    loader = data_loader
    if (
        add_dist_sampler
        and get_context().get_world_size() > 1
        and not isinstance(loader.sampler, DistributedSampler)
    ):
        shuffle = isinstance(loader.sampler, RandomSampler)
        loader = DataLoader(
            loader.dataset,
            batch_size=loader.batch_size,
            sampler=DistributedSampler(loader.dataset, shuffle=shuffle),
            num_workers=loader.num_workers,
            collate_fn=loader.collate_fn,
            pin_memory=loader.pin_memory,
            drop_last=loader.drop_last,
            timeout=loader.timeout,
            worker_init_fn=loader.worker_init_fn,
            generator=loader.generator,
        )
    if move_to_device and _use_gpu:
        return _DeviceLoader(loader, get_device())
    return loader


class _DeviceLoader:
    """Iterates a DataLoader, moving every tensor of a batch to ``device``."""

    def __init__(self, loader: Any, device: Any) -> None:
        self._loader = loader
        self._device = device
        self.sampler = loader.sampler
        self.dataset = loader.dataset

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Any:
        for batch in self._loader:
            yield _to(batch, self._device)


def _to(batch: Any, device: Any) -> Any:
    if hasattr(batch, "to"):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to(v, device) for k, v in batch.items()}
    return batch


__all__ = [
    "TorchConfig",
    "TorchTrainer",
    "backward",
    "enable_reproducibility",
    "get_device",
    "get_devices",
    "prepare_data_loader",
    "prepare_model",
    "prepare_optimizer",
]


# A wrong type in a public call is a TypeError naming the parameter.
_check_public(globals())
