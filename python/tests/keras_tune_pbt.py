"""A Keras function trainable under cairn.tune.Tuner with PBT, for test_keras.py.

    python3 keras_tune_pbt.py STORAGE

Two trials train a tiny Keras model, one epoch per iteration, each
iteration's checkpoint holding the weights with the optimizer's variables
and a digest of their bytes. A trial that starts from a checkpoint (PBT's
exploit) reports the digest of what it loaded, before its new learning rate
is set. Prints "ROWS [...]": every reported row of every trial.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from typing import Any

from cairn import tune
from cairn.tune import Checkpoint, CheckpointConfig, RunConfig, TuneConfig
from cairn.tune.schedulers import PopulationBasedTraining

ITERATIONS = 6


def _digest(model: Any) -> str:
    h = hashlib.sha256()
    for v in list(model.weights) + list(model.optimizer.variables):
        h.update(v.path.encode())
        h.update(v.numpy().tobytes())
    return h.hexdigest()


def trainable(config: dict[str, Any]) -> None:
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(config["lr"]), loss="mse")
    model.optimizer.build(model.trainable_variables)
    start, loaded = 0, None
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            model.load_weights(os.path.join(folder, "model.weights.h5"))
            with open(os.path.join(folder, "state.json")) as f:
                state = json.load(f)
        loaded = {"digest": _digest(model), "saved_digest": state["digest"]}
        start = state["iteration"] + 1
        model.optimizer.learning_rate.assign(config["lr"])
    x = np.random.RandomState(1).rand(32, 4).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    for iteration in range(start, ITERATIONS):
        history = model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        folder = tempfile.mkdtemp(prefix="cairn-pbt-")
        model.save_weights(os.path.join(folder, "model.weights.h5"))
        digest = _digest(model)
        with open(os.path.join(folder, "state.json"), "w") as f:
            json.dump({"iteration": iteration, "digest": digest}, f)
        metrics = {"loss": float(history.history["loss"][-1]), "digest": digest, "it": iteration}
        if loaded is not None and iteration == start:
            metrics.update(loaded_digest=loaded["digest"], checkpoint_digest=loaded["saved_digest"])
        tune.report(metrics, checkpoint=Checkpoint.from_directory(folder))


def main(argv: list[str]) -> int:
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=2,
        seed=3,
        hyperparam_mutations={"lr": [0.0001, 0.05]},
    )
    grid = tune.Tuner(
        trainable,
        param_space={"lr": tune.grid_search([0.0001, 0.05])},
        tune_config=TuneConfig(metric="loss", mode="min", scheduler=pbt, max_concurrent_trials=2),
        run_config=RunConfig(
            name="pbt", storage_path=argv[1], checkpoint_config=CheckpointConfig(num_to_keep=4)
        ),
    ).fit()
    rows = []
    for i, result in enumerate(grid):
        frame = result.metrics_dataframe
        for row in frame.to_dict("records") if frame is not None else [result.metrics]:
            row["trial"] = i
            rows.append(row)
    print("ERRORS " + json.dumps([str(e) for e in grid.errors]), flush=True)
    print("ROWS " + json.dumps(rows, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
