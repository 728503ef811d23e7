"""TensorFlow values in ``cairn.save`` / ``cairn.load``, and loads into variables.

``tf.Tensor``, ``tf.Variable`` and ``keras.Variable`` values are handed to
the engine by address, as torch and numpy ones: a CPU tensor's buffer is
viewed through ``__array__`` (no copy), a variable through its current
value (``variable.value()``, which shares the variable's buffer until the
variable is next assigned). Loads with ``framework="tf"`` wrap the loaded
buffers through DLPack (no copy); :func:`load_variables` assigns into
existing variables (one copy, into the variables' own buffers).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Union

from cairn import _cairn
from cairn._tensors import _TORCH_TO_FILE
from cairn.errors import InvalidArgumentError

PathLike = Union[str, "os.PathLike[str]"]

# numpy dtype name (TensorFlow's numpy view; ml_dtypes for bfloat16 and
# float8) -> safetensors dtype: the names are torch's, so the one table.
_NUMPY_NAME_TO_FILE = _TORCH_TO_FILE
_FILE_TO_NUMPY_NAME = {v: k for k, v in _NUMPY_NAME_TO_FILE.items()}
# Same-size unsigned integers, for dtypes DLPack cannot carry from numpy.
_UINT_OF_SIZE = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


def is_tf_value(value: Any) -> bool:
    """Whether ``value`` is a TensorFlow tensor or variable, or a Keras variable."""
    kind = type(value).__module__.split(".")[0]
    return kind in ("tensorflow", "keras", "tf_keras")


def _host_tensor(name: str, value: Any) -> Any:
    """``value``'s current value as a dense eager tensor in host memory."""
    import tensorflow as tf

    if type(value).__module__.split(".")[0] in ("keras", "tf_keras"):
        inner = getattr(value, "value", None)
        if inner is None:
            raise InvalidArgumentError(
                f"tensor {name!r}: a {type(value).__name__} is not a Keras variable",
                "invalid_argument",
            )
        value = inner
    if isinstance(value, tf.Variable):
        value = value.value()
    if isinstance(value, (tf.SparseTensor, tf.RaggedTensor)):
        raise InvalidArgumentError(
            f"tensor {name!r}: a {type(value).__name__}; save its dense form "
            "(tf.sparse.to_dense / .to_tensor())",
            "invalid_argument",
        )
    if not isinstance(value, tf.Tensor) or not hasattr(value, "_numpy"):
        raise InvalidArgumentError(
            f"tensor {name!r}: a {type(value).__name__} is not an eager tensor "
            "(save outside tf.function)",
            "invalid_argument",
        )
    if "CPU" not in (value.device or "CPU").upper():
        with tf.device("CPU:0"):
            value = tf.identity(value)  # the engine reads host memory: one copy
    return value


def describe(name: str, value: Any) -> tuple[Any, ...]:
    """(name, file dtype, shape, address, nbytes, keep-alive) of a TensorFlow value.

    Raises:
        cairn.InvalidArgumentError: a dtype safetensors lacks (string,
            complex, quantized, int4), a sparse or ragged tensor, a symbolic
            tensor — naming the tensor.
    """
    import numpy as np

    t = _host_tensor(name, value)
    dtype = t.dtype.name
    file_dtype = _NUMPY_NAME_TO_FILE.get(dtype)
    if file_dtype is None:
        raise InvalidArgumentError(
            f"tensor {name!r}: TensorFlow dtype {dtype} has no safetensors type "
            f"(supported: {', '.join(sorted(_NUMPY_NAME_TO_FILE))})",
            "invalid_argument",
        )
    arr = np.asarray(t)  # views the tensor's buffer (no copy for a host tensor)
    if not arr.flags.c_contiguous:  # pragma: no cover - eager tensors are dense
        arr = np.ascontiguousarray(arr)
    return (name, file_dtype, tuple(arr.shape), arr.__array_interface__["data"][0], arr.nbytes, t)


def _numpy_view(raw: Any, name: str, dtype: str, shape: Any, begin: int, end: int) -> Any:
    """The file's bytes [begin, end) as a numpy array of the tensor's dtype (ml_dtypes too)."""
    import numpy as np
    import tensorflow as tf

    np_name = _FILE_TO_NUMPY_NAME.get(dtype)
    if np_name is None:
        raise InvalidArgumentError(
            f"tensor {name!r} is {dtype}, which TensorFlow does not have", "invalid_argument"
        )
    np_dtype = tf.dtypes.as_dtype(np_name).as_numpy_dtype
    np_dtype = np.dtype(np_dtype)
    part = raw[begin:end]
    if part.ctypes.data % np_dtype.alignment:
        part = part.copy()
    return part.view(np_dtype).reshape(shape)


