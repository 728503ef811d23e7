"""Cairn's errors: one exception class per kind of failure of the C++ core.

Every failure of a Cairn call raises a subclass of :class:`cairn.Error` whose
message is the C++ message unchanged: it names the thing at fault (the file,
object, checkpoint, rank or byte offset). ``code`` is the C++ error code's
stable name (``"not_found"``, ``"corruption"``, ...) and ``retryable`` says
whether the same call may succeed later (a lock held by a live peer, a
throttled object store).

Where Python has a built-in exception for the same kind, the class derives
from it too, so ``except FileNotFoundError`` or ``except ValueError`` keep
working around Cairn calls.
"""

from __future__ import annotations

__all__ = [
    "Error",
    "InvalidArgumentError",
    "NotFoundError",
    "AlreadyExistsError",
    "CorruptionError",
    "PermissionDeniedError",
    "NoSpaceError",
    "IOError",
    "LockedError",
    "TimeoutError",
    "UnavailableError",
    "FailedPreconditionError",
    "InternalError",
]

import builtins


class Error(Exception):
    """A failure of the Cairn core.

    Attributes:
        code: the error code's stable name, e.g. ``"not_found"``.
        retryable: whether the same call may succeed later.
    """

    code: str = "internal"

    def __init__(self, message: str, code: str | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.retryable = retryable


class InvalidArgumentError(Error, ValueError):
    """The caller passed something unusable (a bad option, URI or value)."""

    code = "invalid_argument"


class NotFoundError(Error, FileNotFoundError):
    """A file, object, checkpoint or key does not exist."""

    code = "not_found"


class AlreadyExistsError(Error, FileExistsError):
    """A create-only operation found its target present."""

    code = "already_exists"


class CorruptionError(Error):
    """Stored data failed validation (checksum, size, parse)."""

    code = "corruption"


class PermissionDeniedError(Error, PermissionError):
    """The operating system or the object store refused access."""

    code = "permission_denied"


class NoSpaceError(Error, OSError):
    """The device or quota is full."""

    code = "no_space"


class IOError(Error, builtins.OSError):
    """Any other I/O failure."""

    code = "io"


class LockedError(Error):
    """Another process holds the experiment's lock."""

    code = "locked"


class TimeoutError(Error, builtins.TimeoutError):
    """A peer or an operation did not answer in time."""

    code = "timeout"


class UnavailableError(Error):
    """A service is temporarily unavailable (5xx, throttling)."""

    code = "unavailable"


class FailedPreconditionError(Error):
    """The system is not in a state the call needs."""

    code = "failed_precondition"


class InternalError(Error):
    """A bug in Cairn."""

    code = "internal"


_BY_CODE = {
    cls.code: cls
    for cls in (
        InvalidArgumentError,
        NotFoundError,
        AlreadyExistsError,
        CorruptionError,
        PermissionDeniedError,
        NoSpaceError,
        IOError,
        LockedError,
        TimeoutError,
        UnavailableError,
        FailedPreconditionError,
        InternalError,
    )
}


def _class_for(code: str) -> type[Error]:
    """The class the binding raises for the C++ error code ``code``."""
    return _BY_CODE.get(code, Error)
