"""Lightning's ``CheckpointIO`` through Cairn: atomic, checksummed checkpoints.

``Trainer(plugins=[CairnCheckpointIO()])`` (or :class:`AsyncCairnCheckpointIO`)
makes every checkpoint Lightning saves — ``ModelCheckpoint``'s top-k files,
``last.ckpt``, ``trainer.save_checkpoint(path)`` — a Cairn commit.

Layout. The path Lightning names, ``dirpath/epoch=3-step=40.ckpt``, is a
folder: a Cairn experiment (the layout of :class:`cairn.CheckpointManager`)
that keeps one checkpoint, ``checkpoint_NNNNNN/state.safetensors`` plus its
manifest. The Lightning checkpoint is the newest committed one. Saving under
a name that exists (``last.ckpt`` every epoch) commits a new checkpoint
manifest-last and only then retires the old one; a local name that does not
exist yet is saved into a hidden sibling (``.<name>.cairn-new-<id>``, which
no ``*.ckpt`` pattern matches) renamed to the name once committed. So at
every instant, a SIGKILL included, a name holds a whole checkpoint (the new
one or the one before) or does not exist yet. What a killed save leaves (an
uncommitted folder, a hidden sibling) no load reads, and the next save there
removes it.

Inside the file. Every dense ``torch.Tensor`` of the checkpoint dict
(``state_dict``, optimizer states, wherever it sits) is a tensor of the
safetensors file, written by Cairn's engine, named by where it sits
(``state_dict/layer.weight``, ``optimizer_states/0/state/0/exp_avg``). The
rest (epoch, loops, callbacks' state, hparams) is pickled with each tensor
replaced by its number, into one ``uint8`` tensor of the same file
(``cairn.lightning.objects``), so the whole checkpoint is one checksummed
file. A tensor that is not a plain dense tensor of a safetensors dtype (a
``Parameter`` with ``requires_grad``, sparse, quantized or complex tensors)
is pickled as ``torch.save`` would. Loads verify the checkpoint's checksums
(``Checkpoint.verify``) before reading it, and give back the dict
``TorchCheckpointIO`` would: the same keys, values, dtypes and shapes, tensors
on the CPU unless ``map_location`` says otherwise. Non-contiguous tensors come
back contiguous, and tensors that shared storage come back separate.

Lightning's own path logic works unchanged: ``ModelCheckpoint`` lists
``dirpath`` to find ``last*.ckpt`` for ``fit(ckpt_path="last")``, removes
top-k losers through :meth:`CairnCheckpointIO.remove_checkpoint`, and
``save_last="link"`` symlinks ``last.ckpt`` to a top-k folder (loads follow
the link).
"""

from __future__ import annotations

import io
import os
import pickle
import posixpath
import shutil
import threading
import uuid
from typing import Any, Optional, Union

import numpy as np
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

import torch
from cairn import _cairn
from cairn._args import check_public as _check_public
from cairn._cairn import CheckpointConfig
from cairn._checkpoint import Checkpoint
from cairn._manager import CheckpointManager
from cairn._tensors import load, load_metadata
from cairn.errors import CorruptionError, InvalidArgumentError, NotFoundError

PathLike = Union[str, "os.PathLike[str]"]

_META_KEY = "cairn.lightning"
_FORMAT = 1
_OBJECTS = "cairn.lightning.objects"
_FILE = "state.safetensors"
_REMOVING = ".cairn-removing-"
_NEW = ".cairn-new-"
# The pickled objects are padded to a multiple of this, so that a state
# whose objects grow by a few bytes keeps the async saver's staging size.
_OBJECTS_ALIGN = 1 << 16

