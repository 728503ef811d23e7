"""A Keras ``model.fit`` with cairn.keras callbacks, for test_keras.py.

    python3 keras_fit.py STORAGE OUT.npz [HOLD_FILE]

Trains a tiny model for 4 epochs of 8 batches with BackupAndRestore
(a backup every 3 batches) and ModelCheckpoint (best by loss, 2 kept), then
writes the final weights and optimizer variables to OUT.npz and a line
"RESUMED {...}" saying where it started. With HOLD_FILE, after batch 6 of
epoch 2 it creates HOLD_FILE and waits (bounded) to be SIGKILLed by the test.
"""

from __future__ import annotations

import json
import os
import sys
import time

import keras
import numpy as np
import tensorflow as tf
from cairn.keras import BackupAndRestore, ModelCheckpoint


class Hold(keras.callbacks.Callback):
    def __init__(self, path: str) -> None:
        super().__init__()
        self._path = path

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._epoch == 2 and batch == 6:
            with open(self._path, "w") as f:
                f.write("ready")
            deadline = time.monotonic() + 600  # bounded, should the test die first
            while time.monotonic() < deadline:
                time.sleep(0.1)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch = epoch


class Trace(keras.callbacks.Callback):
    """Records the first epoch and the optimizer's step count at the start."""

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.start = {
            "initial_epoch": self.model._initial_epoch or 0,
            "iterations": int(self.model.optimizer.iterations.numpy()),
        }


def main(argv: list[str]) -> int:
    storage, out = argv[1], argv[2]
    keras.utils.set_random_seed(0)
    tf.config.experimental.enable_op_determinism()
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    rng = np.random.RandomState(1)
    x = rng.rand(64, 4).astype("float32")
    y = x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")
    trace = Trace()
    callbacks = [
        BackupAndRestore(storage, save_freq=3, name="backup"),
        ModelCheckpoint(
            storage,
            "model-{epoch:02d}.keras",
            monitor="loss",
            save_best_only=True,
            name="best",
            num_to_keep=2,
        ),
    ]
    callbacks.append(trace)  # after BackupAndRestore: sees the restored state
    if len(argv) > 3:
        callbacks.append(Hold(argv[3]))
    model.fit(x, y, batch_size=8, epochs=4, shuffle=False, verbose=0, callbacks=callbacks)
    arrays = {f"w{i}": v.numpy() for i, v in enumerate(model.weights)}
    arrays.update({f"o{i}": v.numpy() for i, v in enumerate(model.optimizer.variables)})
    np.savez(out, **arrays)
    best = callbacks[1].manager.latest()
    with best.checkpoint.as_directory() as folder:
        saved = keras.models.load_model(os.path.join(folder, "model-04.keras"))
    same = all(np.array_equal(a, b.numpy()) for a, b in zip(saved.get_weights(), model.weights))
    print("RESUMED " + json.dumps(dict(trace.start, best_is_final=same)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
