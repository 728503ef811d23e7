"""cairn.tensorflow.CheckpointManager: ``tf.train.CheckpointManager`` over Cairn commits.

Save protocol (one ``save()``; the numbers are the crash points a test
kills at):

1. TensorFlow writes its TensorBundle files (``<name>-<n>.index``,
   ``<name>-<n>.data-00000-of-00001``) into a fresh staging folder
   (``<directory>/.cairn-tf-staging/`` for a local directory, a temporary
   folder for a store). Nothing in the experiment changes.
2. From TensorFlow's write callback (after its write finished, on its
   background thread for an asynchronous save), the staging folder is
   registered with ``cairn.CheckpointManager``: copied into the next
   ``checkpoint_NNNNNN/``, committed manifest-last (every file's size and
   XXH3-64), then retention runs. A crash before the manifest leaves a
   leftover the next open removes; the previous checkpoint stays the latest.
3. For a local directory, TensorFlow's ``checkpoint`` state file is
   replaced atomically (write a temporary file, fsync, rename, fsync the
   folder), naming only committed checkpoints by relative path. A crash
   before the rename leaves it naming the previous committed checkpoint;
   the next open rewrites it from Cairn's history.
4. The staging folder is removed (a crash leaves it to the next open).
"""

from __future__ import annotations

import copy
import glob
import hashlib
import inspect
import os
import shutil
import tempfile
import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Optional, Union

import cairn
from cairn.errors import CorruptionError, FailedPreconditionError, NotFoundError

PathLike = Union[str, "os.PathLike[str]"]

STATE_FILE = "checkpoint"  # TensorFlow's CheckpointState file (tf.train.latest_checkpoint)
STAGING = ".cairn-tf-staging"  # staging folder in a local directory
_METADATA_KEY = "tensorflow"  # the checkpoint metadata this manager stores
# RAM staging is used while /dev/shm has this much free, and twice the last save.
_RAM_HEADROOM = 256 << 20
_RAM = "/dev/shm"


def _is_uri(path: str) -> bool:
    return "://" in path


def _checkpoint_name(index: int) -> str:
    """Cairn's folder name for a checkpoint index (as src/manager/naming.cc)."""
    digits = str(index)
    if len(digits) <= 6:
        return f"checkpoint_{index:06d}"
    return f"checkpoint_{chr(ord('a') + len(digits) - 7)}{digits}"


def _snapshot(checkpoint: Any) -> Any:
    """The checkpoint's values now, for a write on another thread; None if unavailable.

    TensorFlow's saver gathers what it writes (each variable's value, the
    object graph) and then writes it; this does the gathering here, reading
    every variable now. A value read shares the variable's buffer, and
    TensorFlow copies a variable's buffer before updating it in place while
    another tensor holds it (copy-on-write), so the snapshot keeps these
    values whatever training does next, at the cost of one copy of each
    variable updated before the write ends, as TensorFlow's own
    asynchronous checkpoint pays. Uses the saver's internals
    (``_saver._gather_serialized_tensors``, ``MultiDeviceSaver``) of
    TensorFlow 2.21; when they are not there, or not executing eagerly,
    returns None and the save writes synchronously instead.
    """
    import tensorflow as tf

    if not tf.executing_eagerly():
        return None
    try:
        from tensorflow.python.checkpoint import functional_saver, tensor_callable

        saver = checkpoint._saver
        tensors, _, registered, _ = saver._gather_serialized_tensors(None)
    except (AttributeError, ImportError, TypeError):
        return None

    def now(value: Any) -> Any:
        """``value`` read now: an eager tensor, or None if it cannot be."""
        if isinstance(value, dict):  # a sliced (partitioned) variable's parts
            parts = {k: now(v) for k, v in value.items()}
            return None if any(v is None for v in parts.values()) else parts
        if isinstance(value, tensor_callable.Callable):
            with tf.device(value.device):
                value = value.tensor
        elif not isinstance(value, tf.Tensor):  # a variable (a MirroredVariable...)
            try:
                value = tf.convert_to_tensor(value)
            except (TypeError, ValueError):
                return None
        return value if hasattr(value, "_numpy") else None  # eager only

    for values in tensors.values():
        for key, value in list(values.items()):
            read = now(value)
            if read is None:
                return None
            values[key] = read
    return functional_saver, tensors, registered


