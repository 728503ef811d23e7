"""Cairn as the storage of ``torch.distributed.checkpoint`` (DCP).

:class:`Writer` and :class:`Reader` are a ``StorageWriter``/``StorageReader``
pair, so ``dcp.save``, ``dcp.async_save`` and ``dcp.load`` write and read
through Cairn (docs/torch.md, "PyTorch 2: DCP")::

    import torch.distributed.checkpoint as dcp
    from cairn.torch.dcp import Reader, Writer

    dcp.save(state, storage_writer=Writer("s3://bucket/run/step100"))
    dcp.load(state, storage_reader=Reader("s3://bucket/run/step100"))

The layout is DCP's own (``__<rank>_0.distcp`` per rank, ``.metadata``),
inside one Cairn checkpoint: every rank streams its file into the
uncommitted checkpoint, and the coordinator's ``finish()`` writes
``.metadata`` and then Cairn's manifest (every file's size and XXH3-64) last.
A process killed at any instant leaves either no checkpoint (no manifest:
:class:`Reader` refuses it, a manager's next open removes it) or a whole one.
A committed local checkpoint is also a folder DCP's own ``FileSystemReader``
reads.

Importing this module imports torch (``import cairn.torch`` does not); it
needs no initialized process group.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle
import re
import uuid
from collections.abc import Sequence
from typing import Any, Optional, Union

from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

import torch
from cairn import _cairn
from cairn._args import check_public as _check_public
from cairn._checkpoint import Checkpoint
from cairn._manager import CheckpointManager, CheckpointRecord
from cairn.errors import (
    AlreadyExistsError,
    CorruptionError,
    InvalidArgumentError,
    NotFoundError,
)

__all__ = ["Writer", "Reader"]

PathLike = Union[str, os.PathLike]

# DCP's names (torch/distributed/checkpoint/filesystem.py): FileSystemReader
# reads a checkpoint laid out so.
_METADATA = ".metadata"
_SUFFIX = ".distcp"
_DCP_VERSION = "1.0.0"
_RANK_FILE = re.compile(r"^__(\d+)_\d+\.distcp$")


def _invalid(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, "invalid_argument")


@dataclasses.dataclass(frozen=True)
class _Target:
    """What the coordinator's global plan tells each rank: where to write."""

    uri: str
    prefix: str


@dataclasses.dataclass(frozen=True)
class _Written:
    """A WriteResult's storage_data between ranks: DCP's own record of the
    item plus the entry (path, size, XXH3-64) of the file that holds it."""

    info: _StorageInfo
    entry: tuple[str, int, int]


def _location(dest: Union[Checkpoint, PathLike]) -> _cairn.Checkpoint:
    if isinstance(dest, Checkpoint):
        return dest._impl
    return _cairn.Checkpoint.from_directory(os.fspath(dest))


