"""Numbered checkpoints of tensor state (StateCheckpointManager) and
background saves (AsyncSaver, SaveHandle)."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any, Optional, Union

from cairn import _cairn
from cairn._checkpoint import Checkpoint
from cairn._manager import CheckpointManager, CheckpointRecord
from cairn.errors import NotFoundError
from cairn.torch._state import (
    PathLike,
    _checkpoint_arg,
    _readable,
    _record,
    _writable,
)


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
