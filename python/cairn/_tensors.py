"""Tensor files: ``cairn.save`` and ``cairn.load``.

A state dict of ``torch.Tensor`` or ``numpy.ndarray`` values is written as a
safetensors file by Cairn's C++ engine, the same file its C++ API writes:
durable on return, replaced atomically, readable by any safetensors reader.
Tensor memory is handed to the engine by address (no copy in Python); a
mapped load returns tensors that view the file's mapping.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, Union

from cairn import _cairn
from cairn.errors import InvalidArgumentError

__all__ = ["save", "load", "load_metadata", "flatten_state_dict"]

PathLike = Union[str, "os.PathLike[str]"]

# torch dtype name -> safetensors dtype, and back.
_TORCH_TO_FILE = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "int16": "I16",
    "uint16": "U16",
    "float16": "F16",
    "bfloat16": "BF16",
    "int32": "I32",
    "uint32": "U32",
    "float32": "F32",
    "float64": "F64",
    "int64": "I64",
    "uint64": "U64",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}
_FILE_TO_TORCH = {v: k for k, v in _TORCH_TO_FILE.items()}
# numpy dtype name -> safetensors dtype (numpy has no bfloat16 or float8).
_NUMPY_TO_FILE = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "int16": "I16",
    "uint16": "U16",
    "float16": "F16",
    "int32": "I32",
    "uint32": "U32",
    "float32": "F32",
    "float64": "F64",
    "int64": "I64",
    "uint64": "U64",
}
_FILE_TO_NUMPY = {v: k for k, v in _NUMPY_TO_FILE.items()}


def flatten_state_dict(state_dict: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts flattened with dots, as PyTorch names parameters.

    ``{"model": {"w": t}}`` becomes ``{"model.w": t}``. Keys must be ``str``;
    two paths that flatten to the same name are an
    :class:`~cairn.InvalidArgumentError` naming it.
    """
    out: dict[str, Any] = {}

    def walk(d: Mapping[str, Any], at: str) -> None:
        for key, value in d.items():
            if not isinstance(key, str):
                raise InvalidArgumentError(
                    f"state dict key {key!r} at {at or 'the top'!r}: keys must be str, "
                    f"not {type(key).__name__}",
                    "invalid_argument",
                )
            name = f"{at}.{key}" if at else key
            if isinstance(value, Mapping):
                walk(value, name)
            elif name in out:
                raise InvalidArgumentError(
                    f"tensor {name!r}: two entries of the state dict have this name once "
                    "nested dicts are joined with dots",
                    "invalid_argument",
                )
            else:
                out[name] = value

    walk(state_dict, prefix)
    return out


# torch.dtype -> safetensors dtype, built on first use (torch is imported
# only where the caller uses it).
_torch_dtypes: dict[Any, str] = {}


def _torch_file_dtype(dtype: Any) -> str | None:
    if not _torch_dtypes:
        import torch

        for name, file_dtype in _TORCH_TO_FILE.items():
            if hasattr(torch, name):
                _torch_dtypes[getattr(torch, name)] = file_dtype
    return _torch_dtypes.get(dtype)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block, as it was after.

    Making 100,000 tensors (each tracked by the collector) or the tuples
    that describe them would otherwise run many collections over every
    object alive, doubling the per-tensor cost; nothing made here is
    cyclic garbage.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


_NOT_LOOKED = object()
_helpers: Any = _NOT_LOOKED