class Writer(StorageWriter):
    """A DCP ``StorageWriter`` that saves into one Cairn checkpoint.

    ``dest`` is where: a local path or URI (``s3://``, ``file://``) or a
    :class:`cairn.Checkpoint`, not yet committed; or a
    :class:`cairn.CheckpointManager`, whose next checkpoint the save becomes
    (committed with ``metrics`` and its retention applied, memory tier
    included). Only the coordinator's ``dest`` counts (rank 0's in
    ``dcp.save``): it tells the other ranks where to write, so they may pass
    None. ``dcp.save(..., checkpoint_id=p)`` replaces a path ``dest``.

    With ``commit=False`` nothing is committed and every rank writes into
    its own ``dest`` (a local folder each): the files a rank then hands to
    ``cairn.train.report``, whose driver commits every rank's together.

    After the save, on the coordinator, :attr:`checkpoint` is the committed
    checkpoint and :attr:`record` the manager's record (None without one).

    Raises (through ``dcp.save``, which wraps each rank's error in its
    ``CheckpointException``):
        cairn.AlreadyExistsError: ``dest`` is already committed (Cairn never
            writes into a committed checkpoint; DCP's FileSystemWriter
            would overwrite it).
        cairn.InvalidArgumentError: the coordinator has no ``dest``, or DCP
            runs without collectives (each rank its own metadata: nothing
            for one commit to cover).
        cairn.Error: the storage's failure, naming the file; nothing of the
            save is then visible, and what an earlier save committed is kept.
    """

    def __init__(
        self,
        dest: Union[Checkpoint, CheckpointManager, PathLike, None] = None,
        *,
        metrics: Optional[dict[str, Any]] = None,
        metadata: Optional[dict[str, Any]] = None,
        commit: bool = True,
    ) -> None:
        super().__init__()
        self._dest = dest
        self._metrics = metrics
        self._metadata = metadata
        self._commit = commit
        self._coordinator = True
        self._rank = 0
        self._reserved: Optional[_cairn.Checkpoint] = None
        self._save_id = uuid.uuid4().hex
        self.checkpoint: Optional[Checkpoint] = None
        self.record: Optional[CheckpointRecord] = None

    def __getstate__(self) -> dict[str, Any]:
        # dcp.async_save with a process executor sends the writer to a
        # process of its own, where a manager (and its lock) cannot go.
        if isinstance(self._dest, CheckpointManager):
            raise TypeError(
                "cairn.torch.dcp.Writer with a CheckpointManager cannot be sent to another "
                "process: use dcp.async_save's thread executor, or a path"
            )
        state = dict(self.__dict__)
        state["_reserved"] = None
        return state

    def reset(self, checkpoint_id: Union[str, os.PathLike[str], None] = None) -> None:
        """Starts a new save (``dcp.save`` calls it); ``checkpoint_id`` replaces a path dest.

        A reservation an earlier, failed save left in a manager is abandoned.
        """
        if checkpoint_id:
            if isinstance(self._dest, CheckpointManager):
                raise _invalid(
                    f"checkpoint_id={os.fspath(checkpoint_id)!r}: this Writer saves into a "
                    "CheckpointManager, which names its checkpoints itself"
                )
            self._dest = checkpoint_id
        self._abandon()
        self._save_id = uuid.uuid4().hex
        self.checkpoint = None
        self.record = None

    def _abandon(self) -> None:
        if self._reserved is not None and isinstance(self._dest, CheckpointManager):
            reserved, self._reserved = self._reserved, None
            self._dest._impl.abandon_reserved(reserved)
        self._reserved = None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Records this rank's part (``dcp.save`` calls it)."""
        self._coordinator = is_coordinator
        self._rank = int(kwargs.get("rank") or 0)
        if not kwargs.get("use_collectives", True):
            raise _invalid(
                "cairn.torch.dcp.Writer: dcp.save(use_collectives=False) writes one metadata "
                "per rank and no commit covers them all; use the default"
            )
        if is_coordinator and self._dest is None:
            raise _invalid(
                f"cairn.torch.dcp.Writer on rank {self._rank}, the coordinator: dest is None; "
                "give the coordinator a path, URI, Checkpoint or CheckpointManager"
            )

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """The coordinator picks the checkpoint (a manager reserves its next) and
        tells every rank where to write and its files' prefix."""
        if not self._commit:
            uri = ""
        elif isinstance(self._dest, CheckpointManager):
            self._reserved = self._dest._impl.reserve_next()
            uri = self._reserved.path
        else:
            where = _location(self._dest)  # type: ignore[arg-type]
            if where.is_committed():
                raise AlreadyExistsError(
                    f"{where.path}: already a committed checkpoint; a DCP save through Cairn "
                    "never overwrites one (save into a new path, or give a CheckpointManager)",
                    "already_exists",
                )
            uri = where.path
        return [
            dataclasses.replace(p, storage_data=_Target(uri, f"__{i}_"))
            for i, p in enumerate(plans)
        ]

    def _own_location(self) -> _cairn.Checkpoint:
        if self._dest is None or isinstance(self._dest, CheckpointManager):
            raise _invalid(
                f"cairn.torch.dcp.Writer(commit=False) on rank {self._rank}: every rank needs "
                "a folder of its own as dest"
            )
        return _location(self._dest)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Streams this rank's items into ``__<rank>_0.distcp`` of the checkpoint
        (durable on return); writes nothing when the rank has no items."""
        target: _Target = plan.storage_data
        results: list[WriteResult] = []
        if plan.items:
            where = (
                _cairn.Checkpoint.from_directory(target.uri)
                if self._commit
                else self._own_location()
            )
            name = f"{target.prefix}0{_SUFFIX}"
            out = _cairn.CheckpointFileWriter(where, name)
            placed: list[tuple[Any, int, int]] = []
            items = [i for i in plan.items if i.type == WriteItemType.BYTE_IO]
            items += [i for i in plan.items if i.type != WriteItemType.BYTE_IO]
            for item in items:
                try:
                    data = planner.resolve_data(item)
                except Exception as e:  # DCP pickles a non-tensor value here
                    raise _invalid(
                        f"rank {self._rank}: state entry {item.index.fqn!r} cannot be saved: "
                        f"{type(e).__name__}: {e}"
                    ) from e
                offset = out.size
                if item.type == WriteItemType.BYTE_IO:
                    out.append(data.getbuffer())
                else:
                    tensor = data.detach()
                    if tensor.device.type != "cpu":
                        tensor = tensor.cpu()
                    buf = io.BytesIO()
                    torch.save(tensor, buf)
                    out.append(buf.getbuffer())
                placed.append((item, offset, out.size - offset))
            entry = out.commit()
            for item, offset, length in placed:
                results.append(
                    WriteResult(
                        index=item.index,
                        size_in_bytes=length,
                        storage_data=_Written(_StorageInfo(name, offset, length), entry),
                    )
                )
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """The coordinator writes ``.metadata``, then commits every rank's file
        with Cairn's manifest last: only then is the checkpoint visible."""
        entries: dict[str, tuple[str, int, int]] = {}
        storage: dict[MetadataIndex, _StorageInfo] = {}
        for rank_results in results:
            for r in rank_results:
                written: _Written = r.storage_data
                storage[r.index] = written.info
                entries[written.entry[0]] = written.entry
        metadata.version = _DCP_VERSION
        metadata.storage_data = storage
        metadata.storage_meta = self.storage_meta()
        if not self._commit:
            where = self._own_location()
        elif self._reserved is not None:
            where = self._reserved
        else:
            where = _location(self._dest)  # type: ignore[arg-type]
        out = _cairn.CheckpointFileWriter(where, _METADATA)
        out.append(pickle.dumps(metadata))
        entry = out.commit()
        if not self._commit:
            return
        entries[_METADATA] = entry
        files = sorted(entries.values())
        metrics = dict(self._metrics) if self._metrics is not None else None
        if self._reserved is not None:
            manager: CheckpointManager = self._dest  # type: ignore[assignment]
            impl = manager._impl.commit_reserved(where, metrics or {}, files, self._metadata)
            self._reserved = None
            self.record = CheckpointRecord(impl)
            self.checkpoint = self.record.checkpoint
        else:
            _cairn.commit_files(where, files, metrics, self._metadata)
            self.checkpoint = Checkpoint(where)

    def storage_meta(self) -> Optional[StorageMeta]:
        dest = self._dest
        where = "" if dest is None or isinstance(dest, CheckpointManager) else dest
        if isinstance(where, Checkpoint):
            where = where.uri
        return StorageMeta(checkpoint_id=os.fspath(where), save_id=self._save_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Union[str, os.PathLike[str]]) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))


