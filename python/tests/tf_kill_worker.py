"""A fork server that saves TensorFlow checkpoints through cairn.tensorflow until killed.

test_tensorflow.py's SIGKILL test runs this file as a process that imports
TensorFlow and Cairn once (about 3 s) and then, for each ``run <dir>`` line
on stdin, forks a child that builds the model, opens a
``cairn.tensorflow.CheckpointManager`` on ``<dir>`` (``max_to_keep=3``) and
saves in a loop, every other save asynchronous: at each step every variable
(model weights, Adam's slots and iteration count, the step counter) is set
to values derived from the step alone (:func:`expected`), so a checker can
tell exactly what a checkpoint must hold. The child writes ``c <step>`` each
time ``save()`` returns (the first save of a child is synchronous, so its
line means a commit); the server writes ``pid <pid>`` after the fork and, for a ``wait``
line, reaps the child and writes ``dead <status>``. Forking is safe here
because the server itself never runs a TensorFlow op (TensorFlow starts its
runtime's threads on the first op, in the child).
"""

from __future__ import annotations

import os
import sys
from typing import Any

MAX_TO_KEEP = 3


def build() -> tuple[Any, Any, Any]:
    """The model, its optimizer (slots created) and the checkpoint of all three."""
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [tf.keras.Input((32,)), tf.keras.layers.Dense(64), tf.keras.layers.Dense(8)]
    )
    optimizer = tf.keras.optimizers.Adam(learning_rate=0.001)
    optimizer.build(model.trainable_variables)
    ckpt = tf.train.Checkpoint(
        step=tf.Variable(0, dtype=tf.int64), optimizer=optimizer, model=model
    )
    return model, optimizer, ckpt


def variables(model: Any, optimizer: Any, ckpt: Any) -> list[Any]:
    """Every variable the checkpoint holds, in a fixed order."""
    return [ckpt.step, *model.weights, *optimizer.variables]


def expected(step: int, index: int, shape: tuple[int, ...], dtype: Any) -> Any:
    """What variable ``index`` holds at ``step``: distinct in every element."""
    import numpy as np

    size = int(np.prod(shape)) if shape else 1
    if np.issubdtype(dtype, np.integer):
        return np.full(shape, step, dtype=dtype)
    return ((np.arange(size) % 997) * 0.25 + step * 1000 + index).astype(dtype).reshape(shape)


def numpy_dtype(v: Any) -> Any:
    """A tf.Variable's or keras.Variable's dtype, as numpy's."""
    import numpy as np
    import tensorflow as tf

    return np.dtype(tf.dtypes.as_dtype(v.dtype).as_numpy_dtype)


def set_step(step: int, model: Any, optimizer: Any, ckpt: Any) -> None:
    for i, v in enumerate(variables(model, optimizer, ckpt)):
        v.assign(expected(step, i, tuple(v.shape), numpy_dtype(v)))


def _child(directory: str) -> None:
    import cairn.tensorflow
    import tensorflow as tf

    model, optimizer, ckpt = build()
    manager = cairn.tensorflow.CheckpointManager(ckpt, directory, max_to_keep=MAX_TO_KEEP)
    # Every variable is set from the step alone, so the child resumes from the
    # step recorded with the newest checkpoint; the test restores them all.
    latest = manager.cairn_manager.latest()
    step = 0 if latest is None else int(latest.metrics["step"])
    asynchronous = tf.train.CheckpointOptions(enable_async=True)
    saves = 0
    while True:
        step += 1
        set_step(step, model, optimizer, ckpt)
        # Every other save is asynchronous (its commit runs while the next
        # step's values are being set); the first is not, so that the first
        # "c" line means a commit, and every child moves the run forward.
        manager.save(metrics={"step": step}, options=asynchronous if saves % 2 else None)
        saves += 1
        os.write(1, f"c {step}\n".encode())


def main() -> None:
    import cairn.tensorflow  # noqa: F401
    import tensorflow  # noqa: F401 - imported once, before the forks

    os.write(1, b"ready\n")
    child = 0
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "run":
            child = os.fork()
            if child == 0:
                try:
                    _child(arg)
                finally:
                    os._exit(3)
            os.write(1, f"pid {child}\n".encode())
        elif cmd == "wait":
            _, status = os.waitpid(child, 0)
            os.write(1, f"dead {status}\n".encode())
        elif cmd == "quit":
            return


if __name__ == "__main__":
    main()