def _write_snapshot(snapshot: Any, prefix: str, options: Any) -> None:
    """TensorFlow's write of a :func:`_snapshot` at ``prefix``, then the user's write callbacks."""
    functional_saver, tensors, registered = snapshot
    functional_saver.MultiDeviceSaver(tensors, registered).save(prefix, options=options)
    callbacks = (options.experimental_write_callbacks or []) if options is not None else []
    for callback in callbacks:  # as TensorFlow's _execute_callbacks
        if len(inspect.signature(callback).parameters) == 0:
            callback()
        else:
            callback(prefix)


def _index_of(folder: str) -> Optional[int]:
    """The index of a Cairn checkpoint folder name (inverse of :func:`_checkpoint_name`)."""
    if not folder.startswith("checkpoint_"):
        return None
    rest = folder[len("checkpoint_") :]
    if len(rest) == 6 and rest.isdigit():
        return int(rest)
    if len(rest) > 7 and "a" <= rest[0] <= "z" and rest[1:].isdigit():
        if len(rest) - 1 == ord(rest[0]) - ord("a") + 7:
            return int(rest[1:])
    return None


class _Listed:
    """A committed checkpoint found by listing the directory (no history: never pinned)."""

    __slots__ = ("index", "name", "checkpoint")
    pinned = False

    def __init__(self, index: int, name: str, checkpoint: cairn.Checkpoint) -> None:
        self.index = index
        self.name = name
        self.checkpoint = checkpoint