def _torch_helpers() -> Any:
    """``cairn._cairn_torch`` if it was built for the torch this process runs, else None.

    The module does the per-tensor work of :func:`save` and :func:`load` in
    C++ against LibTorch; it is built for the torch of the interpreter the
    package is built for (a torch wheel carries LibTorch's headers and CMake
    files), and loaded only under that same torch (a second LibTorch in one
    process is never safe).
    Without it the same work is done in Python, slower for many tensors.
    """
    global _helpers
    if _helpers is _NOT_LOOKED:
        torch = sys.modules.get("torch")
        if torch is None:
            return None  # no torch tensors yet; look again once torch is imported
        _helpers = None
        try:
            from cairn import _torch_target
        except ImportError:
            return None
        if (
            torch.__version__ == _torch_target.TORCH_VERSION
            and os.path.realpath(torch.__file__) == _torch_target.TORCH_INIT
        ):
            from cairn import _cairn_torch

            _helpers = _cairn_torch
    return _helpers


def _describe(name: str, value: Any) -> tuple[Any, ...]:
    """(name, file dtype, shape, address, nbytes, keep-alive) of one tensor.

    A CUDA tensor, in a build with CUDA (``_cairn.CUDA``), has its device
    index after those (:func:`_describe_all` adds that device's current
    stream, asked once per device).
    """
    # The common case first, in as few calls as can be (a state dict may
    # hold 100,000 tensors): a dense, contiguous CPU tensor with an ASCII name.
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor) and name.isascii():
        file_dtype = _torch_file_dtype(value.dtype)
        if (
            file_dtype is not None
            and value.is_cpu
            and value.layout == torch.strided
            and value.is_contiguous()
        ):
            return (
                name,
                file_dtype,
                tuple(value.shape),
                value.data_ptr(),
                value.numel() * value.element_size(),
                value,
            )
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError(
            f"tensor name {name!r} is not valid UTF-8 (safetensors names are UTF-8)",
            "invalid_argument",
        ) from None
    kind = type(value).__module__.split(".")[0]
    if kind == "torch":
        import torch

        if not isinstance(value, torch.Tensor):
            raise InvalidArgumentError(
                f"tensor {name!r}: a {type(value).__name__} is not a tensor", "invalid_argument"
            )
        dtype = str(value.dtype).removeprefix("torch.")
        if dtype not in _TORCH_TO_FILE:
            raise InvalidArgumentError(
                f"tensor {name!r}: dtype {value.dtype} has no safetensors type "
                f"(supported: {', '.join(sorted(_TORCH_TO_FILE))})",
                "invalid_argument",
            )
        if value.layout != torch.strided:
            raise InvalidArgumentError(
                f"tensor {name!r}: a {value.layout} tensor; save its dense form "
                "(tensor.to_dense())",
                "invalid_argument",
            )
        on_cuda = value.device.type == "cuda" and _cairn.CUDA
        if value.device.type != "cpu" and not on_cuda:
            # The engine reads host memory: one copy off the device.
            value = value.detach().cpu()
        if not value.is_contiguous():
            raise InvalidArgumentError(
                f"tensor {name!r}: not contiguous (strides {tuple(value.stride())} for shape "
                f"{tuple(value.shape)}); save tensor.contiguous(), which copies it",
                "invalid_argument",
            )
        if on_cuda:
            # By device address: the engine copies it with the GPU's copy
            # engines, after the work queued on the current stream.
            return (
                name,
                _TORCH_TO_FILE[dtype],
                tuple(value.shape),
                value.data_ptr(),
                value.numel() * value.element_size(),
                value,
                value.device.index,
            )
        return (
            name,
            _TORCH_TO_FILE[dtype],
            tuple(value.shape),
            value.data_ptr(),
            value.numel() * value.element_size(),
            value,
        )
    if kind == "numpy":
        import numpy as np

        if not isinstance(value, np.ndarray):
            value = np.asarray(value)  # numpy scalars
        dtype = value.dtype.name
        if dtype not in _NUMPY_TO_FILE or value.dtype.byteorder == ">":
            raise InvalidArgumentError(
                f"tensor {name!r}: numpy dtype {value.dtype.str} has no safetensors type "
                f"(supported, little-endian: {', '.join(sorted(_NUMPY_TO_FILE))})",
                "invalid_argument",
            )
        if not value.flags.c_contiguous:
            raise InvalidArgumentError(
                f"tensor {name!r}: not C-contiguous (strides {value.strides} for shape "
                f"{value.shape}); save numpy.ascontiguousarray(a), which copies it",
                "invalid_argument",
            )
        return (
            name,
            _NUMPY_TO_FILE[dtype],
            tuple(value.shape),
            value.__array_interface__["data"][0],
            value.nbytes,
            value,
        )
    if kind in ("tensorflow", "keras", "tf_keras"):
        from cairn.tensorflow._tensors import describe

        return describe(name, value)
    raise InvalidArgumentError(
        f"tensor {name!r}: a {type(value).__module__}.{type(value).__name__} is not a "
        "torch.Tensor, numpy.ndarray, tf.Tensor, tf.Variable or keras.Variable",
        "invalid_argument",
    )


