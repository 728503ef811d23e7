"""The guide's MultiWorkerMirroredStrategy example over cairn.tensorflow.CheckpointManager.

    python3 tf_mwms_guide.py WORK

For test_tensorflow_multiworker.py, in its own process (the test process
never imports TensorFlow; the workers are forks of this one). Two workers of
a TensorflowTrainer run, each in three phases:

1. The guide's code, verbatim but for the manager's class name: every worker
   builds the model and constructs the manager on the same directory
   WORK/model (``max_to_keep=3``) inside ``strategy.scope()``; a custom
   training loop (``strategy.run``; Keras 3's ``model.fit`` does not run
   under MultiWorkerMirroredStrategy, keras-team/keras#20585) saves after
   every one of STEPS steps on the chief only (the guide's ``_chief_worker``).
   The chief writes its variables to WORK/saved.npz. Then rank 1, a second
   writer by mistake, calls ``save()`` while the chief's manager is open.
2. Every worker builds the model afresh (other seeds) and runs the guide's
   ``checkpoint.restore(manager.latest_checkpoint)`` and
   ``status.assert_consumed()``; writes its variables to WORK/restored<rank>.npz.
3. TensorFlow's multi-worker tutorial pattern: every worker saves (the
   chief into WORK/tf_pattern/ckpt, the other into a temporary directory it
   deletes after each save), two steps; then every worker restores
   ``tf.train.latest_checkpoint`` of the chief's directory into a fresh model.

Each worker writes WORK/rank<rank>.json; after ``fit()`` this process adds
what ``tf.train.CheckpointManager`` itself keeps after STEPS saves and prints
"RESULT {...}".
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from cairn import train
from cairn.train import RunConfig, ScalingConfig
from cairn.train.tensorflow import TensorflowTrainer

STEPS = 5
GLOBAL_BATCH = 8


def _chief_worker(task_type: Any, task_id: Any) -> bool:  # the guide's
    return task_type is None or task_type == "chief" or (task_type == "worker" and task_id == 0)


def _write_filepath(filepath: str, task_type: Any, task_id: Any) -> str:
    """TensorFlow's tutorial: a non-chief worker writes into a temporary directory."""
    dirpath, base = os.path.dirname(filepath), os.path.basename(filepath)
    if not _chief_worker(task_type, task_id):
        dirpath = os.path.join(dirpath, "workertemp_" + str(task_id))
        os.makedirs(dirpath, exist_ok=True)
    return os.path.join(dirpath, base)


