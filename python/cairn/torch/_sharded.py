"""Sharded saves: each rank its boxes, any world size loads them back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Optional, Union

from cairn import _cairn
from cairn._checkpoint import Checkpoint
from cairn._tensors import (
    flatten_state_dict,
)
from cairn.torch._state import PathLike, _checkpoint_arg, _invalid, _readable, _writable

# ---- sharded saves ----------------------------------------------------------


class Shard(NamedTuple):
    """A rank's box of a global tensor: ``tensor`` sits at ``offsets`` in ``global_shape``."""

    tensor: Any
    global_shape: Sequence[int]
    offsets: Sequence[int]


def even_split(
    global_shape: Sequence[int], dim: int, rank: int, world_size: int
) -> tuple[list[int], list[int]]:
    """(offsets, shape) of rank ``rank``'s box when ``dim`` is split evenly.

    The first ``size % world_size`` ranks get one more row.
    """
    return _cairn.even_split(list(global_shape), dim, rank, world_size)


def _split_shards(state: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, tuple[Any, ...]]]:
    if not isinstance(state, Mapping):
        raise _invalid(
            f"state: a mapping of names to tensors or Shards, not a {type(state).__name__}"
        )
    tensors: dict[str, Any] = {}
    specs: dict[str, tuple[Any, ...]] = {}
    for name, value in flatten_state_dict(state).items():
        if isinstance(value, Shard):
            tensors[name] = value.tensor
            specs[name] = (list(value.global_shape), list(value.offsets))
        else:
            tensors[name] = value
    return tensors, specs


def save_sharded(
    dest: Union[Checkpoint, PathLike], rank: int, state: Mapping[str, Any]
) -> dict[str, Any]:
    """Rank ``rank``'s part of a sharded save into the uncommitted checkpoint ``dest``.

    ``state`` maps names to :class:`Shard` values (this rank's box of a
    global tensor) or plain tensors (whole tensors every rank may hold).
    Writes ``rank_NNNNN.safetensors`` (the rank in five digits) into
    ``dest`` durably and commits nothing: send the returned report (JSON
    values) to the committer, which calls :func:`commit_sharded` with every
    rank's. Ranks may call this concurrently, from threads or processes. GIL released.

    Raises:
        cairn.InvalidArgumentError: a box that leaves its global shape
            (naming the tensor), before anything is written.
        cairn.AlreadyExistsError: ``dest`` is committed.
    """
    flat, specs = _split_shards(state)
    tensors, _, keep = _readable(flat)
    report = _cairn.save_rank_shards(tensors, specs, _checkpoint_arg(dest), rank)
    del keep
    return report


def commit_sharded(
    dest: Union[Checkpoint, PathLike],
    reports: Sequence[Mapping[str, Any]],
    metrics: Optional[Mapping[str, Any]] = None,
) -> None:
    """Commits a sharded save once every rank's :func:`save_sharded` returned.

    Checks that each tensor's shards tile its global shape exactly (no gap,
    no overlap but identical replicas, one dtype), then writes the manifest
    with the global layout: only then is the checkpoint visible (durable).

    Raises:
        cairn.InvalidArgumentError: shards that leave a gap or overlap,
            naming the tensor and ranks.
    """
    _cairn.commit_sharded(
        _checkpoint_arg(dest),
        [dict(r) for r in reports],
        None if metrics is None else dict(metrics),
    )


def load_sharded(
    src: Union[Checkpoint, PathLike], state: Mapping[str, Any], *, strict: bool = True
) -> None:
    """Fills ``state``'s tensors in place from a committed sharded checkpoint.

    Any world size loads any other's save: a :class:`Shard` entry gets its
    box of the global tensor (read from every saved shard that overlaps it),
    a plain tensor the whole tensor. Tensors must be contiguous and writable,
    in host memory or (a build with CUDA) on a CUDA device. With ``strict``
    every entry must be found; a rank may load a subset of what was saved. GIL released.

    Raises:
        cairn.InvalidArgumentError: a missing tensor (strict), a dtype or
            global shape that differs, a box outside its tensor — listing each.
        cairn.CorruptionError: ``src`` is not a sharded checkpoint.
    """
    flat, specs = _split_shards(state)
    tensors = _writable(flat)
    reader = _cairn.ShardedReader(_checkpoint_arg(src))
    reader.load(tensors, specs, strict)