def save(
    state_dict: Mapping[str, Any],
    path: PathLike,
    metadata: Mapping[str, Any] | None = None,
    *,
    durable: bool = True,
) -> None:
    """Write ``state_dict`` as a safetensors file at ``path``.

    Args:
        state_dict: names to ``torch.Tensor``, ``numpy.ndarray``, ``tf.Tensor``,
            ``tf.Variable`` or ``keras.Variable`` values, in any mix; nested dicts
            are flattened with dots (:func:`flatten_state_dict`). TensorFlow
            values are read through their host buffer (no copy; a variable's
            current value; a GPU tensor is copied to host memory first).
            Every dtype both sides have is supported, ``bfloat16`` and float8
            included (torch). Tensors must be contiguous and dense. CUDA
            tensors are copied to host memory by the engine through pinned
            staging, after the work queued on their device's current stream,
            when Cairn was built with CUDA (``cairn.CUDA``); otherwise by
            ``tensor.cpu()`` first.
        path: a local path, or the URI of a file in a store
            (``s3://bucket/folder/model.safetensors``, ``memory://...``, ``file://...``).
        metadata: JSON-serializable values (epoch, step, loss, ...) stored in the
            file's header, read back with :func:`load_metadata`.
        durable: fsync the file and its folder before returning (local paths;
            stores are always durable on return).

    The file is written next to ``path`` and renamed over it: a reader sees the
    old file or the new one, never a mix. A file of torch tensors says
    ``format: pt`` (as Hugging Face writes), one of numpy arrays ``format: np``.
    The tensors must not change until the call returns; the GIL is released
    while the engine writes, so other Python threads run.

    Raises:
        cairn.InvalidArgumentError: a value that is not a tensor, a dtype
            safetensors lacks, a non-contiguous tensor or a name that is not
            UTF-8 — naming the tensor, before anything is written.
        cairn.Error: the write failed (naming the file); the old file, if any,
            is untouched.
    """
    if not isinstance(state_dict, Mapping):
        raise InvalidArgumentError(
            f"state_dict: a mapping of names to tensors, not a {type(state_dict).__name__}",
            "invalid_argument",
        )
    with _gc_paused():
        described, fmt, kept = _describe_all(flatten_state_dict(state_dict))
    _cairn.save_tensors(
        described,
        _path(path),
        None if metadata is None else dict(metadata),
        {"format": fmt},
        durable,
    )
    del kept, described  # the engine no longer reads them


