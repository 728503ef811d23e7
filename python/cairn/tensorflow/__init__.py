"""TensorFlow over Cairn (docs/tensorflow.md).

- :class:`CheckpointManager`: ``tf.train.CheckpointManager`` whose saves are
  crash-safe Cairn commits of TensorFlow's own checkpoint files, on a local
  path or ``s3://``; ``tf.train.latest_checkpoint`` and
  ``tf.train.Checkpoint.restore`` keep working on a local directory.
- :func:`load_variables`: a safetensors file (``cairn.save`` of
  ``tf.Variable``/``keras.Variable`` values, or any writer's) assigned into
  existing variables by name, with ``assert_consumed``'s strictness.

``cairn.save`` takes ``tf.Tensor``, ``tf.Variable`` and ``keras.Variable``
values, and ``cairn.load(..., framework="tf")`` returns ``tf.Tensor`` values.
``import cairn`` does not import TensorFlow; this package imports it only
when a call needs it.
"""

from __future__ import annotations

from cairn._args import check_public as _check_public
from cairn.tensorflow._manager import CheckpointManager
from cairn.tensorflow._tensors import load_variables

__all__ = ["CheckpointManager", "load_variables"]

# A wrong type in a public call is a TypeError naming the parameter.
_check_public(globals())
