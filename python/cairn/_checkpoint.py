"""cairn.Checkpoint: a directory of files at a path or URI (Ray's Checkpoint)."""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

from cairn import _cairn

VerifyProblem = _cairn.VerifyProblem

PathLike = "str | os.PathLike[str]"

# What from_dict() writes for a dict that is not all JSON (tensors, arrays):
# the pickled dict, as Ray's legacy dict checkpoints held it.
_PICKLED_DICT = "dict.pkl"

# What a framework's backend does to a dict before from_dict() stores it
# (cairn.train.torch registers its own in each TorchTrainer worker).
_dict_encoders: list[Any] = []


class Checkpoint:
    """A checkpoint: a directory of your files at a path or URI.

    As Ray's ``Checkpoint``: made with :meth:`from_directory` (or
    :meth:`from_dict` for small state), read through :meth:`as_directory` or
    :meth:`to_directory`, with JSON metadata. A checkpoint is *committed* once
    Cairn's manifest (every file's size and XXH3-64, written last) is in
    place; :meth:`verify` checks every file against it.

    Thread safety: a Checkpoint is an immutable handle; its methods may be
    called from several threads.
    """

    __slots__ = ("_impl",)

    def __init__(self, path: Any, filesystem: Any = None) -> None:
        """The checkpoint at ``path``, a local path or URI, as Ray's
        ``Checkpoint(path, filesystem)``.

        ``filesystem`` may be None, or a ``pyarrow.fs`` LocalFileSystem or
        S3FileSystem (``path`` then being "bucket/key", Ray's form); Cairn
        reads and writes with its own clients (S3 configured as aws-cli is,
        docs/s3.md), so only the kind of the filesystem is used.

        Raises:
            TypeError: ``path`` is not a path, or ``filesystem`` is of
                another kind.
        """
        if isinstance(path, _cairn.Checkpoint):  # from Cairn itself
            self._impl = path
            return
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"Checkpoint(path): a local path or URI, not {type(path).__name__}")
        self._impl = _cairn.Checkpoint.from_directory(_location(os.fspath(path), filesystem))

    @classmethod
    def from_directory(cls, path: str | os.PathLike[str]) -> Checkpoint:
        """The checkpoint at a local path or URI (the directory need not exist yet)."""
        return cls(_cairn.Checkpoint.from_directory(path))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Checkpoint:
        """An in-memory checkpoint holding ``data``, as Ray's ``from_dict``.

        A dict of JSON values is stored as ``dict.json`` (readable by any
        tool, and by the C++ API); any other dict (tensors, NumPy arrays, a
        model's ``state_dict()``) is pickled into ``dict.pkl``, as Ray's
        legacy dict checkpoints were. :meth:`to_dict` reads either back.
        Tensors are pickled by dtype, shape, device and bytes, so equal
        dicts give equal files in every process: when every rank of a run
        reports the same dict (the guide's DDP example), the checkpoint
        holds it once; ranks whose dicts differ are a file conflict, named
        by the Trainer, rather than one rank's state silently winning. In a
        TorchTrainer's worker, as in Ray's, a value that is a
        DistributedDataParallel model is stored as its module, and a
        state dict taken from one loses its "module." key prefix, so the
        checkpoint loads into the bare model.
        Unpickling runs code the pickle names: read only checkpoints you
        trust, as with ``torch.load``.

        Raises:
            TypeError: ``data`` is not a dict, or cannot be pickled.
        """
        if not isinstance(data, dict):
            raise TypeError(f"from_dict: a dict, not a {type(data).__name__}")
        for encode in _dict_encoders:
            data = encode(data)
        try:
            return cls(_cairn.Checkpoint.from_dict(data))
        except TypeError:  # not all JSON
            pass
        try:
            pickled = _canonical_pickle(dict(data))
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            raise TypeError(f"from_dict: the dict is neither JSON nor picklable: {e}") from e
        return cls(_cairn.Checkpoint.from_files({_PICKLED_DICT: pickled}))

    def to_dict(self) -> dict[str, Any]:
        """The dict a :meth:`from_dict` checkpoint holds (NotFoundError if none)."""
        from cairn.errors import NotFoundError

        try:
            return self._impl.to_dict()
        except NotFoundError:
            try:
                pickled = self._impl.read_file(_PICKLED_DICT)
            except NotFoundError:
                raise NotFoundError(
                    f"{self.uri}: the checkpoint holds no dict (neither dict.json nor "
                    f"{_PICKLED_DICT})",
                    "not_found",
                ) from None
        data = pickle.loads(pickled)
        if not isinstance(data, dict):
            from cairn.errors import CorruptionError

            raise CorruptionError(f"{self.uri}/{_PICKLED_DICT}: not a pickled dict", "corruption")
        return data

    @property
    def filesystem(self) -> Any:
        """The checkpoint's ``pyarrow.fs`` filesystem, as Ray's (needs pyarrow):
        LocalFileSystem for a local checkpoint, S3FileSystem for ``s3://``.
        :attr:`path` is then the path on it ("bucket/key" for S3)."""
        try:
            import pyarrow.fs
        except ImportError as e:
            raise ImportError(
                "Checkpoint.filesystem needs pyarrow; Cairn itself reads "
                "checkpoints without it (as_directory, to_directory)"
            ) from e
        uri = self.uri
        if uri.startswith("s3://"):
            # The endpoint and region Cairn's own S3 client resolves (C++).
            url, region, custom = _cairn.s3_endpoint()
            return pyarrow.fs.S3FileSystem(endpoint_override=url if custom else None, region=region)
        if uri.startswith("file://"):
            return pyarrow.fs.LocalFileSystem()
        raise ValueError(f"{uri}: no pyarrow filesystem for this kind of checkpoint")

    def __reduce__(self) -> tuple[Any, ...]:
        # A checkpoint pickles as its location; an in-memory one (from_dict)
        # as its files, having no location another process could open.
        uri = self.uri
        if uri.startswith("memory://"):
            files = {name: self._impl.read_file(name) for name, _ in self._impl.files()}
            return (_from_files, (files,))
        return (_from_uri, (uri,))

    @property
    def path(self) -> str:
        """Where the checkpoint is: a local checkpoint's path, else its URI.

        As Ray's ``Checkpoint.path``, a local checkpoint has no ``file://``
        prefix; :attr:`uri` always has its scheme.
        """
        uri = self._impl.path
        return uri[len("file://") :] if uri.startswith("file://") else uri

    @property
    def uri(self) -> str:
        """The checkpoint's URI (``file:///...``, ``s3://...``, ``memory://...``)."""
        return self._impl.path

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        """A local directory holding the checkpoint's files, for the ``with`` block.

        A local checkpoint is its own directory (no copy). A remote one is
        downloaded once per machine into a cache that every process asking
        for the same checkpoint shares, and removed when the last one leaves
        its block. Treat the directory as read-only.
        """
        view = self._impl.as_directory()
        path = view.__enter__()
        try:
            yield path
        finally:
            view.__exit__(None, None, None)

    def to_directory(self, path: str | os.PathLike[str] | None = None) -> str:
        """Copies the files into ``path`` (created if missing), or a new temporary folder.

        Returns the folder. As Ray's, a folder that already holds files
        keeps them, and those of the same name are replaced. Committed
        checkpoints are verified while copied (into a fresh folder next to
        ``path`` first, so a failed copy leaves ``path`` as it was);
        Cairn's manifest is not copied, metadata is.
        """
        if path is None:
            return self._impl.to_directory(None)
        dest = os.fspath(path)
        if not os.path.isdir(dest) or not os.listdir(dest):
            return self._impl.to_directory(dest)
        staging = tempfile.mkdtemp(
            prefix=".cairn-copy-", dir=os.path.dirname(os.path.abspath(dest))
        )
        try:
            self._impl.to_directory(os.path.join(staging, "c"))
            root = os.path.join(staging, "c")
            for folder, _, names in os.walk(root):
                target = os.path.join(dest, os.path.relpath(folder, root))
                os.makedirs(target, exist_ok=True)
                for name in names:
                    os.replace(os.path.join(folder, name), os.path.join(target, name))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return dest

    def get_metadata(self) -> dict[str, Any]:
        """The checkpoint's metadata ({} when it has none)."""
        return self._impl.get_metadata()

    def set_metadata(self, metadata: dict[str, Any]) -> None:
        """Replaces the metadata, atomically."""
        self._impl.set_metadata(metadata)

    def update_metadata(self, metadata: dict[str, Any]) -> None:
        """Merges the top-level keys of ``metadata`` into the metadata, atomically."""
        self._impl.update_metadata(metadata)

    def is_committed(self) -> bool:
        """Whether Cairn's manifest is in place (the checkpoint is complete)."""
        return self._impl.is_committed()

    def files(self) -> list[tuple[str, int]]:
        """The user's files as (relative path, size), Cairn's own files left out."""
        return self._impl.files()

    def verify(self) -> list[VerifyProblem]:
        """Checks every file against the manifest; an empty list means whole.

        Raises NotFoundError if the checkpoint is not committed.
        """
        return self._impl.verify()

    def __fspath__(self) -> str:
        return self.path

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Checkpoint) and other.uri == self.uri

    def __hash__(self) -> int:
        return hash(self.uri)

    def __repr__(self) -> str:
        # Ray's form: the filesystem's kind ("local", "s3", "memory") and the path.
        scheme = self.uri.split("://", 1)[0]
        kind = "local" if scheme == "file" else scheme
        return f"Checkpoint(filesystem={kind}, path={self.path})"


