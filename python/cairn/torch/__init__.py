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
- :func:`save_distributed` / :func:`load_distributed`: DTensor and FSDP2
  state dicts through the same path, any world size and mesh on load.
- :func:`save_pretrained` / :func:`load_pretrained`: Hugging Face's weights
  layout, committed as a Cairn checkpoint.

Every call does its work in the C++ core with the GIL released, so other
Python threads run meanwhile. ``import cairn`` does not import torch; this
module imports it only when a function needs it (state of numpy arrays works
without torch).
"""

from __future__ import annotations

from cairn._args import check_public as _check_public
from cairn.torch._distributed import load_distributed, save_distributed
from cairn.torch._managers import AsyncSaver, SaveHandle, StateCheckpointManager
from cairn.torch._pretrained import LoadResult, load_pretrained, save_pretrained
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
    "save_distributed",
    "load_distributed",
    "save_pretrained",
    "load_pretrained",
    "LoadResult",
]

# A wrong type in a public call is a TypeError naming the parameter.
_check_public(globals())
