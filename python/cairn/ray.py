"""Cairn inside Ray: Ray Train keeps running the workers, Cairn commits the checkpoints.

A Ray Train user who stays on Ray's cluster passes Cairn's upload function
to Ray's report (docs/ray.md, "Cairn inside Ray")::

    import cairn.ray

    ray.train.report(metrics, checkpoint=checkpoint,
                     checkpoint_upload_fn=cairn.ray.checkpoint_upload_fn)

Ray then hands each reported checkpoint to :func:`checkpoint_upload_fn`
instead of copying it with pyarrow. The files go into the folder Ray chose
for the checkpoint through Cairn's storage (its retries, its S3 credentials
and multipart uploads), checksummed on the way, and Cairn's manifest is
written last: a folder without it is not a checkpoint, so a worker killed
mid-upload leaves nothing that reads as whole, and ``cairn verify`` checks
any checkpoint of the run. Ray registers the checkpoint only once the
function returned, as with its own upload.

This module imports Ray only when the function is called.
"""

from __future__ import annotations

from typing import Any

from cairn import _cairn
from cairn._args import check_public as _check_public
from cairn._checkpoint import _from_uri, _location
from cairn.errors import AlreadyExistsError

__all__ = ["checkpoint_upload_fn"]

# The key of the checkpoint metadata that names the rank that uploaded it.
_META_KEY = "cairn.ray"


def checkpoint_upload_fn(checkpoint: Any, checkpoint_dir_name: str) -> Any:
    """Ray Train's ``checkpoint_upload_fn``: commits ``checkpoint`` (a
    ``ray.train.Checkpoint`` in a local folder) as a Cairn checkpoint in the
    folder Ray named ``checkpoint_dir_name`` under the run's storage, and
    returns it as a ``ray.train.Checkpoint`` there.

    Call it through ``ray.train.report(..., checkpoint_upload_fn=...)`` in
    a Ray Train worker. One rank's files make a checkpoint: a second rank
    uploading into the same checkpoint is refused. The same rank uploading
    again under a name it committed before replaces that checkpoint: after
    a restart Ray redoes a report whose checkpoint it had not registered
    (its checkpoint metadata ``"cairn.ray"`` names the rank).

    Raises:
        cairn.AlreadyExistsError: the checkpoint is already committed
            (another rank uploaded it), naming it and this rank.
        cairn.Error: the upload failed; nothing was committed.
        TypeError: a storage filesystem Cairn does not write to (local
            folders and S3 are), named.
    """
    import ray.train

    context = ray.train.get_context()
    storage = context.get_storage()
    path = storage.build_checkpoint_path_from_name(checkpoint_dir_name)
    filesystem = storage.storage_filesystem
    uri = _location(path, filesystem)
    source = checkpoint.path
    if getattr(checkpoint.filesystem, "type_name", "local") != "local":
        raise NotImplementedError(
            f"cairn.ray.checkpoint_upload_fn: the reported checkpoint {source} is not in a "
            "local folder"
        )
    _commit(source, uri, context.get_world_rank())
    return ray.train.Checkpoint(path, filesystem)


def _commit(source: str, uri: str, rank: int) -> None:
    """Commits the local folder ``source`` as the checkpoint at ``uri`` for
    world rank ``rank`` (checkpoint_upload_fn's work, without Ray)."""
    mine = {_META_KEY: {"world_rank": rank}}
    dest = _from_uri(uri)
    try:
        _cairn.commit_directory(source, dest._impl, None, mine)
    except AlreadyExistsError as e:
        # The same rank uploading under a name it committed before: a group
        # Ray restarted redoes a report whose checkpoint Ray had not yet
        # registered when the worker died. That one was never handed out:
        # replace it (the old one is deleted manifest first).
        if dest.get_metadata().get(_META_KEY, {}).get("world_rank") != rank:
            raise AlreadyExistsError(
                f"rank {rank}: checkpoint {uri} was already committed by another rank; with "
                "Cairn inside Ray one rank's files make a checkpoint (report the checkpoint "
                f"from one rank): {e}"
            ) from e
        _cairn.delete_checkpoint(dest._impl)
        _cairn.commit_directory(source, dest._impl, None, mine)


_check_public(globals())
