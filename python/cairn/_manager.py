"""cairn.CheckpointManager: an experiment's checkpoints, with retention."""

from __future__ import annotations

import os
from typing import Any, Optional

from cairn import _cairn
from cairn._checkpoint import Checkpoint

CheckpointConfig = _cairn.CheckpointConfig
MemoryTierConfig = _cairn.MemoryTierConfig


class CheckpointRecord:
    """A committed checkpoint of an experiment, with what was reported with it."""

    __slots__ = (
        "index",
        "name",
        "metrics",
        "created_at",
        "pinned",
        "checkpoint",
        "tier",
        "persisted",
    )

    def __init__(self, impl: _cairn.CheckpointRecord) -> None:
        self.index: int = impl.index
        self.name: str = impl.name
        self.metrics: dict[str, Any] = impl.metrics
        self.created_at: float = impl.created_at
        self.pinned: bool = impl.pinned
        self.checkpoint: Checkpoint = Checkpoint(impl.checkpoint)
        # "memory" (the memory tier) or "persistent"; whether a memory copy
        # also has a persistent one.
        self.tier: str = impl.tier
        self.persisted: bool = impl.persisted

    def __repr__(self) -> str:
        return f"CheckpointRecord(name={self.name!r}, metrics={self.metrics!r})"


def _join(storage_path: str, name: str) -> str:
    if not name:
        return storage_path
    return storage_path.rstrip("/") + "/" + name


class CheckpointManager:
    """The checkpoints of one experiment at ``storage_path``/``name``, with retention.

    As the C++ ``cairn::CheckpointManager``: checkpoints are copied into
    ``checkpoint_NNNNNN`` folders and committed manifest-last; with
    ``num_to_keep`` the best K by ``checkpoint_score_attribute`` (``"a/b"``
    reaches ``metrics["a"]["b"]``) are kept, the most recent always. The
    history is persisted, so a new process sees it.

    Opening takes the experiment's lock (LockedError while another process
    holds it), removes what interrupted saves left and reconciles the history
    with what is committed. :meth:`close` (or leaving a ``with`` block)
    releases the lock; so does garbage collection, later.

    Thread safety: calls may come from several threads; they are serialized.
    """

    def __init__(
        self,
        storage_path: str | os.PathLike[str],
        name: str = "",
        config: Optional[CheckpointConfig] = None,
    ) -> None:
        uri = _join(os.fspath(storage_path), name)
        self._impl = _cairn.CheckpointManager(uri, config or CheckpointConfig())

    def register_checkpoint(
        self, metrics: dict[str, Any], checkpoint: Checkpoint
    ) -> CheckpointRecord:
        """Persists ``checkpoint`` as the next checkpoint, commits it and applies retention.

        If this raises, nothing committed before is lost and the new
        checkpoint is not visible. Metrics must be JSON values (TypeError
        otherwise); a score attribute that is not a number is
        InvalidArgumentError, before anything is written.

        The checkpoints retention retires are gone from the experiment when
        this returns (on local disks their files wait in its ``.cairn.trash``
        folder); their space is freed on a background thread, which the next
        save, :meth:`wait_for_deletes` and :meth:`close` wait for.
        """
        return CheckpointRecord(self._impl.register_checkpoint(metrics, checkpoint._impl))

    def wait_for_deletes(self) -> None:
        """Blocks, without the GIL, until the space of every retired checkpoint is freed."""
        self._impl.wait_for_deletes()

    def wait_for_persistence(self) -> None:
        """With a memory tier: blocks, without the GIL, until every background
        persistence scheduled so far has finished (committed, or failed with a
        warning in the log)."""
        self._impl.wait_for_persistence()

    def release_memory_tier(self) -> None:
        """With a memory tier: persists the newest checkpoint if only memory
        holds it, then frees the tier; later saves go to persistent storage.

        :meth:`close` does it too. If the persisting fails this raises and the
        tier is kept (the next open of the experiment resumes from it).
        """
        self._impl.release_memory_tier()

    def latest(self) -> Optional[CheckpointRecord]:
        """The most recent committed checkpoint across the tiers (its memory
        copy when both hold it), or None."""
        r = self._impl.latest()
        return None if r is None else CheckpointRecord(r)

    def best(self) -> list[CheckpointRecord]:
        """Every kept checkpoint, best first (newest first without a score attribute)."""
        return [CheckpointRecord(r) for r in self._impl.best()]

    def history(self) -> list[CheckpointRecord]:
        """Every kept checkpoint, oldest first."""
        return [CheckpointRecord(r) for r in self._impl.history()]

    @property
    def uri(self) -> str:
        """The experiment's URI."""
        return self._impl.uri

    @property
    def closed(self) -> bool:
        return self._impl.closed

    def close(self) -> None:
        """Frees what retention retired, persists the newest checkpoint and
        frees the memory tier (if any), then releases the experiment's lock.

        Later calls raise FailedPreconditionError.
        """
        self._impl.close()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