def _describe_all(
    flat: dict[str, Any], describe_one: Callable[[str, Any], tuple[Any, ...]] = _describe
) -> tuple[list[Any], str, list[Any]]:
    """(what the engine takes, the file's format, what must stay alive) for ``flat``.

    ``describe_one`` describes (and checks) a tensor the C++ helpers did not
    take, as :func:`_describe` does.
    """
    helpers = _torch_helpers()
    # Dense CPU torch tensors are described in C++ when the helpers are
    # there; the rest (numpy, devices, every error) here. `flat` and
    # `kept` hold what the engine reads until it returns.
    described = helpers.describe(flat) if helpers is not None else [None] * len(flat)
    kept = []
    fmt = "pt" if not flat or any(d is not None for d in described) else "np"
    if any(d is None for d in described):
        kinds = set()
        streams: dict[int, int] = {}  # CUDA device -> its current stream
        for i, (name, value) in enumerate(flat.items()):
            if described[i] is None:
                entry = describe_one(name, value)
                described[i] = entry[:5]
                if len(entry) > 6:  # a CUDA tensor: its device and that device's stream
                    index = entry[6]
                    if index not in streams:
                        import torch

                        streams[index] = torch.cuda.current_stream(index).cuda_stream
                    described[i] += (index, streams[index])
                keep = entry[5]
                kept.append(keep)
                kinds.add(type(keep).__module__.split(".")[0])
        if "torch" in kinds:
            fmt = "pt"
        elif kinds & {"tensorflow", "keras", "tf_keras"}:
            fmt = "tf"  # as Hugging Face marks TensorFlow weights
    kept.append(flat)
    return described, fmt, kept


def load(
    path: PathLike,
    device: Any = None,
    mmap: bool = True,
    framework: Literal["pt", "np", "tf"] = "pt",
) -> dict[str, Any]:
    """Read a safetensors file (any writer's) into a dict of tensors.

    Args:
        path: a local path or a file's URI, as for :func:`save`.
        device: for ``framework="pt"``, the device the tensors are made on
            (``"cuda:0"``); ``None`` keeps them in host memory. With a build
            with CUDA (``cairn.CUDA``), a CUDA device's tensors are allocated
            there and the file is read into them through pinned bounce
            buffers (``mmap`` does not apply); otherwise they are loaded to
            host memory and copied over (``tensor.to(device)``).
        mmap: map the file and return tensors that view the mapping: no read
            until a tensor is touched, no copy. The mapping is private
            (copy-on-write): writing to a tensor changes it in this process
            only, never the file. ``False`` reads the file into memory of its
            own (direct from the disk for large files), which later changes
            to the file cannot reach. Objects in a store are always read
            into memory.
        framework: ``"pt"`` for ``torch.Tensor`` values, ``"np"`` for
            ``numpy.ndarray`` (numpy has no bfloat16 or float8: such a tensor
            is an :class:`~cairn.InvalidArgumentError` naming it), ``"tf"``
            for ``tf.Tensor`` values in host memory that view the loaded
            data through DLPack (no copy; bfloat16 and float8 included;
            ``device`` does not apply). To assign into existing variables use
            :func:`cairn.tensorflow.load_variables`.

    Returns:
        The tensors by name, in the order of their data in the file (which
        need not be the order they were saved in). Shapes and dtypes are the
        file's; a scalar is a 0-d tensor.

    Raises:
        cairn.NotFoundError: no such file or object.
        cairn.CorruptionError: the file is not a valid safetensors file (naming
            it, the tensor and the byte offset).
    """
    if framework not in ("pt", "np", "tf"):
        raise InvalidArgumentError(
            f"framework {framework!r}: 'pt', 'np' or 'tf'", "invalid_argument"
        )
    if device is not None and framework == "pt" and _cairn.CUDA:
        import torch

        target = torch.device(device)
        if target.type == "cuda":
            return _load_to_cuda(path, target)
    # The read runs with the GIL released and the collector as it is (the
    # description's tuples are made with it paused, in C++); making the
    # tensors pauses it here.
    described, data, _, _ = _cairn.load_tensors(_path(path), bool(mmap))
    if framework == "tf":
        from cairn.tensorflow._tensors import make_tensors

        return make_tensors(path, described, data)
    with _gc_paused():
        return _make_tensors(path, described, data, device, framework)


