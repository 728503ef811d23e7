"""cairn.Checkpoint: a directory of files at a path or URI (Ray's Checkpoint)."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

from cairn import _cairn

VerifyProblem = _cairn.VerifyProblem

PathLike = "str | os.PathLike[str]"

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

    def __init__(self, impl: _cairn.Checkpoint) -> None:
        self._impl = impl

    @classmethod
    def from_directory(cls, path: str | os.PathLike[str]) -> "Checkpoint":
        """The checkpoint at a local path or URI (the directory need not exist yet)."""
        return cls(_cairn.Checkpoint.from_directory(path))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Checkpoint":
        """An in-memory checkpoint holding ``data`` (JSON values) as ``dict.json``.

        Raises TypeError for a value that is not JSON (keys must be str).
        """
        return cls(_cairn.Checkpoint.from_dict(data))

    def to_dict(self) -> dict[str, Any]:
        """The dict a :meth:`from_dict` checkpoint holds (NotFoundError if none)."""
        return self._impl.to_dict()

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
        """Copies the files into ``path`` (created; must be empty), or a new temporary folder.

        Returns the folder. Committed checkpoints are verified while copied;
        Cairn's manifest is not copied, metadata is.
        """
        return self._impl.to_directory(path)

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
        return f"Checkpoint(path={self.path!r})"