def _rank_of(path: str) -> str:
    m = _RANK_FILE.match(os.path.basename(path))
    return f"rank {m.group(1)}" if m else "the coordinator"


class Reader(StorageReader):
    """A DCP ``StorageReader`` over a committed Cairn checkpoint.

    ``src`` is a local path or URI, a :class:`cairn.Checkpoint` or a
    manager's :class:`cairn.CheckpointRecord` (``manager.latest()``);
    ``dcp.load(..., checkpoint_id=p)`` replaces it. Any world size loads any
    other's save (DCP's planner reshards). Each file a rank reads is checked
    against the manifest (size and XXH3-64) before any of it is used.

    Raises (through ``dcp.load``, which wraps each rank's error):
        cairn.NotFoundError: ``src`` is not a committed checkpoint, or a
            file the manifest lists is gone — naming the file, the rank
            that wrote it and the tensors it holds.
        cairn.CorruptionError: a file whose size or checksum differs from
            the manifest's, named the same way.
        cairn.InvalidArgumentError: the planner asks for a tensor (or a
            chunk of one) the checkpoint does not hold, naming it and the
            loading rank.
    """

    def __init__(
        self,
        src: Union[Checkpoint, CheckpointRecord, PathLike, None] = None,
        *,
        verify: bool = True,
    ) -> None:
        super().__init__()
        self._src = src
        self._verify = verify
        self._rank = 0
        self._files: dict[str, dict[str, Any]] = {}
        self._storage: dict[Any, _StorageInfo] = {}
        self._metadata: Optional[Metadata] = None

    def _where(self) -> _cairn.Checkpoint:
        src = self._src
        if src is None:
            raise _invalid("cairn.torch.dcp.Reader: no checkpoint (src is None)")
        if isinstance(src, CheckpointRecord):
            return src.checkpoint._impl
        return _location(src)

    def reset(self, checkpoint_id: Union[str, os.PathLike[str], None] = None) -> None:
        if checkpoint_id:
            self._src = checkpoint_id
        self._files = {}
        self._storage = {}

    def read_metadata(self) -> Metadata:
        """DCP's metadata of the checkpoint, checked against Cairn's manifest."""
        where = self._where()
        if not where.is_committed():
            raise NotFoundError(
                f"{where.path}: not a committed Cairn checkpoint (no manifest): a save that "
                "did not finish, or not a checkpoint",
                "not_found",
            )
        manifest = json.loads(where.manifest_json())
        self._files = {f["path"]: f for f in manifest["files"]}
        raw = self._read(where, _METADATA, [])
        metadata = pickle.loads(raw)
        if not isinstance(metadata, Metadata):
            raise CorruptionError(f"{where.path}/{_METADATA}: not DCP's metadata", "corruption")
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = uuid.uuid4().hex
        self._metadata = metadata
        return metadata

    def _read(self, where: _cairn.Checkpoint, path: str, holds: Sequence[str]) -> bytes:
        """The bytes of ``path``, checked against the manifest."""

        def named() -> str:
            shown = ", ".join(list(holds)[:5]) + (", ..." if len(holds) > 5 else "")
            tensors = f", holding {shown}" if holds else ""
            return f"{where.path}/{path} (written by {_rank_of(path)}{tensors})"

        entry = self._files.get(path)
        if entry is None:
            raise CorruptionError(f"{named()}: not in the checkpoint's manifest", "corruption")
        try:
            raw = where.read_file(path)
        except NotFoundError:
            raise NotFoundError(f"{named()}: missing from the checkpoint", "not_found") from None
        if len(raw) != entry["size"]:
            raise CorruptionError(
                f"{named()}: size {len(raw)}, the manifest says {entry['size']}", "corruption"
            )
        if self._verify:
            import xxhash

            digest = xxhash.xxh3_64_intdigest(raw)
            if digest != _xxh3_of(entry):
                raise CorruptionError(
                    f"{named()}: checksum {digest:016x} does not match the manifest's "
                    f"{_xxh3_of(entry):016x} (the file changed after it was committed)",
                    "corruption",
                )
        return raw

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        self._storage = metadata.storage_data
        self._rank = int(kwargs.get("rank") or 0)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """Refuses a plan that asks for what the checkpoint does not hold."""
        missing = [i.storage_index for i in plan.items if i.storage_index not in self._storage]
        if missing:
            shown = ", ".join(
                f"{m.fqn!r} at offsets {list(m.offset) if m.offset is not None else '-'}"
                for m in missing[:5]
            )
            raise _invalid(
                f"{self._where().path}: rank {self._rank}'s planner asks for {len(missing)} "
                f"item(s) the checkpoint does not hold: {shown}"
            )
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Reads each file this rank needs once, checks it, and hands DCP its items."""
        where = self._where()
        per_file: dict[str, list[Any]] = {}
        for item in plan.items:
            per_file.setdefault(self._storage[item.storage_index].relative_path, []).append(item)
        for path, items in per_file.items():
            holds = sorted({i.storage_index.fqn for i in items})
            raw = memoryview(self._read(where, path, holds))
            for req in items:
                info = self._storage[req.storage_index]
                piece = raw[info.offset : info.offset + info.length]
                if req.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(req, io.BytesIO(piece))
                    continue
                tensor = torch.load(io.BytesIO(piece), map_location="cpu", weights_only=True)
                tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
                target = planner.resolve_tensor(req).detach()
                if target.size() != tensor.size():
                    raise CorruptionError(
                        f"{where.path}/{path} (written by {_rank_of(path)}): tensor "
                        f"{req.storage_index.fqn!r} has shape {list(tensor.size())} where "
                        f"the plan wants {list(target.size())}",
                        "corruption",
                    )
                target.copy_(tensor)
                planner.commit_tensor(req, target)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Union[str, os.PathLike[str]]) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))


def _xxh3_of(entry: dict[str, Any]) -> int:
    value = entry["xxh3"]
    return int(value, 16) if isinstance(value, str) else int(value)


# A wrong type in a public call is a TypeError naming the parameter.
_check_public(globals())