def _dir_id(path: str) -> Optional[tuple[int, int]]:
    """The identity (device, inode) of a folder, or None if there is none at ``path``."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


def _tree_size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointManager:
    """``tf.train.CheckpointManager`` whose saves are crash-safe Cairn commits.

    The constructor and methods are TensorFlow's (2.21): ``save()``,
    ``latest_checkpoint``, ``checkpoints``, ``restore_or_initialize()``,
    ``sync()``, ``directory``, ``checkpoint``, ``checkpoint_interval``, so
    the code of ``tf.train.CheckpointManager`` runs with the name changed.
    ``directory`` may be a local path or a store URI (``s3://bucket/run``).
    Each save is one Cairn checkpoint ``directory/checkpoint_NNNNNN/``
    holding TensorFlow's own files ``<checkpoint_name>-<n>.index`` and
    ``.data-00000-of-00001``; prefixes returned and listed name the files
    there. A save killed at any instant leaves the previous checkpoint the
    latest; only committed checkpoints are ever named.

    Cairn adds: retention by a metric (``save(metrics=...)`` with
    ``score_attribute`` / ``score_order``: the ``max_to_keep`` best are kept,
    the newest always); :meth:`restore`, which checks every file against the
    manifest before TensorFlow reads it (and downloads a store's checkpoint);
    the experiment lock, taken by a manager's first :meth:`save` (a second
    manager that saves to the directory raises ``cairn.LockedError``, until
    the first is closed), so every worker of a distribution strategy may
    construct a manager on one directory and only the chief save, as
    TensorFlow's guide does: a manager that never saved reads the committed
    checkpoints (``latest_checkpoint``, ``checkpoints``, :meth:`restore`)
    without the lock, on a local directory (on a store the constructor
    takes the lock); ``cairn ls/show/verify/gc/cp`` on the directory. For a
    local directory TensorFlow's ``checkpoint`` state file is kept up to date
    atomically, so ``tf.train.latest_checkpoint`` and
    ``tf.train.Checkpoint.restore`` work on it directly.

    Thread safety: saves and restores belong to the thread that trains, as in
    TensorFlow; the properties may be read from any thread.
    """

    def __init__(
        self,
        checkpoint: Any,
        directory: PathLike,
        max_to_keep: Optional[int],
        keep_checkpoint_every_n_hours: Optional[float] = None,
        checkpoint_name: str = "ckpt",
        step_counter: Any = None,
        checkpoint_interval: Optional[int] = None,
        init_fn: Optional[Callable[[], Any]] = None,
        last_checkpoint_step: Optional[int] = None,
        *,
        score_attribute: Optional[str] = None,
        score_order: str = "max",
        staging_dir: Optional[PathLike] = None,
    ) -> None:
        """Opens (or creates) the experiment at ``directory`` for ``checkpoint``.

        Args are TensorFlow's, plus:
            score_attribute: the metric (``"a/b"`` reaches
                ``metrics["a"]["b"]``) by which the ``max_to_keep`` best are
                kept; None keeps the most recent, as TensorFlow.
            score_order: ``"max"`` or ``"min"``: which scores are better.
            staging_dir: where TensorFlow writes before the commit. Default,
                for a local directory: ``/dev/shm`` while it has room (twice
                the last checkpoint and 256 MiB free), else
                ``directory/.cairn-tf-staging``; for a store, a temporary
                folder. RAM staging spares the save one disk write.

        Raises:
            ValueError: ``max_to_keep`` is 0 or negative, ``checkpoint_interval``
                is given without ``step_counter``, ``score_order`` is neither
                ``"max"`` nor ``"min"``, ``checkpoint_name`` is empty or has a
                ``/`` (TensorFlow's messages where it has one).
            TypeError: ``checkpoint`` is not a ``tf.train.Checkpoint``.
            cairn.LockedError: a store's directory (``s3://``...) has
                another writer (a local one's lock is taken by the first
                :meth:`save`, which raises it).
            OSError, cairn.Error: the directory cannot be created (naming it).
        """
        if max_to_keep is not None and max_to_keep <= 0:
            raise ValueError(
                "Expected a positive integer or `None` for `max_to_keep`, got %d." % (max_to_keep,)
            )
        if checkpoint_interval is not None and step_counter is None:
            raise ValueError(
                "`step_counter` should be passed if `checkpoint_interval` is not None."
            )
        if score_order not in ("max", "min"):
            raise ValueError(f"score_order {score_order!r}: 'max' or 'min'")
        if not checkpoint_name or "/" in checkpoint_name:
            raise ValueError(f"checkpoint_name {checkpoint_name!r}: a non-empty file name")
        if not (hasattr(checkpoint, "write") and hasattr(checkpoint, "save_counter")):
            raise TypeError(f"checkpoint: a tf.train.Checkpoint, not a {type(checkpoint).__name__}")
        self._checkpoint = checkpoint
        self._directory = os.fspath(directory)
        self._local = not _is_uri(self._directory) or self._directory.startswith("file://")
        self._path = self._directory.removeprefix("file://") if self._local else ""
        self._checkpoint_name = checkpoint_name
        self._init_fn = init_fn
        self._checkpoint_interval = checkpoint_interval
        self._max_to_keep = max_to_keep
        self._step_counter = step_counter
        self._last_checkpoint_step = last_checkpoint_step
        self._lock = threading.Lock()
        self._pending: Optional[Future[None]] = None
        self._executor: Optional[ThreadPoolExecutor] = None
        self._last_size = 0
        self._restored_copies: list[str] = []
        self._config = cairn.CheckpointConfig(
            num_to_keep=max_to_keep,
            keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
            checkpoint_score_attribute=score_attribute,
            checkpoint_score_order=score_order,
        )
        self._staging_dir = None if staging_dir is None else os.fspath(staging_dir)
        self._staging_root: Optional[str] = None
        self._ram_root: Optional[str] = None
        self._prefixes: dict[str, str] = {}  # Cairn checkpoint name -> TF prefix name
        self._next_index = 0
        self._closed = False
        # The writer: Cairn's manager, holding the directory's lock. Opened by
        # the first save() on a local directory (a manager that never saves
        # reads committed checkpoints without the lock, see _listed()); by
        # the constructor on a store, whose committed checkpoints the Python
        # API cannot list without it.
        self._cairn: Optional[cairn.CheckpointManager] = None
        self._dir_id: Optional[tuple[int, int]] = None  # the directory the writer opened
        if self._local:
            os.makedirs(self._path, exist_ok=True)
        else:
            self._open_writer()

    def _open_writer(self) -> None:
        """Opens Cairn's manager (takes the lock), then removes what interrupted saves left.

        Raises:
            cairn.LockedError: another manager (this process or another) is
                the directory's writer; the message names the directory.
        """
        try:
            manager = cairn.CheckpointManager(self._directory, "", self._config)
        except cairn.LockedError as e:
            raise cairn.LockedError(
                f"{self._directory}: another CheckpointManager is saving to this directory"
                f" ({e}); one writer at a time: under a distribution strategy only the"
                " chief saves, or each worker saves to a directory of its own",
                "locked",
                e.retryable,
            ) from e
        try:
            # The lock is ours: what an interrupted save left is ours to remove.
            self._ram_root = None
            if self._staging_dir is not None:
                self._staging_root = os.path.join(
                    self._staging_dir, f"cairn-tf-{uuid.uuid4().hex[:12]}"
                )
            elif self._local:
                self._staging_root = os.path.join(self._path, STAGING)
                shutil.rmtree(self._staging_root, ignore_errors=True)
                if os.path.isdir(_RAM) and os.access(_RAM, os.W_OK):
                    # Named for the directory, so the next open (holding the
                    # lock) removes what a killed save left there.
                    key = hashlib.sha256(os.path.abspath(self._path).encode()).hexdigest()[:16]
                    self._ram_root = os.path.join(_RAM, f"cairn-tf-staging-{key}")
                    shutil.rmtree(self._ram_root, ignore_errors=True)
            else:
                self._staging_root = tempfile.mkdtemp(prefix="cairn-tf-")
            prefixes = {r.name: self._prefix_of(r.checkpoint) for r in manager.history()}
            latest = manager.latest()
            with self._lock:
                self._cairn = manager
                self._dir_id = _dir_id(self._path) if self._local else None
                self._prefixes = prefixes
                self._next_index = 0 if latest is None else latest.index + 1
                if self._local:
                    for leftover in glob.glob(os.path.join(self._path, f".{STATE_FILE}.tmp-*")):
                        os.unlink(leftover)
                    self._write_state_file()
        except BaseException:
            self._cairn = None
            manager.close()
            raise

    def _writer(self) -> cairn.CheckpointManager:
        """Cairn's manager, opened (and the lock taken) on first use.

        A local directory removed (or replaced) since it was opened
        (TensorFlow's multi-worker pattern: a non-chief worker deletes its
        temporary directory after each save) is created and opened afresh,
        as a new experiment.
        """
        if self._cairn is not None and self._local and _dir_id(self._path) != self._dir_id:
            old, self._cairn = self._cairn, None
            try:
                old.close()  # releases the lock of the removed directory
            except cairn.Error:
                pass  # its files are gone with the directory: nothing to keep
            os.makedirs(self._path, exist_ok=True)
        if self._cairn is None:
            self._open_writer()
        assert self._cairn is not None
        return self._cairn

    # --- TensorFlow's properties -------------------------------------------

    @property
    def directory(self) -> str:
        """The directory (path or URI) as given."""
        return self._directory

    @property
    def checkpoint(self) -> Any:
        """The ``tf.train.Checkpoint`` saved and restored."""
        return self._checkpoint

    @property
    def checkpoint_interval(self) -> Optional[int]:
        return self._checkpoint_interval

    @property
    def latest_checkpoint(self) -> Optional[str]:
        """The prefix of the newest committed checkpoint, or None.

        As ``tf.train.latest_checkpoint(directory)`` for a local directory;
        ``directory/checkpoint_NNNNNN/<checkpoint_name>-<n>``.
        """
        with self._lock:
            records = self._published()
            return self._full(records[-1].name) if records else None

    @property
    def checkpoints(self) -> list[str]:
        """The prefixes of the kept checkpoints, oldest first.

        As TensorFlow's, checkpoints kept for good by
        ``keep_checkpoint_every_n_hours`` (pinned) are left out once they
        are older than the ``max_to_keep`` newest; ``cairn_manager.history()``
        lists every kept checkpoint.
        """
        with self._lock:
            records = self._published()
            active = records[-self._max_to_keep :] if self._max_to_keep else records
            names = {r.name for r in active}
            return [self._full(r.name) for r in records if not r.pinned or r.name in names]

    @property
    def cairn_manager(self) -> cairn.CheckpointManager:
        """The Cairn experiment underneath (records, metrics, ``best()``).

        Opens it if this manager has not saved yet, which makes this manager
        the directory's writer (``cairn.LockedError`` if another is).
        """
        self._check_open()
        return self._writer()

    # --- saving ------------------------------------------------------------

    def save(
        self,
        checkpoint_number: Any = None,
        check_interval: bool = True,
        options: Any = None,
        *,
        metrics: Optional[dict[str, Any]] = None,
    ) -> Optional[str]:
        """Writes the checkpoint and commits it; returns its prefix, or None if skipped.

        As ``tf.train.CheckpointManager.save``: numbered by
        ``checkpoint_number`` (an int, or an integer Variable or Tensor) or
        else by ``checkpoint.save_counter``, which is incremented either way;
        skipped (None) within ``checkpoint_interval`` steps of the last save.
        ``metrics`` (JSON values) are recorded with the checkpoint, for
        ``score_attribute`` and ``cairn ls``.

        Synchronous: the checkpoint is committed (durable, verified by its
        manifest, retention applied) when this returns. With
        ``options=tf.train.CheckpointOptions(enable_async=True)`` this
        returns once every variable's value has been taken (a snapshot that
        shares the variables' buffers, copied on write by TensorFlow, see
        :func:`_snapshot`): the caller may train on at once. TensorFlow's
        write of the snapshot into the staging folder, the copy into the
        experiment, the commit and retention run on a background thread, one
        save at a time (the next save first waits for the previous commit);
        :meth:`sync` waits for it. The prefix returned is the one the
        checkpoint gets once committed; ``latest_checkpoint`` names it only
        once it is. (TensorFlow's own asynchronous checkpointer is not used:
        in TensorFlow 2.21 with Keras 3 it fails from the second save on.)

        The first save of a manager takes the directory's lock (and removes
        what an interrupted save of an earlier writer left).

        Raises:
            cairn.LockedError: another manager (in any process) is saving to
                the directory and not closed; nothing changed (not even
                ``save_counter``). The message names the directory and the
                lock's holder.
            cairn.PermissionDeniedError: the directory cannot be written.
            cairn.InvalidArgumentError: ``metrics`` not JSON, or a
                ``score_attribute`` that is not a number.
            cairn.Error, tf.errors.OpError: the write or the commit failed
                (for an asynchronous save: raised by the next save or
                :meth:`sync`); nothing committed earlier is lost and the
                failed checkpoint is not visible.
        """
        import tensorflow as tf

        self._check_open()
        self.sync()  # the previous asynchronous commit, and its error
        self._writer()  # the lock: cairn.LockedError before anything changes
        if self._checkpoint_interval is not None:
            current_step = int(self._step_counter.numpy())
            if self._last_checkpoint_step is not None:
                if current_step == self._last_checkpoint_step:
                    return None
                if check_interval and current_step < (
                    self._last_checkpoint_step + self._checkpoint_interval
                ):
                    return None
            self._last_checkpoint_step = current_step
        save_counter = self._checkpoint.save_counter
        save_counter.assign_add(1)
        if checkpoint_number is None:
            checkpoint_number = save_counter
        if not isinstance(checkpoint_number, int):
            # A Variable or Tensor, as TensorFlow's training_util.global_step reads it.
            checkpoint_number = int(tf.keras.ops.convert_to_numpy(checkpoint_number))
        number = int(checkpoint_number)
        name = f"{self._checkpoint_name}-{number}"
        is_async = options is not None and bool(options.experimental_enable_async_checkpoint)
        if options is not None:
            options = copy.copy(options)
            options.experimental_enable_async_checkpoint = False
        staging = self._new_staging(name)
        mets = {} if metrics is None else dict(metrics)
        with self._lock:
            expected = self._full(_checkpoint_name(self._next_index), name)
        prefix = os.path.join(staging, name)
        try:
            snapshot = _snapshot(self._checkpoint) if is_async else None
            if snapshot is None:
                self._checkpoint.write(prefix, options=options)
                self._last_size = _tree_size(staging)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        if is_async:
            self._pending = self._pool().submit(
                self._commit_in_background, staging, name, number, mets, snapshot, options
            )
            return expected
        self._commit(staging, name, number, mets)
        return self.latest_checkpoint

    def _new_staging(self, name: str) -> str:
        """A fresh staging folder: in RAM (``/dev/shm``) when it has room, else on disk."""
        root = self._staging_root
        if self._ram_root is not None:
            try:
                st = os.statvfs(os.path.dirname(self._ram_root))
                free = st.f_bavail * st.f_frsize
            except OSError:
                free = 0
            if free > max(2 * self._last_size, _RAM_HEADROOM):
                root = self._ram_root
        staging = os.path.join(root, f"{name}.{uuid.uuid4().hex[:8]}")
        os.makedirs(staging)
        return staging

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="cairn-tf-commit")
        return self._executor

    def _commit_in_background(
        self,
        staging: str,
        name: str,
        number: int,
        metrics: dict[str, Any],
        snapshot: Any,
        options: Any,
    ) -> None:
        """An asynchronous save's thread: TensorFlow writes the snapshot, then the commit."""
        try:
            if snapshot is not None:
                _write_snapshot(snapshot, os.path.join(staging, name), options)
                self._last_size = _tree_size(staging)
            self._commit(staging, name, number, metrics)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

    def _commit(self, staging: str, name: str, number: int, metrics: dict[str, Any]) -> None:
        """Commits the staged TensorFlow files as the next Cairn checkpoint (steps 2-4)."""
        import tensorflow as tf

        source = cairn.Checkpoint.from_directory(staging)
        source.set_metadata(
            {_METADATA_KEY: {"prefix": name, "number": number, "version": tf.__version__}}
        )
        manager = self._cairn
        assert manager is not None  # save() opened it
        record = manager.register_checkpoint(metrics, source)
        with self._lock:
            self._prefixes[record.name] = name
            self._next_index = record.index + 1
            kept = {r.name for r in manager.history()}
            for gone in set(self._prefixes) - kept:
                del self._prefixes[gone]
            if self._local:
                self._write_state_file()
        shutil.rmtree(staging, ignore_errors=True)

    def sync(self) -> None:
        """Waits for an asynchronous save's commit; raises its error if it failed."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    # --- restoring ---------------------------------------------------------

    def restore(self, save_path: Optional[str] = None, options: Any = None) -> Any:
        """Verifies a committed checkpoint, then ``checkpoint.restore()``s it.

        ``save_path``: a prefix this manager listed (default: the latest).
        Every file is checked against the manifest (sizes and checksums)
        before TensorFlow reads any; a store's checkpoint is downloaded (and
        verified while copied) into a local folder kept until :meth:`close`.
        Returns TensorFlow's load status (``assert_consumed()`` checks that
        every saved value found its variable and every variable a value).
        With no checkpoint at all, returns ``checkpoint.restore(None)``.

        Raises:
            cairn.CorruptionError: a file does not match the manifest (naming
                it); nothing was restored.
            cairn.NotFoundError: ``save_path`` is no kept checkpoint of this
                manager.
        """
        self._check_open()
        self.sync()
        record = self._record_for(save_path)
        if record is None:
            return self._checkpoint.restore(None, options=options)
        prefix = self._prefixes[record.name]
        ckpt = record.checkpoint
        if self._local:
            problems = ckpt.verify()
            if problems:
                raise CorruptionError(
                    f"{ckpt.path}: does not match its manifest, not restored: "
                    + "; ".join(f"{p.path}: {p.reason}" for p in problems),
                    "corruption",
                )
            return self._checkpoint.restore(os.path.join(ckpt.path, prefix), options=options)
        local = tempfile.mkdtemp(prefix="cairn-tf-restore-")
        self._restored_copies.append(local)
        ckpt.to_directory(local)  # verified while copied
        return self._checkpoint.restore(os.path.join(local, prefix), options=options)

    def restore_or_initialize(self) -> Optional[str]:
        """As TensorFlow's: restores the latest checkpoint (through :meth:`restore`,
        so verified) and returns its prefix, or calls ``init_fn`` and returns None."""
        latest = self.latest_checkpoint
        if latest is not None:
            self.restore(latest)
            if self._checkpoint_interval is not None:
                self._last_checkpoint_step = int(self._step_counter.numpy())
            return latest
        if self._init_fn is not None:
            self._init_fn()
        return None

    # --- lifetime ----------------------------------------------------------

    def close(self) -> None:
        """Waits for an asynchronous save, then releases the directory's lock (if it took it).

        Removes the staging folder and restored copies. Raises an error of an
        asynchronous save not yet seen (the lock is released regardless).
        Later calls but the properties ``directory``, ``checkpoint`` and
        ``checkpoint_interval`` raise ``cairn.FailedPreconditionError``.
        """
        if self._closed:
            return
        self._closed = True
        try:
            self.sync()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            if self._cairn is not None:
                self._cairn.close()
            for d in [self._staging_root, self._ram_root, *self._restored_copies]:
                if d is not None:
                    shutil.rmtree(d, ignore_errors=True)
            self._restored_copies.clear()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- helpers -----------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise FailedPreconditionError(
                f"{self._directory}: the CheckpointManager is closed", "failed_precondition"
            )

    def _prefix_of(self, checkpoint: cairn.Checkpoint) -> str:
        """The TF prefix name in a committed checkpoint (from its metadata, else its files)."""
        meta = checkpoint.get_metadata().get(_METADATA_KEY)
        if isinstance(meta, dict) and isinstance(meta.get("prefix"), str):
            return meta["prefix"]
        for path, _ in checkpoint.files():
            if path.endswith(".index") and "/" not in path:
                return path[: -len(".index")]
        raise CorruptionError(
            f"{checkpoint.uri}: holds no TensorFlow checkpoint (no .index file)",
            "corruption",
        )

    def _published(self) -> list[Any]:
        """The kept checkpoints, oldest first, as records (``name``, ``pinned``, ``checkpoint``).

        The writer (``self._lock`` held): Cairn's kept records this manager
        has finished committing (a background commit's record is in Cairn's
        history a moment before its prefix is known here; it is named only
        from then on). A manager that has not saved: :meth:`_listed`.
        """
        if self._cairn is None:
            return self._listed()
        return [r for r in self._cairn.history() if r.name in self._prefixes]

    def _listed(self) -> list[_Listed]:
        """The committed checkpoints in the local directory, read without the lock.

        One directory read, then each ``checkpoint_NNNNNN`` folder's
        manifest: a folder is listed only if its manifest is committed
        (written last, after every file is durable), so an uncommitted save
        (the writer's, under way, or a killed one's leftover) is never
        named. A folder the writer's retention removes (manifest first) drops
        out. Refreshes ``self._prefixes`` (``self._lock`` held).
        """
        found: list[_Listed] = []
        try:
            names = os.listdir(self._path)
        except FileNotFoundError:
            names = []
        prefixes: dict[str, str] = {}
        for name in names:
            index = _index_of(name)
            if index is None:
                continue
            ckpt = cairn.Checkpoint(os.path.join(self._path, name))
            try:
                if not ckpt.is_committed():
                    continue
                prefixes[name] = self._prefix_of(ckpt)
            except (NotFoundError, FileNotFoundError):
                continue  # retired by the writer while read
            found.append(_Listed(index, name, ckpt))
        self._prefixes = prefixes
        return sorted(found, key=lambda r: r.index)

    def _full(self, folder: str, name: Optional[str] = None) -> str:
        rel = f"{folder}/{name if name is not None else self._prefixes[folder]}"
        if self._local:
            return os.path.join(self._directory, rel)
        return self._directory.rstrip("/") + "/" + rel

    def _record_for(self, save_path: Optional[str]) -> Optional[cairn.CheckpointRecord]:
        with self._lock:
            records = self._published()
            if save_path is None:
                return records[-1] if records else None
            want = os.fspath(save_path)
            for r in records:
                full = self._full(r.name)
                if want == full or (self._local and os.path.abspath(want) == os.path.abspath(full)):
                    return r
        raise NotFoundError(
            f"{want}: not a checkpoint kept by the manager of {self._directory}", "not_found"
        )

    def _write_state_file(self) -> None:
        """Replaces ``directory/checkpoint`` atomically with the committed checkpoints.

        Caller holds the lock (or is the constructor). Paths are relative to
        the directory, so a copied or moved directory still reads right.
        """
        from google.protobuf import text_format
        from tensorflow.python.training.checkpoint_state_pb2 import CheckpointState

        records = self._published()
        target = os.path.join(self._path, STATE_FILE)
        if not records:
            if os.path.exists(target):
                os.unlink(target)
                _fsync_dir(self._path)
            return
        rel = [f"{r.name}/{self._prefixes[r.name]}" for r in records if not r.pinned]
        stamps = [r.created_at for r in records if not r.pinned]
        latest = records[-1]
        latest_rel = f"{latest.name}/{self._prefixes[latest.name]}"
        if not rel or rel[-1] != latest_rel:
            rel.append(latest_rel)
            stamps.append(latest.created_at)
        pinned = [r.created_at for r in records if r.pinned]
        state = CheckpointState(
            model_checkpoint_path=latest_rel,
            all_model_checkpoint_paths=rel,
            all_model_checkpoint_timestamps=stamps,
            last_preserved_timestamp=max(pinned) if pinned else records[0].created_at - 1.0,
        )
        tmp = os.path.join(self._path, f".{STATE_FILE}.tmp-{os.getpid()}")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text_format.MessageToString(state))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        _fsync_dir(self._path)
