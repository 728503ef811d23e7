"""ReportCheckpointCallback inside a TensorflowTrainer, for test_train_tensorflow.py.

    python3 tf_train_keras.py STORAGE OUT.npz

Two workers each run ``model.fit`` (no multi-worker strategy: Keras 3.15's
fit does not run under one, keras-team/keras#20585) for 2 epochs with
ReportCheckpointCallback; the chief writes its final weights to OUT.npz.
After fit() this process loads the model of the run's last checkpoint
(cairn.train.tensorflow.keras.get_model) and prints "RESULT {...}".
"""

from __future__ import annotations

import json
import sys
from typing import Any

from cairn import train
from cairn.train import RunConfig, ScalingConfig
from cairn.train.tensorflow import TensorflowTrainer


def loop(config: dict[str, Any]) -> None:
    import keras
    import numpy as np
    from cairn.train.tensorflow.keras import ReportCheckpointCallback

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    x = np.random.RandomState(1).rand(32, 4).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    callback = ReportCheckpointCallback(metrics={"train_loss": "loss"})
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[callback])
    if train.get_context().get_world_rank() == 0:
        np.savez(config["out"], *[v.numpy() for v in model.weights])


def main(argv: list[str]) -> int:
    storage, out = argv[1], argv[2]
    result = TensorflowTrainer(
        loop,
        train_loop_config={"out": out},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="exp", storage_path=storage),
    ).fit()
    import numpy as np
    from cairn.train.tensorflow.keras import get_model

    model = get_model(result.checkpoint)
    saved = np.load(out)
    same = all(np.array_equal(w, saved[f"arr_{i}"]) for i, w in enumerate(model.get_weights()))
    print(
        "RESULT "
        + json.dumps(
            {"metrics": result.metrics, "checkpoint": result.checkpoint.path, "same": same}
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