def _to_tf(arr: Any) -> Any:
    """A tf.Tensor over ``arr``'s memory through DLPack where TensorFlow takes it, else a copy."""
    import numpy as np
    import tensorflow as tf

    want = tf.dtypes.as_dtype(arr.dtype)
    try:
        if arr.dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
            bits = arr.view(np.dtype(_UINT_OF_SIZE[arr.dtype.itemsize]))
            return tf.bitcast(tf.experimental.dlpack.from_dlpack(bits.__dlpack__()), want)
        return tf.experimental.dlpack.from_dlpack(arr.__dlpack__())
    except (BufferError, TypeError, ValueError, tf.errors.OpError):
        return tf.constant(arr)  # read-only or unaligned memory: copied


def make_tensors(path: PathLike, described: list[Any], data: Any) -> dict[str, Any]:
    """:func:`cairn.load`'s ``framework="tf"``: tf.Tensors viewing ``data`` (no copy)."""
    import numpy as np

    raw = np.frombuffer(data, dtype=np.uint8)
    out: dict[str, Any] = {}
    for name, dtype, shape, begin, end in described:
        try:
            arr = _numpy_view(raw, name, dtype, shape, begin, end)
        except InvalidArgumentError as e:
            raise InvalidArgumentError(f"{os.fspath(path)}: {e}", "invalid_argument") from None
        out[name] = _to_tf(arr)
    return out


def load_variables(variables: Mapping[str, Any], path: PathLike, *, strict: bool = True) -> None:
    """Assigns the tensors of a safetensors file into existing variables, by name.

    ``variables`` maps names to ``tf.Variable`` or ``keras.Variable`` (for
    a Keras model, e.g. ``{v.path: v for v in model.weights}``). With
    ``strict`` (TensorFlow's ``assert_consumed``), every tensor of the file
    must have a variable of the same dtype and shape and every variable a
    tensor; without it, only names in both are assigned (dtype and shape
    must still match).

    Raises:
        cairn.InvalidArgumentError: listing each missing, unexpected and
            mismatched name; nothing is assigned.
        cairn.NotFoundError, cairn.CorruptionError: the file is absent or
            not a valid safetensors file.
    """
    import numpy as np
    import tensorflow as tf

    p = os.fspath(path)
    header, _, _ = _cairn.read_tensor_header(p)
    targets: dict[str, Any] = {}
    for key, var in variables.items():
        inner = getattr(var, "value", None) if not isinstance(var, tf.Variable) else var
        if not isinstance(inner, tf.Variable):
            raise InvalidArgumentError(
                f"variables[{key!r}]: a {type(var).__name__} is not a tf.Variable or "
                "keras.Variable",
                "invalid_argument",
            )
        targets[key] = var
    problems: list[str] = []
    saved = {name: (dtype, tuple(shape)) for name, dtype, shape, _, _ in header}
    for name, (dtype, shape) in saved.items():
        var = targets.get(name)
        if var is None:
            if strict:
                problems.append(f"unexpected {name!r} (in the file, no such variable)")
            continue
        have = _NUMPY_NAME_TO_FILE.get(tf.dtypes.as_dtype(var.dtype).name)
        if have != dtype or tuple(var.shape) != shape:
            problems.append(
                f"mismatched {name!r}: file {dtype}{list(shape)}, variable "
                f"{tf.dtypes.as_dtype(var.dtype).name}{list(var.shape)}"
            )
    if strict:
        problems += [
            f"missing {k!r} (a variable, not in the file)" for k in targets if k not in saved
        ]
    if problems:
        raise InvalidArgumentError(
            f"{p}: cannot load into the variables: " + "; ".join(problems), "invalid_argument"
        )
    described, data, _, _ = _cairn.load_tensors(p, True)
    raw = np.frombuffer(data, dtype=np.uint8)
    for name, dtype, shape, begin, end in described:
        var = targets.get(name)
        if var is not None:
            var.assign(_numpy_view(raw, name, dtype, shape, begin, end))
