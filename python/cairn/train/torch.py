"""cairn.train.torch: TorchTrainer, prepare_model and prepare_data_loader, as Ray's.

In each worker ``torch.distributed`` is initialised for the group before the
training function runs (Gloo on CPU; NCCL with ``ScalingConfig(use_gpu=True)``
when CUDA is there), at the rendezvous address and port the C++ runtime
reserves for each start of the group, and torn down after it.
"""

from __future__ import annotations

import datetime
from typing import Any, Callable, Optional

from cairn.train._config import ScalingConfig
from cairn.train._session import TrainContext, get_context
from cairn.train._trainer import DataParallelTrainer

_use_gpu = False  # this worker's ScalingConfig.use_gpu


def _setup_torch(context: TrainContext, scaling: ScalingConfig) -> Optional[Callable[[], None]]:
    import torch
    import torch.distributed as dist

    global _use_gpu
    _use_gpu = bool(scaling.use_gpu) and torch.cuda.is_available()
    if _use_gpu:
        torch.cuda.set_device(context.get_local_rank())
    values = context._values
    dist.init_process_group(
        backend="nccl" if _use_gpu else "gloo",
        init_method=f"tcp://{values['master_addr']}:{values['master_port']}",
        rank=context.get_world_rank(), world_size=context.get_world_size(),
        timeout=datetime.timedelta(seconds=1800))

    def teardown() -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    return teardown


class TorchTrainer(DataParallelTrainer):
    """Ray's ``TorchTrainer``: a :class:`~cairn.train.DataParallelTrainer`
    whose workers join one ``torch.distributed`` process group."""

    _backend_setup = staticmethod(_setup_torch)


def get_device() -> Any:
    """This worker's device: ``cuda:<LOCAL_RANK>`` with GPUs, else ``cpu``."""
    import torch

    if _use_gpu:
        return torch.device("cuda", get_context().get_local_rank())
    return torch.device("cpu")


def prepare_model(model: Any, move_to_device: bool = True,
                  parallel_strategy: Optional[str] = "ddp",
                  parallel_strategy_kwargs: Optional[dict[str, Any]] = None) -> Any:
    """The model on this worker's device, wrapped in DistributedDataParallel.

    With more than one worker and ``parallel_strategy="ddp"``, a plain
    ``loss.backward()`` then averages gradients across the workers. With one
    worker, or ``parallel_strategy=None``, the model is returned unwrapped.
    """
    import torch
    from torch.nn.parallel import DistributedDataParallel

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


def prepare_data_loader(data_loader: Any, add_dist_sampler: bool = True,
                        move_to_device: bool = True) -> Any:
    """``data_loader`` with a DistributedSampler: each worker reads its share.

    Shuffling is kept (a RandomSampler becomes a shuffling
    DistributedSampler); call ``loader.sampler.set_epoch(epoch)`` as with
    any DistributedSampler. With ``move_to_device`` and GPUs, batches come
    on this worker's device.
    """
    from torch.utils.data import DataLoader, RandomSampler
    from torch.utils.data.distributed import DistributedSampler

    loader = data_loader
    if (add_dist_sampler and get_context().get_world_size() > 1
            and not isinstance(loader.sampler, DistributedSampler)):
        shuffle = isinstance(loader.sampler, RandomSampler)
        loader = DataLoader(
            loader.dataset, batch_size=loader.batch_size,
            sampler=DistributedSampler(loader.dataset, shuffle=shuffle),
            num_workers=loader.num_workers, collate_fn=loader.collate_fn,
            pin_memory=loader.pin_memory, drop_last=loader.drop_last,
            timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
            generator=loader.generator)
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


__all__ = ["TorchTrainer", "get_device", "prepare_model", "prepare_data_loader"]
