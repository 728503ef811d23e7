"""Model and optimizer state in one safetensors file (save_state/load_state),
and the tensors handed to the C++ core by address."""

from __future__ import annotations

import math
import os
from collections import OrderedDict
from collections.abc import Mapping, MutableMapping
from typing import Any, Optional, Union

from cairn import _cairn
from cairn._checkpoint import Checkpoint
from cairn._manager import CheckpointRecord
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
from cairn.errors import CorruptionError, InvalidArgumentError

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
