"""PyTorch helpers over Cairn's C++ state engine (docs/python.md).

- :func:`save_state` / :func:`load_state`: a model's and an optimizer's
  ``state_dict()`` (every ``torch.optim`` optimizer, LBFGS included) in one
  safetensors file, restored bit for bit, so training resumes exactly.
- :class:`StateCheckpointManager`: numbered checkpoints of a dict of tensors
  with retention, restored in place with TensorFlow's ``assert_consumed``
  check (``tf.train.CheckpointManager``'s contract).
- :class:`AsyncSaver`: saves that return once the tensors are copied; the
  writing and the commit run in the background.
- :func:`save_sharded` / :func:`commit_sharded` / :func:`load_sharded`: each
  rank saves its shards; any number of ranks loads them back (re-sharding,
  as ``torch.distributed.checkpoint`` does).

Every call does its work in the C++ core with the GIL released, so other
Python threads run meanwhile. ``import cairn`` does not import torch; this
module imports it only when a function needs it (state of numpy arrays works
without torch).
"""

from __future__ import annotations

from cairn._args import check_public as _check_public
from cairn.torch._managers import AsyncSaver, SaveHandle, StateCheckpointManager
from cairn.torch._sharded import Shard, commit_sharded, even_split, load_sharded, save_sharded
from cairn.torch._state import load_state, save_state

__all__ = [
    "save_state",
    "load_state",
    "StateCheckpointManager",
    "AsyncSaver",
    "SaveHandle",
    "Shard",
    "even_split",
    "save_sharded",
    "commit_sharded",
    "load_sharded",
]

# A wrong type in a public call is a TypeError naming the parameter.
_check_public(globals())