def _make_tensors(
    path: PathLike, described: list[Any], data: Any, device: Any, framework: str
) -> dict[str, Any]:
    """The tensors of ``described`` over ``data``, as :func:`load` returns them."""
    import numpy as np

    raw = np.frombuffer(data, dtype=np.uint8)
    out: dict[str, Any] = {}
    if framework == "np":
        for name, dtype, shape, begin, end in described:
            if dtype not in _FILE_TO_NUMPY:
                raise InvalidArgumentError(
                    f"{os.fspath(path)}: tensor {name!r} is {dtype}, which numpy does not have; "
                    "load it with framework='pt'",
                    "invalid_argument",
                )
            np_dtype = np.dtype(_FILE_TO_NUMPY[dtype])
            if begin % np_dtype.alignment:
                out[name] = _view(raw[begin:end], np_dtype).reshape(shape)
            else:
                out[name] = np.ndarray(shape, np_dtype, raw, begin)
        return out
    import torch

    helpers = _torch_helpers()
    if helpers is not None:
        made = helpers.views(data, described)  # None: a dtype this torch lacks
        if made is not None:
            return made if device is None else {k: t.to(device) for k, t in made.items()}
    # Each tensor views the data through a storage of its own, as torch.load
    # makes them (torch.save of one tensor writes its bytes only).
    sizes: dict[str, tuple[Any, int]] = {}
    for name, dtype, shape, begin, end in described:
        found = sizes.get(dtype)
        if found is None:
            want = _torch_dtype(torch, path, name, dtype)
            found = sizes[dtype] = (want, torch.empty((), dtype=want).element_size())
        want, size = found
        if end == begin:
            t = torch.empty(shape, dtype=want)
        elif begin % size:
            # A foreign writer's unaligned offset: copied to align.
            t = torch.from_numpy(raw[begin:end].copy()).view(want).view(shape)
        else:
            t = torch.frombuffer(data, dtype=want, count=(end - begin) // size, offset=begin).view(
                shape
            )
        out[name] = t if device is None else t.to(device)
    return out


def _torch_dtype(torch: Any, path: PathLike, name: str, dtype: str) -> Any:
    """The torch dtype of file dtype ``dtype`` (tensor ``name`` of ``path``)."""
    want = getattr(torch, _FILE_TO_TORCH.get(dtype, ""), None)
    if want is None:
        raise InvalidArgumentError(
            f"{os.fspath(path)}: tensor {name!r} is {dtype}, which torch "
            f"{torch.__version__} does not have; load it with framework='np'",
            "invalid_argument",
        )
    return want


def _load_to_cuda(path: PathLike, device: Any) -> dict[str, Any]:
    """:func:`load` onto a CUDA device: tensors allocated there, read into by the engine."""
    import torch

    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    described, _, _ = _cairn.read_tensor_header(_path(path))
    stream = torch.cuda.current_stream(device).cuda_stream
    out: dict[str, Any] = {}
    into = []
    with _gc_paused():
        for name, dtype, shape, begin, end in described:
            want = _torch_dtype(torch, path, name, dtype)
            t = out[name] = torch.empty(shape, dtype=want, device=device)
            into.append(
                (name, dtype, tuple(shape), t.data_ptr(), end - begin, device.index, stream)
            )
    _cairn.load_tensors_into(into, _path(path))
    return out


def load_metadata(path: PathLike) -> dict[str, Any]:
    """The JSON metadata :func:`save` stored in a file (``{}`` if none).

    Reads only the file's header.
    """
    _, metadata, _ = _cairn.read_tensor_header(_path(path))
    return metadata


def _view(raw: Any, dtype: Any) -> Any:
    """``raw`` (uint8) as ``dtype``, copied first when its offset is unaligned."""
    if raw.ctypes.data % dtype.alignment:
        raw = raw.copy()
    return raw.view(dtype)


def _path(path: PathLike) -> str:
    p = os.fspath(path)
    if not isinstance(p, str):
        raise InvalidArgumentError(f"path {p!r}: str or os.PathLike[str]", "invalid_argument")
    return p
