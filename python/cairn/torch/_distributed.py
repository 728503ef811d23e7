"""PyTorch 2 distributed state (DTensor, FSDP2) through Cairn's sharded path.

save_distributed: every rank of a process group saves its own boxes of each
DTensor with :func:`save_sharded` (a box held by several ranks, replicated,
is written by one of them; a plain tensor and the structure of the state by
rank 0), the reports are gathered on rank 0, which commits with
:func:`commit_sharded`, and every rank learns the outcome. load_distributed:
each process fills its DTensors' local boxes (any mesh, any world size,
plain tensors for one process) from the saved boxes that overlap them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, MutableMapping
from typing import Any, Optional, Union

from cairn import _cairn
from cairn._checkpoint import Checkpoint
from cairn.errors import CorruptionError, Error, _class_for
from cairn.torch._sharded import Shard, commit_sharded, load_sharded, save_sharded
from cairn.torch._state import (
    _DICT,
    _TENSOR,
    _TUPLE,
    PathLike,
    _checkpoint_arg,
    _decode,
    _encode,
    _invalid,
    _is_tensor,
)

# The saved entry holding the state's structure (its non-tensor values and
# where each tensor sits), as UTF-8 JSON in a U8 tensor that rank 0 writes:
# committed with the tensors, in the same manifest.
_STRUCTURE = "__cairn.distributed__"


def _dtensor_type() -> Any:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without DTensor: no value is one
        return ()
    return DTensor


def _box(name: str, value: Any) -> tuple[list[int], list[int], bool, Any]:
    """(global shape, offsets, writes, local tensor) of this rank's box of a DTensor.

    ``writes`` is false on a rank whose box another rank writes (a coordinate
    other than 0 along a mesh dimension the tensor is replicated on).
    """
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor import Shard as DShard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    placements = value.placements
    for p in placements:
        # _StridedShard (FSDP2 over tensor parallelism) is no box; Partial is no value yet.
        if not (type(p) is DShard or isinstance(p, Replicate)):
            raise _invalid(
                f"tensor {name!r}: placement {p!r} is not supported (Shard(dim) and "
                "Replicate only); redistribute it first"
            )
    mesh = value.device_mesh
    coordinate = mesh.get_coordinate()
    shape = list(value.shape)
    if coordinate is None:  # this rank is not in the tensor's mesh: no box
        return shape, [0] * len(shape), False, None
    local_shape, offsets = compute_local_shape_and_global_offset(value.shape, mesh, placements)
    local = value.to_local()
    if tuple(local.shape) != tuple(local_shape):
        raise _invalid(
            f"tensor {name!r}: local shape {tuple(local.shape)} differs from the "
            f"{tuple(local_shape)} its placements give"
        )
    writes = all(c == 0 for c, p in zip(coordinate, placements) if isinstance(p, Replicate))
    return shape, list(offsets), writes, local


def _structure(value: Any, name: str) -> Any:
    """``value`` as typed JSON (as ``_encode`` writes it), each tensor by its name only."""
    if _is_tensor(value):
        return {_TENSOR: name}
    if isinstance(value, tuple):
        return {_TUPLE: [_structure(v, f"{name}.{i}") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_structure(v, f"{name}.{i}") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        return {
            _DICT: [
                [_encode(k, f"{name}.<key>", {}), _structure(v, f"{name}.{k}")]
                for k, v in value.items()
            ]
        }
    return _encode(value, name, {})


def _leaves(value: Any, name: str, out: dict[str, Any]) -> None:
    """The tensors of ``value`` (the originals) under the names ``_structure`` gives them."""
    if _is_tensor(value):
        if name in out:
            raise _invalid(f"tensor {name!r}: two entries of the state have this name")
        out[name] = value
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _leaves(v, f"{name}.{i}", out)
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _leaves(v, f"{name}.{k}", out)


def _top(state_dict: Any, parameter: str) -> Mapping[str, Any]:
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"{parameter}: a mapping, not a {type(state_dict).__name__}")
    for k in state_dict:
        if not isinstance(k, str):
            raise TypeError(f"{parameter}: top-level key {k!r} is not a str")
        if k == _STRUCTURE:
            raise _invalid(f"{parameter}: key {_STRUCTURE!r} is reserved")
    return state_dict


def _error_of(exc: BaseException, rank: int) -> tuple[str, str]:
    code = exc.code if isinstance(exc, Error) else "internal"
    return code, f"rank {rank}: {type(exc).__name__}: {exc}"


def save_distributed(
    dest: Union[Checkpoint, PathLike],
    state_dict: Mapping[str, Any],
    *,
    process_group: Any = None,
    metrics: Optional[Mapping[str, Any]] = None,
) -> None:
    """Saves a distributed state dict (DTensors, FSDP2) from every rank; rank 0 commits.

    Collective: every rank of ``process_group`` (default: the default group)
    calls it with the same ``dest`` (a shared folder or URI, or an uncommitted
    :class:`cairn.Checkpoint`) and a state dict of the same structure, such as
    ``{"model": msd, "optim": osd}`` from
    ``torch.distributed.checkpoint.state_dict.get_state_dict(model, optim)``.

    - A ``DTensor`` (placements ``Shard(dim)`` and ``Replicate`` over a mesh
      of any dimensions, even or uneven shards) is saved as this rank's box
      of the global tensor; ranks holding the same box (replicated) write it
      once.
    - A plain tensor (an optimizer's ``step``) must be equal on every rank:
      rank 0 writes it.
    - Everything else (``param_groups``' hyperparameters, ints, floats,
      strings, None, tuples) is kept as typed JSON, from rank 0.

    Each rank writes ``rank_NNNNN.safetensors`` (its group rank), the reports
    are gathered on group rank 0 (``torch.distributed.gather_object``), which
    checks that the boxes tile every tensor and commits the manifest
    (:func:`commit_sharded`, ``metrics`` in it); then every rank returns, or
    raises.

    Raises:
        TypeError: a state dict that is not a mapping of str keys (naming it).
        cairn.InvalidArgumentError: a placement other than Shard and Replicate
            (naming the tensor), a value JSON cannot hold.
        cairn.Error: any rank's failure, on every rank (the message names the
            rank); nothing is committed then.
    """
    import torch.distributed as dist

    import torch

    rank = dist.get_rank(process_group)
    world = dist.get_world_size(process_group)
    root = 0 if process_group is None else dist.get_global_rank(process_group, 0)
    dtensor = _dtensor_type()

    outcome: tuple[str, Any]
    try:  # every failure is reported to rank 0, so that no rank waits forever
        state = _top(state_dict, "state_dict")
        tensors: dict[str, Any] = {}
        for k, v in state.items():
            _leaves(v, k, tensors)
        structure = {k: _structure(v, k) for k, v in state.items()}
        shards: dict[str, Any] = {}
        for name, value in tensors.items():
            if isinstance(value, dtensor):
                shape, offsets, writes, local = _box(name, value)
                if writes and local is not None and (local.numel() > 0 or rank == 0):
                    shards[name] = Shard(local.detach().contiguous(), shape, offsets)
            elif rank == 0:
                shards[name] = value.detach().contiguous()
        if rank == 0:
            text = json.dumps({"format": 1, "state": structure}).encode()
            shards[_STRUCTURE] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
        outcome = ("report", save_sharded(dest, rank, shards))
    except Exception as exc:  # every rank must still take part in the gather
        outcome = ("error", _error_of(exc, rank))
        failure: Optional[BaseException] = exc
    else:
        failure = None

    gathered: Optional[list[Any]] = [None] * world if rank == 0 else None
    dist.gather_object(outcome, gathered, dst=root, group=process_group)
    verdict: list[Any] = [None]
    if rank == 0:
        assert gathered is not None
        errors = [o[1] for o in gathered if o[0] == "error"]
        if errors:
            verdict[0] = (errors[0][0], "; ".join(e[1] for e in errors))
        else:
            try:
                commit_sharded(dest, [o[1] for o in gathered], metrics)
            except Exception as exc:
                verdict[0] = _error_of(exc, rank)
                failure = failure or exc
    dist.broadcast_object_list(verdict, src=root, group=process_group)
    if verdict[0] is not None:
        if failure is not None:
            raise failure
        code, message = verdict[0]
        raise _class_for(code)(f"save_distributed into {dest}: {message}", code)


def _restore(target: Any, saved: Any) -> None:
    """Puts the saved non-tensor values into ``target`` in place, recursively."""
    if isinstance(target, MutableMapping) and isinstance(saved, Mapping):
        for k, v in saved.items():
            if k in target and isinstance(v, (Mapping, list)) and not _is_tensor(target[k]):
                if isinstance(target[k], (MutableMapping, list)):
                    _restore(target[k], v)
                    continue
            if v is not None or k not in target or not _is_tensor(target[k]):
                target[k] = v
    elif isinstance(target, list) and isinstance(saved, list) and len(target) == len(saved):
        for i, v in enumerate(saved):
            if isinstance(v, (Mapping, list)) and isinstance(target[i], (MutableMapping, list)):
                _restore(target[i], v)
            else:
                target[i] = v


class _Loaded(dict):  # type: ignore[type-arg]
    """Tensors by name for _decode; a name the target lacks decodes to None (not strict)."""

    def __contains__(self, name: object) -> bool:
        return True

    def __missing__(self, name: str) -> None:
        return None


def load_distributed(
    src: Union[Checkpoint, PathLike],
    state_dict: MutableMapping[str, Any],
    *,
    strict: bool = True,
) -> None:
    """Fills a (distributed) state dict in place from a :func:`save_distributed` checkpoint.

    Each process reads only what it holds: a ``DTensor``'s local box (any
    mesh, placements and world size: saved by 4 ranks, loaded by 2 or 1, or
    the reverse), a plain tensor whole (one process loading a model that is
    not sharded). Not collective: no process group is needed. Tensors are
    filled in place (a non-contiguous local tensor, or a device tensor where
    Cairn was built without CUDA, through a contiguous host copy); the
    non-tensor values (``param_groups``' hyperparameters, ints,
    floats) are put into ``state_dict`` as saved. Then hand it to
    ``torch.distributed.checkpoint.state_dict.set_state_dict``.

    Args:
        strict: every tensor of ``state_dict`` must be saved and every saved
            tensor must be in ``state_dict``.

    Raises:
        cairn.CorruptionError: ``src`` was not written by save_distributed.
        cairn.InvalidArgumentError: a missing or unexpected tensor (strict), a
            global shape or dtype that differs, an unsupported placement —
            naming each tensor; raised before any tensor is changed.
    """
    import torch

    state = _top(state_dict, "state_dict")
    dtensor = _dtensor_type()
    reader = _cairn.ShardedReader(_checkpoint_arg(src))
    saved = {name: shape for name, _, shape in reader.tensors()}
    if _STRUCTURE not in saved:
        raise CorruptionError(
            f"{src}: holds no {_STRUCTURE!r} entry (not written by save_distributed)",
            "corruption",
        )
    text = torch.empty(saved.pop(_STRUCTURE), dtype=torch.uint8)
    load_sharded(src, {_STRUCTURE: text})
    try:
        structure = json.loads(bytes(text.numpy()).decode())["state"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptionError(
            f"{src}: a malformed {_STRUCTURE!r} entry ({exc})", "corruption"
        ) from exc

    targets: dict[str, Any] = {}
    for k, v in state.items():
        _leaves(v, k, targets)
    unexpected = sorted(set(saved) - set(targets))
    if strict and unexpected:
        raise _invalid(
            f"{src}: " + "; ".join(f"{n} is saved but not in the state dict" for n in unexpected)
        )
    request: dict[str, Any] = {}
    copies: list[tuple[Any, Any]] = []
    for name, value in targets.items():
        if not strict and name not in saved:
            continue
        if isinstance(value, dtensor):
            shape, offsets, _, local = _box(name, value)
            if local is None:
                continue
        else:
            shape, offsets, local = list(value.shape), [0] * value.dim(), value
        host_only = local.device.type != "cpu" and not (local.device.type == "cuda" and _cairn.CUDA)
        if host_only:  # this Cairn reads into host memory only: stage there
            into = torch.empty(local.shape, dtype=local.dtype)
        elif local.is_contiguous():
            into = local
        else:
            into = torch.empty_like(local, memory_format=torch.contiguous_format)
        if into is not local:
            copies.append((local, into))
        request[name] = Shard(into, shape, offsets)
    load_sharded(src, request, strict=strict)
    with torch.no_grad():
        for local, into in copies:
            local.copy_(into)
    loaded = _Loaded({n: targets[n] for n in request})
    for k, v in structure.items():
        value = _decode(v, loaded, str(src))
        if k in state and isinstance(state[k], (MutableMapping, list)):
            _restore(state[k], value)
        elif value is not None:
            state[k] = value