_DTYPES = {
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
}
for _name in ("uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        _DTYPES.add(getattr(torch, _name))


def _stored_as_tensor(value: Any) -> bool:
    """Whether the engine stores ``value`` (else it is pickled with the objects)."""
    return (
        type(value) is torch.Tensor
        and value.layout == torch.strided
        and value.dtype in _DTYPES
        and not value.requires_grad
        and not value.is_quantized
        and not value.is_nested
        and value.device.type in ("cpu", "cuda")
    )


def _paths(obj: Any, at: str, out: dict[int, str], seen: set[int]) -> None:
    """Names tensors reachable through dicts, lists and tuples by where they sit."""
    if id(obj) in seen:
        return
    if isinstance(obj, torch.Tensor):
        out.setdefault(id(obj), at)
        return
    if isinstance(obj, dict):
        seen.add(id(obj))
        for k, v in obj.items():
            _paths(v, f"{at}/{k}" if at else str(k), out, seen)
    elif isinstance(obj, (list, tuple)):
        seen.add(id(obj))
        for i, v in enumerate(obj):
            _paths(v, f"{at}/{i}" if at else str(i), out, seen)


class _Pickler(pickle.Pickler):
    """Pickles the objects, each stored tensor replaced by its number (an int
    persistent id, which torch's ``weights_only`` unpickler accepts)."""

    def __init__(self, file: io.BytesIO, names: dict[int, str]) -> None:
        super().__init__(file, protocol=2)
        self._names = names
        self._ids: dict[int, int] = {}
        self.tensors: list[tuple[str, Any]] = []
        self._used: set[str] = {_OBJECTS}

    def persistent_id(self, obj: Any) -> Optional[int]:
        if not _stored_as_tensor(obj):
            return None
        number = self._ids.get(id(obj))
        if number is None:
            number = len(self.tensors)
            self._ids[id(obj)] = number
            name = self._names.get(id(obj), f"objects/{number}")
            if name in self._used:
                name = f"{name}#{number}"
            self._used.add(name)
            self.tensors.append((name, obj))
        return number


def _split(checkpoint: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the tensors to save by name, the file's metadata) for ``checkpoint``."""
    if not isinstance(checkpoint, dict):
        raise TypeError(f"checkpoint: a dict, not a {type(checkpoint).__name__}")
    names: dict[int, str] = {}
    _paths(checkpoint, "", names, set())
    buf = io.BytesIO()
    pickler = _Pickler(buf, names)
    pickler.dump(checkpoint)
    raw = buf.getvalue()
    padded = -(-len(raw) // _OBJECTS_ALIGN) * _OBJECTS_ALIGN
    objects = np.zeros(padded, dtype=np.uint8)
    objects[: len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    tensors: dict[str, Any] = {_OBJECTS: objects}
    devices: dict[str, str] = {}
    for number, (name, t) in enumerate(pickler.tensors):
        if t.device.type != "cpu":
            devices[str(number)] = str(t.device)
        tensors[name] = t if t.is_contiguous() else t.contiguous()
    meta = {
        _META_KEY: {
            "format": _FORMAT,
            "objects_bytes": len(raw),
            "tensors": [name for name, _ in pickler.tensors],
            "devices": devices,
        }
    }
    return tensors, meta


def _is_remote(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def _local(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


def _parent_and_name(path: str) -> tuple[str, str]:
    """The folder a checkpoint's name sits in, and the name."""
    trimmed = path.rstrip("/")
    if _is_remote(trimmed):
        parent, name = posixpath.split(trimmed)
    else:
        parent, name = os.path.split(os.path.abspath(_local(trimmed)))
    if not name:
        raise InvalidArgumentError(f"path {path!r}: names no checkpoint", "invalid_argument")
    return parent, name


def _where(path: Any) -> str:
    """A checkpoint path as a string (``str`` or ``os.PathLike``)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: a str or os.PathLike, not a {type(path).__name__}")
    return os.fspath(path)


def _place(t: Any, saved_on: str, map_location: Any) -> Any:
    """``t`` (a tensor saved from ``saved_on``) moved where ``map_location`` says."""
    if map_location is None:
        return t
    if callable(map_location):
        moved = map_location(t.untyped_storage(), saved_on)
        device = getattr(moved, "device", None)
        if device is None or torch.device(device) == t.device:
            return t
        return t.to(device)
    if isinstance(map_location, dict):
        target = map_location.get(saved_on)
        return t if target is None else t.to(target)
    return t.to(map_location)


class CairnCheckpointIO(CheckpointIO):
    """Lightning's ``CheckpointIO`` that commits each checkpoint through Cairn.

    Each path names a folder holding a Cairn experiment that keeps one
    checkpoint (see the module's docstring): saving under an existing name
    commits the new checkpoint before the old one is retired, so a crash at
    any instant leaves the old checkpoint or the new one under the name, whole.
    Paths are local paths, ``file://`` or ``s3://`` URIs (docs/s3.md).

    Thread safety: one instance may be used by one training process; saves to
    one name must not run from two processes at once (``cairn.LockedError``).
    """

    def save_checkpoint(
        self,
        checkpoint: dict[str, Any],
        path: PathLike,
        storage_options: Optional[Any] = None,
    ) -> None:
        """Commits ``checkpoint`` under ``path``; durable when this returns.

        Raises:
            NotImplementedError: ``storage_options`` given (Cairn reads its
                storage settings as docs/s3.md says).
            FileExistsError: ``path`` is a file (not a Cairn checkpoint), left as it is.
            cairn.Error: the write failed (naming the file); what ``path`` held
                before is intact.
        """
        where = _where(path)
        _refuse_storage_options(type(self).__name__, storage_options)
        _refuse_plain_file(where)
        tensors, meta = _split(checkpoint)
        from cairn.torch import StateCheckpointManager

        target = _target(where)
        staging = _staging(target)
        if staging is not None:
            _sweep(os.path.dirname(target), keep=())
        with StateCheckpointManager(staging or target, max_to_keep=1) as manager:
            manager.save(None, tensors, metadata=meta)
        if staging is not None:
            _publish(staging, target)

    def load_checkpoint(
        self,
        path: PathLike,
        map_location: Optional[Any] = None,
        weights_only: Optional[bool] = None,
    ) -> dict[str, Any]:
        """The checkpoint dict saved under ``path``, its checksums verified.

        Args:
            path: a checkpoint this plugin saved; a local plain file (one
                ``TorchCheckpointIO`` wrote) is read as that plugin reads it,
                so a run can switch plugins and resume.
            map_location: ``None`` keeps tensors on the CPU (Lightning's
                default); a device, a device string, a dict of saved device to
                device, or ``torch.load``'s function of (storage, location).
            weights_only: ``True`` unpickles the objects with torch's
                ``weights_only`` unpickler; ``None`` or ``False`` with pickle
                (the checkpoint is one this plugin wrote and checksummed: load
                only checkpoints you trust).

        Raises:
            FileNotFoundError: nothing at ``path``.
            cairn.CorruptionError: a file of the checkpoint fails its
                checksum (naming the file and the reason).
            cairn.InvalidArgumentError: ``path`` holds no checkpoint of this
                plugin (saying what it holds instead).
        """
        where = _where(path)
        local = None if _is_remote(where) else _local(where)
        if local is not None:
            if not os.path.exists(local):
                raise FileNotFoundError(f"Checkpoint file not found: {where}")
            if os.path.isfile(local):
                return TorchCheckpointIO().load_checkpoint(
                    local,
                    map_location=map_location or (lambda storage, loc: storage),
                    weights_only=weights_only,
                )
        checkpoint = _latest(where)
        problems = checkpoint.verify()
        if problems:
            listed = "; ".join(f"{p.path}: {p.reason}" for p in problems)
            raise CorruptionError(
                f"{where}: checkpoint {checkpoint.path} fails its checksums: {listed}",
                "corruption",
            )
        file = f"{checkpoint.path.rstrip('/')}/{_FILE}"
        meta = load_metadata(file)
        own = meta.get(_META_KEY)
        if not isinstance(own, dict) or own.get("format") != _FORMAT:
            raise InvalidArgumentError(
                f"{file}: not a checkpoint written by cairn.lightning "
                f"(no {_META_KEY!r} metadata of format {_FORMAT})",
                "invalid_argument",
            )
        tensors = load(file)
        names = own["tensors"]
        devices = own.get("devices", {})
        raw = tensors[_OBJECTS].numpy()[: int(own["objects_bytes"])].tobytes()

        def tensor(number: int) -> Any:
            if not isinstance(number, int) or not 0 <= number < len(names):
                raise CorruptionError(f"{file}: no tensor number {number!r}", "corruption")
            saved_on = devices.get(str(number), "cpu")
            return _place(tensors[names[number]], saved_on, map_location)

        if weights_only:
            from torch import _weights_only_unpickler

            unpickler: Any = _weights_only_unpickler.Unpickler(io.BytesIO(raw), encoding="utf-8")
        else:
            unpickler = pickle.Unpickler(io.BytesIO(raw))
        unpickler.persistent_load = tensor
        loaded = unpickler.load()
        self._loaded(tensors, meta)
        return loaded

    def remove_checkpoint(self, path: PathLike) -> None:
        """Removes the checkpoint at ``path`` (nothing if there is none).

        A local checkpoint is first renamed to a hidden name that no
        ``*.ckpt`` pattern matches (atomic), then deleted, so a crash midway
        leaves no part of it under its name; a symlink (``save_last="link"``)
        is removed, not what it points to.

        In a store (``s3://``), where there is no rename, each committed
        checkpoint under the name is deleted manifest first, so no reader
        ever loads a part of one, then every object left under it.
        """
        where = _where(path)
        if _is_remote(where):
            _cairn.delete_experiment(where)
            return
        local = os.path.abspath(_local(where))
        _sweep(os.path.dirname(local), keep=self._staging_in_use())
        if os.path.islink(local) or os.path.isfile(local):
            os.remove(local)
        elif os.path.isdir(local):
            hidden = os.path.join(
                os.path.dirname(local),
                f".{os.path.basename(local)}{_REMOVING}{uuid.uuid4().hex}",
            )
            os.rename(local, hidden)
            shutil.rmtree(hidden)

    def teardown(self) -> None:
        """Nothing to release: each save opened and closed what it used."""

    def _staging_in_use(self) -> tuple[str, ...]:
        """Staging folders of saves still behind (none for synchronous saves)."""
        return ()

    def _loaded(self, tensors: dict[str, Any], meta: dict[str, Any]) -> None:
        """Called with the tensors and metadata of each checkpoint loaded."""


class AsyncCairnCheckpointIO(CairnCheckpointIO):
    """:class:`CairnCheckpointIO` whose saves return once the tensors are copied.

    ``save_checkpoint`` pickles the objects and copies every tensor into the
    staging memory of a :class:`cairn.torch.AsyncSaver` (allocated once and
    reused), then returns; the write, the commit and the old checkpoint's
    retirement run behind. A crash while a save is behind leaves the name
    holding the checkpoint before, whole. Loads and removals wait for the
    saves behind; so does :meth:`teardown`, which Lightning calls at the end of
    ``fit``. An error of a save behind is raised by the next
    ``save_checkpoint`` or by :meth:`teardown`.

    The first save of a process allocates the staging memory (a stall longer
    than the later ones'); a load (``fit(ckpt_path=...)``) allocates it in the
    background for states like the loaded one.

    Args:
        max_in_flight: saves that may be behind at once; a save beyond waits.
    """

    def __init__(self, max_in_flight: int = 1) -> None:
        super().__init__()
        if max_in_flight < 1:
            raise InvalidArgumentError(
                f"max_in_flight {max_in_flight}: at least 1", "invalid_argument"
            )
        self._max_in_flight = max_in_flight
        self._saver: Any = None
        self._pending: dict[str, _Behind] = {}  # by target
        self._lock = threading.Lock()

    def save_checkpoint(
        self,
        checkpoint: dict[str, Any],
        path: PathLike,
        storage_options: Optional[Any] = None,
    ) -> None:
        """Starts committing ``checkpoint`` under ``path``; returns once it is copied.

        The caller may change its tensors as soon as this returns.

        Raises:
            NotImplementedError, FileExistsError: as :meth:`CairnCheckpointIO.save_checkpoint`.
            cairn.Error: an earlier save's error not yet raised.
        """
        where = _where(path)
        _refuse_storage_options(type(self).__name__, storage_options)
        _refuse_plain_file(where)
        tensors, meta = _split(checkpoint)
        target = _target(where)
        with self._lock:
            self._raise_finished(keep=target)
            # A save to this name still behind holds its experiment's lock,
            # which the saver releases at its next call after the save.
            previous = self._pending.pop(target, None)
            if previous is not None:
                previous.finish()
                self._saver.wait_all()
            if self._saver is None:
                from cairn.torch import AsyncSaver

                self._saver = AsyncSaver(max_in_flight=self._max_in_flight)
            staging = _staging(target)
            if staging is not None:
                _sweep(os.path.dirname(target), keep=self._staging_in_use())
            parent, name = _parent_and_name(staging or target)
            manager = CheckpointManager(parent, name, CheckpointConfig(num_to_keep=1))
            try:
                handle = self._saver.save(tensors, manager, metadata=meta)
            finally:
                manager.close()  # the saver keeps it open until the save is done
            self._pending[target] = _Behind(handle, staging, target)

    def load_checkpoint(
        self,
        path: PathLike,
        map_location: Optional[Any] = None,
        weights_only: Optional[bool] = None,
    ) -> dict[str, Any]:
        """As :meth:`CairnCheckpointIO.load_checkpoint`, after the saves behind."""
        self.wait()
        return super().load_checkpoint(path, map_location, weights_only)

    def remove_checkpoint(self, path: PathLike) -> None:
        """As :meth:`CairnCheckpointIO.remove_checkpoint`, after a save behind to ``path``."""
        target = _target(_where(path))
        with self._lock:
            behind = self._pending.pop(target, None)
            if behind is not None:
                behind.finish()
                self._saver.wait_all()  # releases the experiment's lock
        super().remove_checkpoint(path)

    def wait(self) -> None:
        """Waits until every save behind is committed; raises the first that failed."""
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
            saver = self._saver
        for behind in pending:
            behind.finish()
        if saver is not None:
            saver.wait_all()

    def teardown(self) -> None:
        """Waits for the saves behind and frees the staging memory; raises a save's error."""
        try:
            self.wait()
        finally:
            with self._lock:
                saver, self._saver = self._saver, None
            if saver is not None:
                saver.close()

    def _raise_finished(self, keep: str) -> None:
        """Raises the error of a finished save behind and forgets the finished
        ones, but for ``keep``'s (the caller holds the lock)."""
        for target, behind in list(self._pending.items()):
            if behind.done():
                if target != keep:
                    del self._pending[target]
                behind.finish()

    def _staging_in_use(self) -> tuple[str, ...]:
        return tuple(b.staging for b in self._pending.values() if b.staging is not None)

    def _loaded(self, tensors: dict[str, Any], meta: dict[str, Any]) -> None:
        # A resumed run saves states like the one it loaded: ready the
        # staging memory for them on the saver's thread meanwhile, so that
        # its first save stalls for a copy, not for fresh memory.
        with self._lock:
            if self._saver is None:
                from cairn.torch import AsyncSaver

                self._saver = AsyncSaver(max_in_flight=self._max_in_flight)
            self._saver.reserve(tensors, metadata=meta)


def _target(where: str) -> str:
    """The location a save under ``where`` commits to (an absolute local path or a URI)."""
    if _is_remote(where):
        return where.rstrip("/")
    return os.path.abspath(_local(where))


def _refuse_storage_options(plugin: str, storage_options: Any) -> None:
    if storage_options is not None:
        raise NotImplementedError(
            f"{plugin}.save_checkpoint(storage_options=...): Cairn takes its storage "
            "settings from the environment and its configuration (docs/s3.md), not per save"
        )


def _refuse_plain_file(where: str) -> None:
    if not _is_remote(where) and os.path.isfile(_local(where)):
        raise FileExistsError(
            f"{where}: a file, not a Cairn checkpoint (written by another CheckpointIO?); "
            "it is left as it is: remove it or save under another name"
        )


def _latest(where: str) -> Checkpoint:
    """The newest committed checkpoint under ``where``, read without the lock."""
    from cairn.train import Result

    try:
        result = Result.from_path(where)
    except NotFoundError as e:
        if _is_remote(where):  # a store has no folders: nothing is there
            raise FileNotFoundError(f"Checkpoint file not found: {where} ({e})") from e
        raise InvalidArgumentError(
            f"{where}: not a checkpoint saved by cairn.lightning (no committed checkpoint "
            f"there: {e})",
            "invalid_argument",
        ) from e
    if result.checkpoint is None:
        raise InvalidArgumentError(
            f"{where}: not a checkpoint saved by cairn.lightning (no committed checkpoint there)",
            "invalid_argument",
        )
    return result.checkpoint


def _sweep(folder: str, keep: tuple[str, ...]) -> None:
    """Deletes what saves and removals killed midway left in ``folder`` (hidden
    folders with a staging or removal mark), but for the paths in ``keep``."""
    try:
        names = os.listdir(folder)
    except OSError:  # ignore-error: no folder, nothing left to sweep
        return
    for name in names:
        path = os.path.join(folder, name)
        if name.startswith(".") and (_REMOVING in name or _NEW in name) and path not in keep:
            shutil.rmtree(path, ignore_errors=True)


def _staging(target: str) -> Optional[str]:
    """A hidden sibling to save a local checkpoint into when ``target`` does
    not exist yet (it is renamed to ``target`` once committed), else None.

    An existing name (a Cairn experiment) takes the save itself: its newest
    checkpoint stays whole until the new one commits. A new name appears only
    whole, by the rename. In a store (no rename) the new name's objects appear
    as they are written; a load finds no committed checkpoint there until the
    commit and says so.
    """
    if _is_remote(target) or os.path.lexists(target):
        return None
    parent, name = os.path.split(target)
    os.makedirs(parent, exist_ok=True)
    return os.path.join(parent, f".{name}{_NEW}{uuid.uuid4().hex}")


def _publish(staging: str, target: str) -> None:
    """Renames the committed ``staging`` folder to ``target`` and syncs the folder."""
    os.rename(staging, target)
    fd = os.open(os.path.dirname(target), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Behind:
    """An asynchronous save still behind: its handle and, for a new local
    name, the thread that renames its staging folder once it commits."""

    def __init__(self, handle: Any, staging: Optional[str], target: str) -> None:
        self.handle = handle
        self.staging = staging
        self.error: Optional[BaseException] = None
        self.thread: Optional[threading.Thread] = None
        if staging is not None:
            self.thread = threading.Thread(
                target=self._publish, args=(target,), name="cairn-lightning-publish", daemon=True
            )
            self.thread.start()

    def _publish(self, target: str) -> None:
        try:
            self.handle.wait()
            assert self.staging is not None
            _publish(self.staging, target)
        except BaseException as e:  # raised by finish(), on the caller's thread
            self.error = e

    def done(self) -> bool:
        return self.handle.done() and (self.thread is None or not self.thread.is_alive())

    def finish(self) -> None:
        """Waits for the save (and the rename); raises its error."""
        if self.thread is None:
            self.handle.wait()
            return
        self.thread.join()
        if self.error is not None:
            raise self.error


__all__ = ["CairnCheckpointIO", "AsyncCairnCheckpointIO"]

# A wrong type in a public call is a TypeError naming the parameter.
_check_public(globals())
