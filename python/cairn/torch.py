"""PyTorch helpers over Cairn's C++ state engine (docs/python.md).

- :func:`save_state` / :func:`load_state`: a model's and an optimizer's
  ``state_dict()`` (every ``torch.optim`` optimizer, LBFGS included) in one
  safetensors file, restored bit for bit, so training resumes exactly.
- :class:`StateCheckpointManager`: numbered checkpoints of a dict of tensors
  with retention, restored in place with TensorFlow's ``assert_consumed``
  check (``tf.train.CheckpointManager``'s contract).
- :class:`AsyncSaver`: saves that return once the tensors are copied; the
  writing and the commit run in the background.
- :func:`save_sharded` / :func:`commit_sharded` / :func:`load_sharded`: each
  rank saves its shards; any number of ranks loads them back (re-sharding,
  as ``torch.distributed.checkpoint`` does).

Every call does its work in the C++ core with the GIL released, so other
Python threads run meanwhile. ``import cairn`` does not import torch; this
module imports it only when a function needs it (state of numpy arrays works
without torch).
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any, NamedTuple, Optional, Union

from cairn import _cairn
from cairn._args import check_public as _check_public
from cairn._checkpoint import Checkpoint
from cairn._manager import CheckpointManager, CheckpointRecord
from cairn._tensors import (
    _describe,
    _describe_all,
    _gc_paused,
    _path,
    flatten_state_dict,
    load,
    load_metadata,
    save,
)
from cairn.errors import CorruptionError, InvalidArgumentError, NotFoundError

__all__ = [
    "save_state",
    "load_state",
    "StateCheckpointManager",
    "AsyncSaver",
    "SaveHandle",
    "Shard",
    "even_split",
    "save_sharded",
    "commit_sharded",
    "load_sharded",
]

PathLike = Union[str, "os.PathLike[str]"]

# The key of save_state()'s own part of the file's JSON metadata.
_META_KEY = "cairn.torch"
_FORMAT = "cairn.torch/1"
# Tags of the JSON encoding of non-tensor state (see _encode).
_TUPLE = "__cairn.tuple__"
_DICT = "__cairn.dict__"
_FLOAT = "__cairn.float__"
_TENSOR = "__cairn.tensor__"
_TAGS = (_TUPLE, _DICT, _FLOAT, _TENSOR)


def _invalid(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, "invalid_argument")


# ---- model and optimizer state --------------------------------------------


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.split(".")[0] == "torch" and hasattr(value, "data_ptr")


def _encode(value: Any, name: str, tensors: dict[str, Any]) -> Any:
    """``value`` as JSON, its tensors moved into ``tensors`` under dotted names.

    Types survive the trip: int stays int and float float (inf and nan
    included), tuples stay tuples, dict keys keep their type and order, and
    a tensor anywhere (a 0-d ``step`` too) is stored in the file bit for bit.
    """
    if _is_tensor(value):
        if name in tensors:
            raise _invalid(f"tensor {name!r}: two entries of the state have this name")
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        tensors[name] = t.contiguous()
        return {_TENSOR: name}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {_FLOAT: repr(float(value))}
    if isinstance(value, tuple):
        return {_TUPLE: [_encode(v, f"{name}.{i}", tensors) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, f"{name}.{i}", tensors) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        items = []
        for k, v in value.items():
            if not (k is None or isinstance(k, (bool, int, float, str, tuple))):
                raise TypeError(f"{name}: a dict key of type {type(k).__name__} cannot be saved")
            items.append([_encode(k, f"{name}.<key>", {}), _encode(v, f"{name}.{k}", tensors)])
        return {_DICT: items}
    raise TypeError(
        f"{name}: a {type(value).__module__}.{type(value).__name__} is not a tensor "
        "or a JSON value (None, bool, int, float, str, list, tuple, dict)"
    )


def _decode(j: Any, tensors: Mapping[str, Any], where: str) -> Any:
    if isinstance(j, list):
        return [_decode(v, tensors, where) for v in j]
    if isinstance(j, dict):
        if len(j) == 1:
            ((tag, inner),) = j.items()
            if tag == _TENSOR:
                if inner not in tensors:
                    raise CorruptionError(
                        f"{where}: the metadata names tensor {inner!r}, which "
                        "the file does not hold",
                        "corruption",
                    )
                return tensors[inner]
            if tag == _TUPLE:
                return tuple(_decode(v, tensors, where) for v in inner)
            if tag == _FLOAT:
                return float(inner)
            if tag == _DICT:
                return {_decode(k, tensors, where): _decode(v, tensors, where) for k, v in inner}
        raise CorruptionError(
            f"{where}: malformed {_META_KEY} metadata (an untagged object)", "corruption"
        )
    return j


def _state_dict_of(obj: Any) -> Mapping[str, Any]:
    return obj if isinstance(obj, Mapping) else obj.state_dict()


def save_state(
    path: PathLike,
    model: Any = None,
    optimizer: Any = None,
    *,
    extra: Optional[Mapping[str, Any]] = None,
    metadata: Optional[Mapping[str, Any]] = None,
    durable: bool = True,
) -> None:
    """Saves a model's and an optimizer's state in one safetensors file.

    Args:
        path: a local path or a file's URI (``s3://bucket/run/state.safetensors``),
            as for :func:`cairn.save`.
        model: a ``torch.nn.Module`` (its ``state_dict()``) or a state dict.
        optimizer: a ``torch.optim.Optimizer`` (its ``state_dict()``) or an
            optimizer state dict. Every optimizer of ``torch.optim`` works.
        extra: more state to restore with it (an LR scheduler's
            ``state_dict()``, RNG states, an EMA's tensors, ...): tensors and
            JSON-like values, nested.
        metadata: JSON values (epoch, loss, ...) for the file's metadata, read
            back by :func:`load_state` or :func:`cairn.load_metadata`. The key
            ``"cairn.torch"`` is this module's.

    Tensors are stored in the file under flattened names: ``model.<key>``,
    ``optimizer.state.<param id>.<key>`` (LBFGS's history lists as
    ``.<key>.<i>``), ``extra.<key>``; everything else (param groups, python
    numbers such as an ``int`` or ``float`` step, ``None``, tuples) in the
    file's JSON metadata under ``"cairn.torch"``, typed so that it comes
    back as it was. Tensors on a device are copied to host memory first.

    Durability: as :func:`cairn.save` (written beside ``path``, fsync'd,
    renamed over it). Thread safety: the model and optimizer must not change
    during the call.

    Raises:
        TypeError: a value that is neither a tensor nor a JSON value (naming
            where it is), before anything is written.
        cairn.InvalidArgumentError: a tensor safetensors cannot hold (dtype,
            layout), or ``metadata`` using the key ``"cairn.torch"``.
        cairn.Error: the write failed; an earlier file at ``path`` is intact.
    """
    tensors: dict[str, Any] = {}
    own: dict[str, Any] = {"format": _FORMAT}
    if model is not None:
        sd = _state_dict_of(model)
        own["model"] = _encode(sd, "model", tensors)
        version_info = getattr(sd, "_metadata", None)
        if version_info is not None:
            own["model_versions"] = _encode(version_info, "model._metadata", {})
    if optimizer is not None:
        own["optimizer"] = _encode(_state_dict_of(optimizer), "optimizer", tensors)
        if not isinstance(optimizer, Mapping):
            own["optimizer_type"] = type(optimizer).__qualname__
    if extra is not None:
        own["extra"] = _encode(dict(extra), "extra", tensors)
    meta = dict(metadata or {})
    if _META_KEY in meta:
        raise _invalid(f"metadata key {_META_KEY!r} is reserved for cairn.torch")
    meta[_META_KEY] = own
    save(tensors, path, meta, durable=durable)


def load_state(
    path: PathLike,
    model: Any = None,
    optimizer: Any = None,
    *,
    extra: Optional[MutableMapping[str, Any]] = None,
    strict: bool = True,
) -> dict[str, Any]:
    """Restores what :func:`save_state` saved, bit for bit; returns the metadata.

    Args:
        path: the file, as for :func:`save_state`.
        model: a ``torch.nn.Module``: ``model.load_state_dict(saved, strict)``.
        optimizer: a ``torch.optim.Optimizer`` of the saved type, over the same
            parameter groups: ``optimizer.load_state_dict(saved)``.
        extra: a dict updated with the saved ``extra`` state.
        strict: as ``load_state_dict(strict=...)`` for the model.

    After it returns the model's tensors hold exactly the saved bytes and the
    optimizer exactly the saved state (tensors, python ints and floats and
    param groups as they were), so the next steps are those of the run that
    saved. Tensors are loaded into host memory; ``load_state_dict`` moves
    them to the parameters' devices.

    Returns:
        The ``metadata`` given to :func:`save_state` (``{}`` if none).

    Raises:
        cairn.InvalidArgumentError: the file lacks a part asked for (no model,
            no optimizer), or the optimizer is of another type.
        cairn.NotFoundError, cairn.CorruptionError: as :func:`cairn.load`.
        RuntimeError: torch's ``load_state_dict`` refused the state (keys or
            shapes differ), before changing anything.
    """
    where = os.fspath(path)
    meta = load_metadata(path)
    own = meta.pop(_META_KEY, None)
    if not isinstance(own, dict) or own.get("format") != _FORMAT:
        raise _invalid(
            f"{where}: not a file written by cairn.torch.save_state "
            f"(no {_META_KEY!r} metadata of format {_FORMAT})"
        )
    for part, obj in (("model", model), ("optimizer", optimizer), ("extra", extra)):
        if obj is not None and part not in own:
            raise _invalid(f"{where}: holds no {part} state")
    saved_type = own.get("optimizer_type")
    if (
        optimizer is not None
        and saved_type is not None
        and not isinstance(optimizer, Mapping)
        and type(optimizer).__qualname__ != saved_type
    ):
        raise _invalid(
            f"{where}: the optimizer saved was {saved_type}, not {type(optimizer).__qualname__}"
        )
    tensors = load(path)
    if model is not None:
        sd = OrderedDict(_decode(own["model"], tensors, where))
        if "model_versions" in own:
            versions = OrderedDict(_decode(own["model_versions"], {}, where))
            sd._metadata = versions  # type: ignore[attr-defined]
        model.load_state_dict(sd, strict=strict)
    if optimizer is not None:
        optimizer.load_state_dict(_decode(own["optimizer"], tensors, where))
    if extra is not None:
        extra.update(_decode(own["extra"], tensors, where))
    return meta


# ---- tensors handed to the C++ core by address ------------------------------


def _flat(state: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(state, Mapping):
        raise _invalid(f"state: a mapping of names to tensors, not a {type(state).__name__}")
    return flatten_state_dict(state)


def _readable(state: Mapping[str, Any]) -> tuple[list[tuple[Any, ...]], str, list[Any]]:
    """Described tensors for a save, the file's format ("pt" or "np"), and
    what keeps their memory alive."""
    flat = _flat(state)
    with _gc_paused():
        return _describe_all(flat)


def _writable_one(name: str, value: Any) -> tuple[Any, ...]:
    if _is_tensor(value):
        if value.device.type != "cpu" and not (value.device.type == "cuda" and _cairn.CUDA):
            raise _invalid(
                f"tensor {name!r}: on {value.device}; restore into a CPU tensor "
                "and copy it over"
                + (" (this Cairn was built without CUDA)" if value.device.type == "cuda" else "")
            )
    elif type(value).__module__.split(".")[0] == "numpy":
        # A numpy scalar is read-only too: a copy would take the values.
        if not value.flags.writeable:
            raise _invalid(f"tensor {name!r}: a read-only array cannot be restored into")
    return _describe(name, value)


def _writable(state: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """Described tensors to copy into in place (contiguous, host memory).

    The caller keeps ``state`` alive while the engine writes into it.
    """
    flat = _flat(state)
    with _gc_paused():
        described, _, _ = _describe_all(flat, _writable_one)
    return described


def _checkpoint_arg(dest: Union[Checkpoint, PathLike]) -> _cairn.Checkpoint:
    return (
        dest._impl
        if isinstance(dest, Checkpoint)
        else _cairn.Checkpoint.from_directory(_path(dest))
    )


def _record(r: Optional[_cairn.CheckpointRecord]) -> Optional[CheckpointRecord]:
    return None if r is None else CheckpointRecord(r)


class SaveHandle:
    """A background save: poll :meth:`done`, or :meth:`wait` for it.

    Thread safety: may be used from any thread.
    """

    __slots__ = ("_impl",)

    def __init__(self, impl: _cairn.SaveHandle) -> None:
        self._impl = impl

    def done(self) -> bool:
        """True once the save committed or failed (or was skipped); never blocks."""
        return self._impl.done()

    def skipped(self) -> bool:
        """True when the save was skipped (``when_busy="skip"``): nothing is written."""
        return self._impl.skipped()

    def wait(self) -> Optional[CheckpointRecord]:
        """Blocks until the save is committed, with the GIL released.

        Returns:
            The new checkpoint's record for a save into a manager, else None.

        Raises:
            cairn.Error: the save failed (the subclass of its C++ code, its
                message unchanged); nothing of it is visible, and earlier
                checkpoints are intact.
        """
        self._impl.wait()
        return _record(self._impl.record)

    @property
    def checkpoint(self) -> Checkpoint:
        """Where the save goes (FailedPreconditionError for a skipped save)."""
        return Checkpoint(self._impl.checkpoint)


class StateCheckpointManager:
    """Numbered checkpoints of a dict of tensors, as ``tf.train.CheckpointManager``.

    ``state`` is a mapping of names to ``torch.Tensor`` or ``numpy.ndarray``
    values, nested dicts flattened with dots. A model's weights are
    ``model.state_dict()`` (its tensors share the parameters' memory, so a
    restore into them restores the model in place); for an optimizer's full
    state (param groups, python scalars) use :func:`save_state`.

    Each checkpoint is ``directory/checkpoint_NNNNNN/state.safetensors``,
    committed manifest-last by the C++ ``cairn::StateCheckpointManager``:
    durable when :meth:`save` returns; a failed save loses nothing earlier
    and leaves nothing visible. Retention: ``max_to_keep`` newest (or best by
    ``best_metric``), plus one every ``keep_checkpoint_every_n_hours``
    (pinned). ``checkpoint_interval`` skips saves fewer steps after the last.

    :meth:`restore` readies :meth:`save_async`'s staging memory for the
    restored state on a background thread (``prepare_async_on_restore``),
    so that the first asynchronous save of a resumed run stalls for a copy
    of the state, not for the first touch of fresh memory; a synchronous
    :meth:`save` before any :meth:`save_async` frees it. A :meth:`restore`
    that finds no checkpoint (a fresh run's restore-or-start) readies it for
    the state it was given before raising; a fresh run that does not try a
    restore calls :meth:`reserve` for the same.

    Opening takes the directory's lock (``cairn.LockedError`` while another
    manager holds it); :meth:`close` or leaving a ``with`` block releases it.
    Calls from several threads are serialized.
    """

    def __init__(
        self,
        directory: PathLike,
        *,
        max_to_keep: Optional[int] = None,
        keep_checkpoint_every_n_hours: Optional[float] = None,
        checkpoint_interval: Optional[int] = None,
        best_metric: Optional[str] = None,
        best_mode: str = "max",
        max_in_flight: int = 1,
        when_busy: str = "wait",
        prepare_async_on_restore: bool = True,
    ) -> None:
        self._impl = _cairn.StateCheckpointManager(
            directory,
            max_to_keep,
            keep_checkpoint_every_n_hours,
            checkpoint_interval,
            best_metric or "",
            best_mode,
            max_in_flight,
            when_busy,
            prepare_async_on_restore,
        )

    def save(
        self,
        step: Optional[int],
        state: Mapping[str, Any],
        *,
        metrics: Optional[Mapping[str, Any]] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        force: bool = False,
    ) -> Optional[CheckpointRecord]:
        """Saves ``state`` as checkpoint of ``step``; None when skipped by the interval.

        ``step`` None is one more than the last saved (0 first). ``metrics``
        (JSON values, plus ``step``) rank checkpoints for ``best_metric``;
        ``metadata`` (JSON values, plus ``step``) is stored in the file and
        handed back by :meth:`restore`. The tensors must not change during
        the call; the GIL is released while it writes.

        Raises:
            cairn.InvalidArgumentError: a value that is not a tensor (naming
                it), a ``best_metric`` that is not a number, before any write.
            cairn.Error: the write failed; nothing committed earlier is lost.
        """
        tensors, _, keep = _readable(state)
        r = self._impl.save(
            tensors,
            None if metadata is None else dict(metadata),
            step,
            None if metrics is None else dict(metrics),
            force,
        )
        del keep
        return _record(r)

    def save_async(
        self,
        step: Optional[int],
        state: Mapping[str, Any],
        *,
        metrics: Optional[Mapping[str, Any]] = None,
        metadata: Optional[Mapping[str, Any]] = None,
        force: bool = False,
    ) -> Optional[SaveHandle]:
        """As :meth:`save`, returning once the tensors are copied (see :class:`AsyncSaver`).

        The caller may change the tensors as soon as this returns. Errors
        surface on the handle, or on the next save, :meth:`wait` or
        :meth:`close`.
        """
        tensors, _, keep = _readable(state)
        h = self._impl.save_async(
            tensors,
            None if metadata is None else dict(metadata),
            step,
            None if metrics is None else dict(metrics),
            force,
        )
        del keep
        return None if h is None else SaveHandle(h)

    def reserve(
        self, state: Mapping[str, Any], *, metadata: Optional[Mapping[str, Any]] = None
    ) -> None:
        """Readies :meth:`save_async` for states like ``state``, without waiting.

        Only the tensors' names, dtypes and shapes (and ``metadata``) matter,
        not their values. The staging memory a save copies into is allocated
        and touched on the saver's own thread, so that the first
        :meth:`save_async` stalls for a copy of the state rather than for the
        first touch of fresh memory, several times longer. Call it once the
        state exists (after building the model and optimizer); a
        :meth:`save_async` issued before that work ends waits for the rest.
        The next :meth:`save_async` or :meth:`wait` raises what failed.
        """
        tensors, _, keep = _readable(state)
        self._impl.reserve(tensors, None if metadata is None else dict(metadata))
        del keep

    def wait(self) -> None:
        """Waits for async saves (GIL released); raises an error not yet seen."""
        self._impl.wait()

    def restore(
        self,
        state: Mapping[str, Any],
        *,
        checkpoint: Optional[CheckpointRecord] = None,
        metadata: Optional[MutableMapping[str, Any]] = None,
    ) -> int:
        """Copies the latest checkpoint (or ``checkpoint``) into ``state``'s tensors in place.

        Every tensor must be contiguous and writable, in host memory or, when
        Cairn was built with CUDA (``cairn.CUDA``), on a CUDA device (read
        through pinned bounce buffers, after the work queued on the device's
        current stream; the copies are complete on return). The
        check is TensorFlow's ``assert_consumed``: every saved tensor must
        have an entry of the same dtype and shape and every entry a saved
        tensor, else :class:`cairn.InvalidArgumentError` listing each
        missing, unexpected and mismatched tensor, and nothing is written.
        The file's checksum is checked against the manifest.

        Args:
            metadata: a dict updated with the saved metadata (and ``step``).

        Returns:
            The restored checkpoint's step.

        Raises:
            cairn.NotFoundError: there is no checkpoint.
            cairn.CorruptionError: the file does not match its manifest.
        """
        tensors = _writable(state)
        which = None
        if checkpoint is not None:
            which = next((r for r in self._impl.checkpoints() if r.name == checkpoint.name), None)
            if which is None:
                raise NotFoundError(
                    f"{self.uri}: no kept checkpoint {checkpoint.name}", "not_found"
                )
        step, meta, _ = self._impl.restore(tensors, which)
        if metadata is not None:
            metadata.update(meta)
        return step

    @property
    def latest(self) -> Optional[CheckpointRecord]:
        """The newest committed checkpoint, or None."""
        return _record(self._impl.latest())

    @property
    def checkpoints(self) -> list[CheckpointRecord]:
        """The kept checkpoints, oldest first."""
        return [CheckpointRecord(r) for r in self._impl.checkpoints()]

    def best(self) -> list[CheckpointRecord]:
        """The kept checkpoints, best first (by ``best_metric``, else newest first)."""
        return [CheckpointRecord(r) for r in self._impl.best()]

    @property
    def last_step(self) -> Optional[int]:
        """The last step saved (or being saved), if any."""
        return self._impl.last_step

    @property
    def uri(self) -> str:
        return self._impl.uri

    def close(self) -> None:
        """Waits for async saves (raising an error not yet seen), then releases the lock."""
        self._impl.close()

    def __enter__(self) -> StateCheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncSaver:
    """Saves that return once the state is copied; writes and commits run behind.

    ``save()`` returns when every tensor has been copied into staging memory
    (allocated once, then reused): the caller may change its tensors right
    away. The write (durable), the manifest and, for a manager, retention run
    on a background thread. At most ``max_in_flight`` saves are pending;
    ``when_busy`` says what a save beyond them does: ``"wait"`` (block),
    ``"extra_buffer"`` (copy into another buffer, up to
    ``max_staging_buffers``) or ``"skip"`` (write nothing; a handle whose
    ``skipped()`` is True). Saves commit in the order they were made.

    Errors are never lost: a failed save's error is raised by its handle's
    :meth:`SaveHandle.wait`, else by the next :meth:`save`, :meth:`wait_all`
    or :meth:`close`. Thread safety: calls from several threads are
    serialized. A ``cairn.CheckpointManager`` given to :meth:`save` is kept
    open until that save is done, even if closed meanwhile; its lock is then
    released at this saver's next call, :meth:`wait_all` or :meth:`close`.
    """

    def __init__(
        self, *, max_in_flight: int = 1, when_busy: str = "wait", max_staging_buffers: int = 0
    ) -> None:
        self._impl = _cairn.AsyncSaver(max_in_flight, when_busy, max_staging_buffers)

    def save(
        self,
        state: Mapping[str, Any],
        dest: Union[CheckpointManager, Checkpoint, PathLike],
        *,
        metrics: Optional[Mapping[str, Any]] = None,
        metadata: Optional[Mapping[str, Any]] = None,
    ) -> SaveHandle:
        """Snapshots ``state`` and saves it in the background as ``state.safetensors``.

        Args:
            state: names to tensors (torch or numpy, nested dicts flattened
                with dots). With a build with CUDA (``cairn.CUDA``), CUDA
                tensors are copied by the GPU into the saver's pinned staging
                after the work queued on their device's current stream, and
                the copy is complete when this returns; otherwise they are
                copied to host memory (``tensor.cpu()``) first.
            dest: a ``cairn.CheckpointManager`` (its next checkpoint, with
                retention applied after the commit), or a new checkpoint
                folder (a path, URI or ``cairn.Checkpoint``, committed with a
                manifest; ``cairn.AlreadyExistsError`` if already committed).
            metrics: JSON values recorded with the checkpoint.
            metadata: JSON values stored in the file (and as the checkpoint's
                metadata).

        Raises:
            cairn.Error: an earlier save's error not yet seen, or bad arguments
                (naming the tensor), before any snapshot.
        """
        tensors, fmt, keep = _readable(state)
        strings = {"format": fmt}
        meta = None if metadata is None else dict(metadata)
        mets = None if metrics is None else dict(metrics)
        if isinstance(dest, CheckpointManager):
            h = self._impl.save_to_manager(tensors, meta, strings, dest._impl, mets)
        else:
            h = self._impl.save(tensors, meta, strings, _checkpoint_arg(dest), mets)
        del keep
        return SaveHandle(h)

    def reserve(
        self,
        state: Mapping[str, Any],
        *,
        metadata: Optional[Mapping[str, Any]] = None,
        buffers: int = 1,
        background: bool = True,
    ) -> None:
        """Allocates and touches the staging for saves of states like ``state``.

        Only the tensors' names, dtypes and shapes (and ``metadata``) matter.
        The first :meth:`save` then stalls for a copy of the state, not for
        the first touch of fresh memory (several times longer). With
        ``background`` (the default) the work runs on the saver's own thread
        and this returns at once; the next call to the saver waits for it
        (a save issued sooner stalls for the rest) and raises what failed.
        ``buffers``: how many saves' staging (at most ``max_in_flight``, or
        ``max_staging_buffers`` with ``when_busy="extra_buffer"``).
        """
        tensors, fmt, keep = _readable(state)
        self._impl.reserve(
            tensors,
            None if metadata is None else dict(metadata),
            {"format": fmt},
            buffers,
            background,
        )
        del keep

    def wait_all(self) -> None:
        """Waits for every pending save (GIL released); raises the first error not yet seen."""
        self._impl.wait_all()

    def close(self) -> None:
        """:meth:`wait_all`, then stops; later saves are FailedPreconditionError."""
        self._impl.close()

    def stats(self) -> dict[str, Any]:
        """Saves, skips, waits, staging bytes (and how many are pinned for a
        GPU's copies) and the caller's stall (seconds)."""
        return self._impl.stats()

    def __enter__(self) -> AsyncSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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


# A wrong type in a public call is a TypeError naming the parameter.
_check_public(globals())
