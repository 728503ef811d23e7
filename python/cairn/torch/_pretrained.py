"""Hugging Face's weights layout (``save_pretrained`` / ``from_pretrained``),
written and read by the C++ LibTorch adapter and committed through Cairn."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, NamedTuple, Optional, Union

from cairn._checkpoint import Checkpoint
from cairn._tensors import _path
from cairn.errors import InvalidArgumentError
from cairn.torch._state import PathLike, _invalid, _is_tensor

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


class LoadResult(NamedTuple):
    """What :func:`load_pretrained` did not match (as torch's ``load_state_dict``)."""

    missing_keys: list[str]
    unexpected_keys: list[str]


def _extension() -> Any:
    import torch  # noqa: F401  (the extension is looked up for the torch imported)
    from cairn import _tensors

    ext = _tensors._torch_helpers()
    if ext is None or not hasattr(ext, "save_pretrained"):
        raise InvalidArgumentError(
            "save_pretrained / load_pretrained need cairn._cairn_torch built with the LibTorch "
            "adapter for this torch (docs/python.md, Install)",
            "failed_precondition",
        )
    return ext


def _shard_bytes(max_shard_size: Union[int, str]) -> int:
    """Bytes of ``max_shard_size``: an int, or transformers' strings ("5GB", "200MiB")."""
    if isinstance(max_shard_size, int):
        size = max_shard_size
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", max_shard_size.upper())
        if m is None or m.group(2) not in _UNITS:
            raise _invalid(f"max_shard_size: {max_shard_size!r} is not a size such as '5GB'")
        size = int(float(m.group(1)) * _UNITS[m.group(2)])
    if size <= 0:
        raise _invalid(f"max_shard_size: {max_shard_size!r} is not a positive size")
    return size


def _uri(where: Union[Checkpoint, PathLike], parameter: str) -> str:
    uri = where.uri if isinstance(where, Checkpoint) else _path(where)
    if uri.startswith("memory://"):
        # The adapter runs in cairn._cairn_torch with storage clients of its
        # own: its memory:// buckets are not those of the rest of cairn.
        raise _invalid(
            f"{parameter}: {uri}: memory:// is not supported here (use a folder or s3://)"
        )
    return uri


def _state_of(model: Any, parameter: str) -> Mapping[str, Any]:
    state = model if isinstance(model, Mapping) else getattr(model, "state_dict", None)
    if state is None:
        raise TypeError(
            f"{parameter}: a torch.nn.Module or a state dict, not {type(model).__name__}"
        )
    if not isinstance(state, Mapping):
        state = state()
    for name, value in state.items():
        if not isinstance(name, str):
            raise TypeError(f"{parameter}: key {name!r} is not a str")
        if not _is_tensor(value):
            raise TypeError(f"{parameter}: {name!r} is a {type(value).__name__}, not a tensor")
    return state


def _config_json(config: Any) -> bytes:
    if isinstance(config, Mapping):
        return (json.dumps(dict(config), indent=2, sort_keys=True) + "\n").encode()
    to_json = getattr(config, "to_json_string", None)
    if to_json is None:
        raise TypeError(
            f"config: a transformers PretrainedConfig or a dict, not {type(config).__name__}"
        )
    return to_json(use_diff=True).encode()


def save_pretrained(
    model: Any,
    dest: Union[Checkpoint, PathLike],
    *,
    config: Any = None,
    max_shard_size: Union[int, str] = "5GB",
    weights_name: str = "model.safetensors",
    metadata: Optional[Mapping[str, Any]] = None,
) -> list[str]:
    """Saves ``model``'s weights in Hugging Face's layout as a Cairn checkpoint.

    ``dest`` (a folder, a URI such as ``s3://bucket/model``, or an uncommitted
    :class:`cairn.Checkpoint`) receives ``weights_name`` when the weights fit
    one shard of ``max_shard_size`` bytes (an int or transformers' strings:
    ``"5GB"``, ``"200MiB"``), else ``model-00001-of-0000N.safetensors``... and
    ``model.safetensors.index.json``, split as transformers' ``save_pretrained``
    splits them; then ``config.json`` (``config``: a ``PretrainedConfig`` or a
    dict; by default ``model.config`` when ``model`` has one) and
    ``generation_config.json`` when the model has one. The C++ LibTorch adapter
    writes the weights (include/cairn/torch.h, ``save_pretrained``), then the
    checkpoint is committed: a manifest with every file's size and checksums,
    written last. ``transformers.AutoModel...from_pretrained(dest)`` reads the
    folder as it is. Tied weights (several names on one tensor) are written
    once, under the first name, as transformers writes them.

    Args:
        model: a ``torch.nn.Module`` (its ``state_dict()``) or a state dict of
            tensors (CPU tensors, or CUDA ones, which are copied to host memory).
        metadata: JSON values kept as the checkpoint's metadata
            (:meth:`cairn.Checkpoint.get_metadata`).

    Returns the files written (weights, index, then the config files).

    Raises:
        TypeError: ``model`` or ``config`` of a wrong kind (naming it).
        cairn.AlreadyExistsError: ``dest`` is already committed (nothing written).
        cairn.InvalidArgumentError: a bad ``max_shard_size`` or ``weights_name``,
            a tensor safetensors cannot hold (naming it), a ``memory://`` URI.
        cairn.Error: a write failed; nothing is committed then.
    """
    state = _state_of(model, "model")
    flat = {}
    seen: set[tuple[Any, ...]] = set()
    for name, value in state.items():
        # Tied weights (one storage, several names) are written once, under
        # the first name, as transformers writes them.
        key = (value.device, value.data_ptr(), value.dtype, tuple(value.shape), value.stride())
        if value.numel() > 0 and key in seen:
            continue
        seen.add(key)
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        flat[name] = t.contiguous()
    files: dict[str, bytes] = {}
    if config is None and not isinstance(model, Mapping):
        config = getattr(model, "config", None)
    if config is not None:
        files["config.json"] = _config_json(config)
    generation = None if isinstance(model, Mapping) else getattr(model, "generation_config", None)
    if generation is not None and hasattr(generation, "to_json_string"):
        files["generation_config.json"] = generation.to_json_string(use_diff=True).encode()
    user_metadata = None if metadata is None else json.dumps(dict(metadata))
    return _extension().save_pretrained(
        _uri(dest, "dest"),
        flat,
        _shard_bytes(max_shard_size),
        weights_name,
        {},
        files,
        user_metadata,
    )


def load_pretrained(
    src: Union[Checkpoint, PathLike],
    model: Any,
    *,
    strict: bool = True,
    weights_name: str = "model.safetensors",
) -> LoadResult:
    """Loads Hugging Face weights into ``model``'s tensors, in place.

    ``src`` is a folder or URI holding ``weights_name``'s index (sharded) or
    ``weights_name`` (what transformers' ``save_pretrained``, DCP's
    ``HuggingFaceStorageWriter`` or :func:`save_pretrained` wrote), or one
    ``.safetensors`` file. The C++ adapter reads it (``load_pretrained``):
    every tensor of every file is checked against the model first (names
    across shards, shapes, dtypes), and nothing is changed on an error. When
    the folder is a committed Cairn checkpoint, the files read are first
    checked against its manifest's checksums.

    Args:
        model: a ``torch.nn.Module`` (its ``state_dict()``, whose tensors share
            the parameters' memory) or a state dict of contiguous CPU tensors.
        strict: missing or unexpected tensors are an error. Weights tied to a
            loaded one (Hugging Face leaves ``lm_head.weight`` out when it is
            the embedding's) do not count as missing. For a model with tied
            weights that error comes after the matching tensors were loaded
            (shape, dtype and file errors still come before any change).

    Returns:
        LoadResult(missing_keys, unexpected_keys).

    Raises:
        cairn.NotFoundError: the folder holds neither the index nor the file.
        cairn.CorruptionError: the index names a shard that does not exist
            (naming the shard and its tensors) or is malformed; a file that
            fails its checksum (naming the file, the bytes and their tensors).
        cairn.InvalidArgumentError: a shape or dtype that differs from the
            model's, or (strict) missing or unexpected tensors, naming each
            tensor and file.
    """
    state = _state_of(model, "model")
    ext = _extension()
    # Tied weights: several names on one storage; one of them suffices.
    groups: dict[tuple[int, tuple[int, ...]], list[str]] = {}
    for name, t in state.items():
        groups.setdefault((t.data_ptr(), tuple(t.shape)), []).append(name)
    tied = [names for names in groups.values() if len(names) > 1]
    if not tied:
        missing, unexpected = ext.load_pretrained(
            _uri(src, "src"), dict(state), strict, weights_name
        )
        return LoadResult(missing, unexpected)
    missing, unexpected = ext.load_pretrained(_uri(src, "src"), dict(state), False, weights_name)
    missing_set = set(missing)
    for names in tied:
        if any(n not in missing_set for n in names):
            missing_set.difference_update(names)
    missing = [n for n in missing if n in missing_set]
    if strict and (missing or unexpected):
        raise _invalid(
            f"loading weights from {_uri(src, 'src')}: "
            + "; ".join(
                [f"{n} is missing from the files" for n in missing]
                + [f"{n} is in the files but not in the model" for n in unexpected]
            )
        )
    return LoadResult(missing, unexpected)