def loop(config: dict[str, Any]) -> None:
    import cairn
    import cairn.tensorflow
    import keras
    import numpy as np
    import tensorflow as tf

    work = config["work"]
    rank = train.get_context().get_world_rank()
    model_dir = os.path.join(work, "model")
    report: dict[str, Any] = {"rank": rank}
    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    def build(seed: int) -> tuple[Any, Any, Any, Any]:
        keras.utils.set_random_seed(seed)
        with strategy.scope():
            # model definition
            model = keras.Sequential(
                [keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
            )
            optimizer = keras.optimizers.Adam(learning_rate=0.01)
            optimizer.build(model.trainable_variables)
            checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
            manager = cairn.tensorflow.CheckpointManager(checkpoint, model_dir, max_to_keep=3)
        return model, optimizer, checkpoint, manager

    def values(model: Any, optimizer: Any, checkpoint: Any) -> dict[str, Any]:
        """Weights, Adam's slots and iteration count (the step), and save_counter."""
        out = {f"w{i}": v.numpy() for i, v in enumerate(model.weights)}
        out.update({f"o{i}": v.numpy() for i, v in enumerate(optimizer.variables)})
        out["save_counter"] = checkpoint.save_counter.numpy()
        return out

    def make_step(model: Any, optimizer: Any) -> Any:
        @tf.function
        def step(xb: Any, yb: Any) -> Any:
            def replica(xb: Any, yb: Any) -> Any:
                with tf.GradientTape() as tape:
                    loss = tf.reduce_sum(tf.square(model(xb, training=True) - yb)) / GLOBAL_BATCH
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
                return loss

            return strategy.reduce("SUM", strategy.run(replica, args=(xb, yb)), axis=None)

        return step

    @tf.function
    def barrier() -> Any:
        """An all-reduce: no worker passes it before every worker reached it."""
        return strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)

    rng = np.random.RandomState(1)
    x = rng.rand(STEPS + 2, GLOBAL_BATCH, 4).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")).astype("float32")
    half = GLOBAL_BATCH // 2  # this worker's part of each global batch
    shard = slice(rank * half, (rank + 1) * half)

    # 1. The guide: every worker constructs the manager; only the chief saves.
    model, optimizer, checkpoint, manager = build(0)
    step = make_step(model, optimizer)
    for i in range(STEPS):
        step(tf.constant(x[i, shard]), tf.constant(y[i, shard]))
        if _chief_worker(strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id):
            manager.save()
    assert float(barrier()) == 2.0  # the chief's last save is committed
    report["latest_checkpoint"] = manager.latest_checkpoint
    report["checkpoints"] = manager.checkpoints
    if rank == 0:
        np.savez(os.path.join(work, "saved.npz"), **values(model, optimizer, checkpoint))
    else:  # a second writer by mistake, while the chief's manager is open
        try:
            manager.save()
            report["second_writer"] = "saved"
        except cairn.LockedError as e:
            report["second_writer"] = f"LockedError: {e}"
        report["latest_after_refusal"] = manager.latest_checkpoint
    barrier()
    manager.close()

    # 2. The guide's restore, into a model built afresh.
    model, optimizer, checkpoint, manager = build(100 + rank)
    status = checkpoint.restore(manager.latest_checkpoint)
    status.assert_consumed()
    np.savez(os.path.join(work, f"restored{rank}.npz"), **values(model, optimizer, checkpoint))
    # Through Cairn's verified restore too.
    model2, optimizer2, checkpoint2, manager2 = build(200 + rank)
    manager2.restore().assert_consumed()
    np.savez(os.path.join(work, f"verified{rank}.npz"), **values(model2, optimizer2, checkpoint2))
    manager.close()
    manager2.close()

    # 3. TensorFlow's tutorial: every worker saves, a non-chief one into a
    # temporary directory that it deletes.
    task_type = strategy.cluster_resolver.task_type
    task_id = strategy.cluster_resolver.task_id
    checkpoint_dir = os.path.join(work, "tf_pattern", "ckpt")
    write_checkpoint_dir = _write_filepath(checkpoint_dir, task_type, task_id)
    checkpoint_manager = cairn.tensorflow.CheckpointManager(
        checkpoint, directory=write_checkpoint_dir, max_to_keep=1
    )
    step = make_step(model, optimizer)
    saved = []
    for i in range(STEPS, STEPS + 2):
        step(tf.constant(x[i, shard]), tf.constant(y[i, shard]))
        saved.append(os.path.relpath(checkpoint_manager.save(), work))
        if not _chief_worker(task_type, task_id):
            tf.io.gfile.rmtree(write_checkpoint_dir)
    report["tf_pattern_saved"] = saved
    barrier()
    latest = tf.train.latest_checkpoint(checkpoint_dir)
    report["tf_pattern_latest"] = os.path.relpath(latest, work) if latest else None
    if rank == 0:
        np.savez(os.path.join(work, "tf_saved.npz"), **values(model, optimizer, checkpoint))
    fresh = build(300 + rank)
    fresh[3].close()
    fresh[2].restore(latest).assert_consumed()
    np.savez(os.path.join(work, f"tf_restored{rank}.npz"), **values(*fresh[:3]))
    checkpoint_manager.close()
    with open(os.path.join(work, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    train.report({"rank": rank})


def main(argv: list[str]) -> int:
    work = argv[1]
    TensorflowTrainer(
        loop,
        train_loop_config={"work": work},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="run", storage_path=os.path.join(work, "runs")),
    ).fit()
    import tensorflow as tf

    # What tf.train.CheckpointManager keeps after the same saves.
    reference = os.path.join(work, "reference")
    plain = tf.train.CheckpointManager(
        tf.train.Checkpoint(v=tf.Variable(1.0)), reference, max_to_keep=3
    )
    for _ in range(STEPS):
        plain.save()
    result: dict[str, Any] = {
        "reference": [os.path.basename(p) for p in plain.checkpoints],
        "tf_latest": os.path.relpath(tf.train.latest_checkpoint(os.path.join(work, "model")), work),
    }
    # A reader never names an uncommitted checkpoint: in a copy of the
    # directory, the newest checkpoint's files without its manifest (what a
    # save killed before its commit leaves) as checkpoint_000005.
    import shutil

    import cairn.tensorflow

    copy = os.path.join(work, "model_copy")
    shutil.copytree(os.path.join(work, "model"), copy)
    shutil.copytree(
        os.path.join(copy, "checkpoint_000004"),
        os.path.join(copy, "checkpoint_000005"),
        ignore=shutil.ignore_patterns(".cairn"),
    )
    reader = cairn.tensorflow.CheckpointManager(
        tf.train.Checkpoint(v=tf.Variable(1.0)), copy, max_to_keep=3
    )
    result["reader_with_leftover"] = [os.path.relpath(p, copy) for p in reader.checkpoints]
    reader.close()
    for rank in (0, 1):
        with open(os.path.join(work, f"rank{rank}.json")) as f:
            result[f"rank{rank}"] = json.load(f)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