def _location(path: str, filesystem: Any) -> str:
    """The URI of ``path`` on ``filesystem`` (a pyarrow filesystem or None)."""
    if filesystem is None:
        return path
    kind = type(filesystem).__name__
    if kind == "LocalFileSystem":
        return path
    if kind == "S3FileSystem":
        return path if path.startswith("s3://") else "s3://" + path.lstrip("/")
    raise TypeError(
        f"Checkpoint(filesystem=...): a pyarrow LocalFileSystem or S3FileSystem, not {kind}"
    )


def _from_uri(uri: str) -> Checkpoint:
    return Checkpoint(_cairn.Checkpoint.from_directory(uri))


def _from_files(files: dict[str, bytes]) -> Checkpoint:
    return Checkpoint(_cairn.Checkpoint.from_files(files))


def _canonical_pickle(data: dict[Any, Any]) -> bytes:
    """``data`` pickled so that equal values give equal bytes in any process.

    torch's own pickling of a tensor varies from one process to the next;
    here a tensor is reduced to its dtype, shape, device and bytes
    (:func:`_tensor_from_bytes` rebuilds it), everything else pickles as
    usual.
    """
    import io
    import sys

    torch = sys.modules.get("torch")

    class Pickler(pickle.Pickler):
        def reducer_override(self, obj: Any) -> Any:
            if torch is not None and isinstance(obj, torch.Tensor) and not obj.is_sparse:
                t = obj.detach().to("cpu").contiguous()
                raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
                return (
                    _tensor_from_bytes,
                    (
                        str(t.dtype).removeprefix("torch."),
                        tuple(t.shape),
                        raw,
                        str(obj.device),
                        bool(obj.requires_grad),
                        isinstance(obj, torch.nn.Parameter),
                    ),
                )
            return NotImplemented

    out = io.BytesIO()
    Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(data)
    return out.getvalue()


def _tensor_from_bytes(
    dtype: str,
    shape: tuple[int, ...],
    raw: bytes,
    device: str,
    requires_grad: bool,
    parameter: bool,
) -> Any:
    """The tensor :func:`_canonical_pickle` reduced (named in its pickles)."""
    import torch

    kind = getattr(torch, dtype)
    if raw:
        t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(kind).reshape(shape)
    else:
        t = torch.empty(shape, dtype=kind)
    t = t.to(device)
    if parameter:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    return t.requires_grad_(requires_grad) if requires_grad else t
