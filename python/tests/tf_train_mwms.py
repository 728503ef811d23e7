"""A TensorflowTrainer run for test_train_tensorflow.py, in its own process.

    python3 tf_train_mwms.py STORAGE_PATH SCRATCH OUT.npz [MODE]

Two workers train a tiny Keras model with MultiWorkerMirroredStrategy in a
custom loop (Keras 3.15's ``model.fit`` does not run under that strategy:
keras-team/keras#20585), a checkpoint every epoch written by every worker
with ``tf.train.Checkpoint`` into a folder of SCRATCH; the chief writes the
final weights and optimizer variables to OUT.npz. MODE "kill" SIGKILLs rank
1 in the middle of epoch 2 of the first attempt (FailureConfig(max_failures=1)).
The test process never imports TensorFlow: the workers are forks of this one.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
from typing import Any

from cairn import train
from cairn.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from cairn.train.tensorflow import TensorflowTrainer, prepare_dataset_shard

EPOCHS = 4
SAMPLES = 64
GLOBAL_BATCH = 8


def loop(config: dict[str, Any]) -> None:
    import keras
    import numpy as np
    import tensorflow as tf

    context = train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    tf_config = json.loads(os.environ["TF_CONFIG"])
    assert tf_config["task"] == {"type": "worker", "index": rank}, tf_config
    assert len(tf_config["cluster"]["worker"]) == world, tf_config
    keras.utils.set_random_seed(0)
    tf.config.experimental.enable_op_determinism()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    assert strategy.num_replicas_in_sync == world
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
        )
        optimizer = keras.optimizers.Adam(0.01)
        optimizer.build(model.trainable_variables)
    state = tf.train.Checkpoint(model=model, optimizer=optimizer)

    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            state.read(os.path.join(folder, "state")).assert_consumed()
            with open(os.path.join(folder, "epoch.json")) as f:
                start = json.load(f)["epoch"] + 1

    rng = np.random.RandomState(1)
    x = rng.rand(SAMPLES, 4).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")).astype("float32")
    shard = tf.data.Dataset.from_tensor_slices((x[rank::world], y[rank::world]))
    dataset = strategy.experimental_distribute_dataset(
        prepare_dataset_shard(shard.batch(GLOBAL_BATCH // world))
    )

    @tf.function
    def step(xb: Any, yb: Any) -> Any:
        def replica(xb: Any, yb: Any) -> Any:
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(model(xb, training=True) - yb)) / GLOBAL_BATCH
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return strategy.reduce("SUM", strategy.run(replica, args=(xb, yb)), axis=None)

    for epoch in range(start, EPOCHS):
        total = 0.0
        for i, (xb, yb) in enumerate(dataset):
            if config["kill"] and context.attempt == 0 and epoch == 2 and i == 3 and rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            total += float(step(xb, yb))
        # Every worker saves (tf.train.Checkpoint may run collectives); each
        # into a folder of its own; only the chief's is committed.
        folder = tempfile.mkdtemp(prefix=f"rank{rank}-", dir=config["scratch"])
        state.write(os.path.join(folder, "state"))
        with open(os.path.join(folder, "epoch.json"), "w") as f:
            json.dump({"epoch": epoch}, f)
        train.report(
            {"epoch": epoch, "loss": total, "start": start},
            checkpoint=Checkpoint.from_directory(folder),
        )
        if rank == 0:
            import shutil

            shutil.rmtree(folder)  # the chief's own copy, once committed
    if rank == 0:
        arrays = {f"w{i}": v.numpy() for i, v in enumerate(model.weights)}
        arrays.update({f"o{i}": v.numpy() for i, v in enumerate(optimizer.variables)})
        np.savez(config["out"], **arrays)


def main(argv: list[str]) -> int:
    storage, scratch, out = argv[1:4]
    mode = argv[4] if len(argv) > 4 else ""
    result = TensorflowTrainer(
        loop,
        train_loop_config={"scratch": scratch, "out": out, "kill": mode == "kill"},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="exp", storage_path=storage, failure_config=FailureConfig(max_failures=1)
        ),
    ).fit()
    print(
        "RESULT " + json.dumps({"metrics": result.metrics, "checkpoint": result.checkpoint.path}),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
