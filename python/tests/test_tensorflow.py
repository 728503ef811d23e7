"""cairn.tensorflow.CheckpointManager and TensorFlow values in cairn.save/load.

Real TensorFlow (CPU) and Keras, real processes and SIGKILL. The SIGKILL
test's number of kills is CAIRN_TF_KILLS (default 200).
"""

from __future__ import annotations

import os
import pathlib
import random
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import cairn
import cairn.tensorflow
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

sys.path.insert(0, os.path.dirname(__file__))
import tf_kill_worker  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLI = ROOT / "build" / "src" / "cli" / "cairn"


# --- helpers ----------------------------------------------------------------


def _guide_model() -> tuple[Any, Any, Any]:
    """The guide's model: Sequential Dense(2) on 10 inputs, Adam, and
    Checkpoint(step, optimizer, model)."""
    model = tf.keras.Sequential([tf.keras.Input((10,)), tf.keras.layers.Dense(2)])
    opt = tf.keras.optimizers.Adam(learning_rate=0.001)
    ckpt = tf.train.Checkpoint(step=tf.Variable(1), optimizer=opt, model=model)
    return model, opt, ckpt


def _train_step(net: Any, example: dict[str, Any], optimizer: Any) -> Any:
    """TensorFlow's checkpoint guide's train_step."""
    with tf.GradientTape() as tape:
        output = net(example["x"])
        loss = tf.reduce_mean(tf.abs(output - example["y"]))
    variables = net.trainable_variables
    gradients = tape.gradient(loss, variables)
    optimizer.apply_gradients(zip(gradients, variables))
    return loss


def _toy_dataset() -> Any:
    """The guide's toy dataset, shaped for the seed's Dense(2) on 10 inputs."""
    inputs = tf.range(10.0)[:, None] * tf.ones((1, 10))
    labels = tf.range(10.0)[:, None] * 5.0 + tf.range(2.0)[None, :]
    return tf.data.Dataset.from_tensor_slices({"x": inputs, "y": labels}).repeat().batch(2)


def _snapshot(ckpt: Any) -> dict[str, np.ndarray]:
    """Every variable the checkpoint reaches, in a fixed order, as bytes-exact arrays."""
    out = {}
    for i, v in enumerate(_checkpoint_variables(ckpt)):
        out[str(i)] = np.array(v.numpy(), copy=True)
    return out


def _checkpoint_variables(ckpt: Any) -> list[Any]:
    model, opt = ckpt.model, ckpt.optimizer
    return [ckpt.step, *model.weights, *opt.variables]


def _assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert a[k].tobytes() == b[k].tobytes(), f"{k} differs"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLI), *args], capture_output=True, text=True, timeout=120, check=False
    )


def _train_and_checkpoint(
    net: Any, manager: Any, ckpt: Any, opt: Any, steps: int
) -> list[tuple[str, dict[str, np.ndarray]]]:
    """The guide's loop: restore, train, save every 10 steps; returns (prefix, snapshot) saved."""
    ckpt.restore(manager.latest_checkpoint)
    iterator = iter(_toy_dataset())
    saved = []
    for _ in range(steps):
        example = next(iterator)
        _train_step(net, example, opt)
        ckpt.step.assign_add(1)
        if int(ckpt.step) % 10 == 0:
            save_path = manager.save()
            saved.append((save_path, _snapshot(ckpt)))
    return saved


# --- the guide's example ----------------------------------------------------


def test_guide_example_saves_commits_and_restores_bit_for_bit(tmp_path: pathlib.Path) -> None:
    directory = str(tmp_path / "tf_ckpts")
    net, opt, ckpt = _guide_model()
    manager = cairn.tensorflow.CheckpointManager(ckpt, directory, max_to_keep=3)
    saved = _train_and_checkpoint(net, manager, ckpt, opt, 50)
    assert len(saved) == 5
    # max_to_keep=3, as TensorFlow: the three newest, oldest first.
    assert manager.checkpoints == [p for p, _ in saved[2:]]
    assert manager.latest_checkpoint == saved[-1][0]
    assert tf.train.latest_checkpoint(directory) == saved[-1][0]
    manager.close()
    assert _cli("verify", directory).returncode == 0

    # Every kept checkpoint, read by TensorFlow's own reader, bit for bit.
    for prefix, snap in saved[2:]:
        net2, opt2, ckpt2 = _guide_model()
        opt2.build(net2.trainable_variables)
        ckpt2.restore(prefix).assert_consumed()
        _assert_same(_snapshot(ckpt2), snap)

    # A new process's start: the guide's restore through a new manager.
    net3, opt3, ckpt3 = _guide_model()
    opt3.build(net3.trainable_variables)
    with cairn.tensorflow.CheckpointManager(ckpt3, directory, max_to_keep=3) as manager3:
        assert manager3.latest_checkpoint == saved[-1][0]
        manager3.restore().assert_consumed()
        _assert_same(_snapshot(ckpt3), saved[-1][1])
        assert int(ckpt3.step) == 51 - 1
        # Training resumes numbering from the restored save_counter.
        assert manager3.save().endswith("/ckpt-6")
    ls = _cli("ls", directory)
    assert ls.returncode == 0 and "checkpoint_000005" in ls.stdout, ls.stdout + ls.stderr
    assert _cli("show", f"{directory}/checkpoint_000005").returncode == 0


def test_mirrored_strategy_on_cpu_saves_through_the_manager(tmp_path: pathlib.Path) -> None:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((10,)), tf.keras.layers.Dense(2)])
        optimizer = tf.keras.optimizers.Adam(learning_rate=0.001)
        optimizer.build(model.trainable_variables)
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
        manager = cairn.tensorflow.CheckpointManager(
            checkpoint, directory=str(tmp_path / "model"), max_to_keep=3
        )
    model.weights[0].assign(tf.fill(model.weights[0].shape, 0.5))
    with manager:
        path = manager.save()
        model.weights[0].assign(tf.fill(model.weights[0].shape, 0.25))
        gate = threading.Event()  # holds the commit thread until the assign below
        manager._pool().submit(gate.wait)
        async_path = manager.save(options=tf.train.CheckpointOptions(enable_async=True))
        model.weights[0].assign(tf.fill(model.weights[0].shape, -1.0))  # after the snapshot
        gate.set()
        manager.sync()
        assert manager.checkpoints == [path, async_path]
    assert tf.train.latest_checkpoint(str(tmp_path / "model")) == async_path
    fresh = tf.keras.Sequential([tf.keras.Input((10,)), tf.keras.layers.Dense(2)])
    tf.train.Checkpoint(model=fresh).restore(async_path).expect_partial()
    assert np.array_equal(fresh.weights[0].numpy(), np.full((10, 2), 0.25, np.float32))
    fresh = tf.keras.Sequential([tf.keras.Input((10,)), tf.keras.layers.Dense(2)])
    tf.train.Checkpoint(model=fresh).restore(path).expect_partial()
    assert np.array_equal(fresh.weights[0].numpy(), np.full((10, 2), 0.5, np.float32))


# --- retention, interval, async ------------------------------------------------


def test_retention_by_metric_keeps_the_best_and_the_latest(tmp_path: pathlib.Path) -> None:
    _, _, ckpt = _guide_model()
    losses = [0.5, 0.1, 0.9, 0.2, 0.8]
    with cairn.tensorflow.CheckpointManager(
        ckpt, str(tmp_path), max_to_keep=2, score_attribute="val/loss", score_order="min"
    ) as manager:
        paths = [manager.save(metrics={"val": {"loss": x}}) for x in losses]
        # The two best (0.1, 0.2) and the latest (0.8), oldest first.
        assert manager.checkpoints == [paths[1], paths[3], paths[4]]
        assert manager.latest_checkpoint == paths[4]
        best = [r.metrics["val"]["loss"] for r in manager.cairn_manager.best()]
        assert best[:2] == [0.1, 0.2]
        with pytest.raises(cairn.InvalidArgumentError, match="val/loss"):
            manager.save(metrics={"val": {"loss": "bad"}})
        assert manager.checkpoints == [paths[1], paths[3], paths[4]]
    assert tf.train.latest_checkpoint(str(tmp_path)) == paths[4]


def test_keep_checkpoint_every_n_hours_pins_for_good(tmp_path: pathlib.Path) -> None:
    _, _, ckpt = _guide_model()
    # One pinned every 1e-9 hours: every save is pinned, none is ever deleted.
    with cairn.tensorflow.CheckpointManager(
        ckpt, str(tmp_path), max_to_keep=1, keep_checkpoint_every_n_hours=1e-9
    ) as manager:
        paths = []
        for _ in range(3):
            paths.append(manager.save())  # a save takes far longer than 3.6 µs
        history = manager.cairn_manager.history()
        assert [r.pinned for r in history] == [True, True, True]
        assert manager.checkpoints == paths[-1:]  # pinned older ones are not listed, as TF
        assert tf.train.latest_checkpoint(str(tmp_path)) == paths[-1]
    with cairn.tensorflow.CheckpointManager(ckpt, str(tmp_path), max_to_keep=1) as manager:
        assert len(manager.cairn_manager.history()) == 3  # kept for good
        for p in paths:
            manager.restore(p).assert_existing_objects_matched()


def test_checkpoint_interval_and_numbering_as_tensorflow(tmp_path: pathlib.Path) -> None:
    _, _, ckpt = _guide_model()
    step = tf.Variable(0, dtype=tf.int64)
    with cairn.tensorflow.CheckpointManager(
        ckpt, str(tmp_path), max_to_keep=None, step_counter=step, checkpoint_interval=3
    ) as manager:
        assert manager.checkpoint_interval == 3
        results = []
        for _ in range(7):
            step.assign_add(1)
            results.append(manager.save())
        saved = [r for r in results if r is not None]
        assert [r is not None for r in results] == [True, False, False, True, False, False, True]
        assert manager.save() is None  # the same step again
        assert manager.save(check_interval=False) is None  # still the same step
        step.assign_add(1)
        assert manager.save(check_interval=False) is not None
        step.assign_add(3)
        assert manager.save(checkpoint_number=tf.Variable(42)).endswith("/ckpt-42")
        assert len(manager.checkpoints) == len(saved) + 2  # max_to_keep=None keeps all


def test_async_save_commits_after_tensorflow_wrote(tmp_path: pathlib.Path) -> None:
    net, opt, ckpt = _guide_model()
    opt.build(net.trainable_variables)
    net.compile(optimizer=opt, loss="mse", jit_compile=True)
    options = tf.train.CheckpointOptions(enable_async=True)
    with cairn.tensorflow.CheckpointManager(ckpt, str(tmp_path), max_to_keep=2) as manager:
        first = manager.save()
        snaps = {}
        for i in range(3):
            net.weights[0].assign(tf.fill((10, 2), float(i)))
            # Hold the manager's background thread, so that the training
            # below surely runs before TensorFlow writes the snapshot.
            gate = threading.Event()
            manager._pool().submit(gate.wait)
            path = manager.save(options=options)
            snaps[path] = _snapshot(ckpt)
            # The caller may train on at once: the save took its values. An
            # eager step and an XLA-compiled Keras fit step update every
            # variable before the write reads the snapshot.
            net.weights[0].assign(tf.fill((10, 2), -1.0))
            _train_step(net, next(iter(_toy_dataset())), opt)
            net.fit(np.ones((2, 10), np.float32), np.ones((2, 2), np.float32), verbose=0)
            assert not os.path.exists(path + ".index")
            gate.set()
            latest = manager.latest_checkpoint
            assert latest is not None  # the previous one, or this one once committed
            manager.sync()
            assert manager.latest_checkpoint == path
            assert cairn.Checkpoint(os.path.dirname(path)).verify() == []
        assert first not in manager.checkpoints
        for path, snap in snaps.items():
            if path in manager.checkpoints:
                manager.restore(path).assert_consumed()
                _assert_same(_snapshot(ckpt), snap)


def test_restore_or_initialize_calls_init_fn_when_empty(tmp_path: pathlib.Path) -> None:
    _, _, ckpt = _guide_model()
    called = []
    with cairn.tensorflow.CheckpointManager(
        ckpt, str(tmp_path), max_to_keep=1, init_fn=lambda: called.append(1)
    ) as manager:
        assert manager.restore_or_initialize() is None and called == [1]
        path = manager.save()
        assert manager.restore_or_initialize() == path and called == [1]


# --- locking, CLI, corruption -----------------------------------------------


def test_second_manager_on_the_directory_is_refused(tmp_path: pathlib.Path) -> None:
    _, _, ckpt = _guide_model()
    first = cairn.tensorflow.CheckpointManager(ckpt, str(tmp_path), max_to_keep=3)
    path = first.save()
    second = cairn.tensorflow.CheckpointManager(ckpt, str(tmp_path), max_to_keep=3)
    assert second.latest_checkpoint == path  # a reader needs no lock
    with pytest.raises(cairn.LockedError, match="another CheckpointManager is saving"):
        second.save()  # the lock is taken by the first save
    first.close()
    with cairn.tensorflow.CheckpointManager(ckpt, str(tmp_path), max_to_keep=3) as second:
        assert second.latest_checkpoint == path
    with pytest.raises(cairn.FailedPreconditionError, match="closed"):
        first.save()


def test_corrupted_data_file_is_caught_by_checksum_and_by_cairn_verify(
    tmp_path: pathlib.Path,
) -> None:
    net, opt, ckpt = _guide_model()
    opt.build(net.trainable_variables)
    directory = str(tmp_path / "run")
    with cairn.tensorflow.CheckpointManager(ckpt, directory, max_to_keep=3) as manager:
        good = manager.save()
        net.weights[0].assign(tf.fill((10, 2), 7.0))
        bad = manager.save()
    data = pathlib.Path(bad + ".data-00000-of-00001")
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    result = _cli("verify", directory)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ckpt-2.data-00000-of-00001" in result.stdout + result.stderr

    before = _snapshot(ckpt)
    net.weights[0].assign(tf.fill((10, 2), 3.0))
    before = _snapshot(ckpt)
    with cairn.tensorflow.CheckpointManager(ckpt, directory, max_to_keep=3) as manager:
        with pytest.raises(cairn.CorruptionError, match=r"ckpt-2\.data-00000-of-00001"):
            manager.restore()
        _assert_same(_snapshot(ckpt), before)  # nothing fed to TensorFlow
        manager.restore(good).assert_consumed()  # the earlier one is intact
        assert cairn.Checkpoint(os.path.dirname(good)).verify() == []
        with pytest.raises(cairn.NotFoundError, match="not a checkpoint kept"):
            manager.restore(str(tmp_path / "elsewhere" / "ckpt-1"))


# --- bad input ----------------------------------------------------------------


@pytest.mark.parametrize("max_to_keep", [0, -1])
def test_max_to_keep_must_be_positive_as_tensorflow(
    tmp_path: pathlib.Path, max_to_keep: int
) -> None:
    _, _, ckpt = _guide_model()
    with pytest.raises(ValueError, match="positive integer") as ours:
        cairn.tensorflow.CheckpointManager(ckpt, str(tmp_path / "x"), max_to_keep=max_to_keep)
    with pytest.raises(ValueError) as theirs:
        tf.train.CheckpointManager(ckpt, str(tmp_path / "y"), max_to_keep=max_to_keep)
    assert str(ours.value) == str(theirs.value)
    assert not (tmp_path / "x").exists()


def test_checkpoint_interval_needs_step_counter_as_tensorflow(tmp_path: pathlib.Path) -> None:
    _, _, ckpt = _guide_model()
    with pytest.raises(ValueError, match="step_counter") as ours:
        cairn.tensorflow.CheckpointManager(
            ckpt, str(tmp_path), max_to_keep=1, checkpoint_interval=5
        )
    with pytest.raises(ValueError) as theirs:
        tf.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=1, checkpoint_interval=5)
    assert str(ours.value) == str(theirs.value)


def test_unwritable_directory_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    _, _, ckpt = _guide_model()
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises((cairn.Error, OSError), match="a_file"):
        cairn.tensorflow.CheckpointManager(ckpt, str(blocker / "ckpts"), max_to_keep=3)
    assert blocker.read_text() == "not a folder"
    with pytest.raises(TypeError, match="checkpoint"):
        cairn.tensorflow.CheckpointManager(object(), str(tmp_path / "z"), max_to_keep=3)


def test_checkpoint_of_another_model_fails_restore_naming_the_variable(
    tmp_path: pathlib.Path,
) -> None:
    net, opt, ckpt = _guide_model()
    opt.build(net.trainable_variables)
    with cairn.tensorflow.CheckpointManager(ckpt, str(tmp_path), max_to_keep=3) as manager:
        path = manager.save()

    # An extra variable the checkpoint lacks: assert_consumed names it.
    extra = tf.train.Checkpoint(
        step=tf.Variable(1),
        model=net,
        optimizer=opt,
        extra_bias=tf.Variable([1.0], name="extra_bias"),
    )
    with cairn.tensorflow.CheckpointManager(extra, str(tmp_path), max_to_keep=3) as manager:
        status = manager.restore()
        with pytest.raises(AssertionError, match="extra_bias"):
            status.assert_consumed()

    # A checkpoint value this model lacks (no optimizer): assert_consumed names it.
    model_only = tf.train.Checkpoint(step=tf.Variable(1), model=net)
    with cairn.tensorflow.CheckpointManager(model_only, str(tmp_path), max_to_keep=3) as manager:
        with pytest.raises(AssertionError, match="optimizer|Unresolved object"):
            manager.restore().assert_consumed()

    # Other shapes: TensorFlow refuses, naming the variable.
    wide = tf.keras.Sequential([tf.keras.Input((10,)), tf.keras.layers.Dense(3)])
    other = tf.train.Checkpoint(step=tf.Variable(1), model=wide)
    with cairn.tensorflow.CheckpointManager(other, str(tmp_path), max_to_keep=3) as manager:
        with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="shape|kernel"):
            manager.restore().assert_consumed()
    # Nothing lost.
    assert cairn.Checkpoint(os.path.dirname(path)).verify() == []
    assert tf.train.latest_checkpoint(str(tmp_path)) == path


# --- S3 -----------------------------------------------------------------------


def test_s3_directory_saves_restores_and_copies_to_a_local_folder(
    s3_through_python: str, tmp_path: pathlib.Path
) -> None:
    net, opt, ckpt = _guide_model()
    opt.build(net.trainable_variables)
    uri = s3_through_python + "/tf"
    snaps = {}
    with cairn.tensorflow.CheckpointManager(ckpt, uri, max_to_keep=2) as manager:
        for i in range(3):
            net.weights[0].assign(tf.fill((10, 2), float(i)))
            path = manager.save()
            assert path.startswith(uri + "/checkpoint_")
            snaps[path] = _snapshot(ckpt)
        assert manager.checkpoints == list(snaps)[1:]
        net.weights[0].assign(tf.fill((10, 2), -5.0))
        manager.restore().assert_consumed()
        _assert_same(_snapshot(ckpt), snaps[path])
    local = tmp_path / "copy"
    result = _cli("cp", "--no-progress", uri, str(local))
    assert result.returncode == 0, result.stdout + result.stderr
    assert _cli("verify", str(local)).returncode == 0
    # TensorFlow's reader on the copy, for any committed checkpoint.
    for path in list(snaps)[1:]:
        rel = path[len(uri) + 1 :]
        net2, opt2, ckpt2 = _guide_model()
        opt2.build(net2.trainable_variables)
        ckpt2.restore(str(local / rel)).assert_consumed()
        _assert_same(_snapshot(ckpt2), snaps[path])
    # A manager that becomes the copy's writer writes TensorFlow's state file for it.
    with cairn.tensorflow.CheckpointManager(ckpt, str(local), max_to_keep=2) as manager:
        assert manager.cairn_manager.latest() is not None  # opens the writer
    assert tf.train.latest_checkpoint(str(local)) == str(local / list(snaps)[-1][len(uri) + 1 :])


# --- SIGKILL ---------------------------------------------------------------------


class _Server:
    """tf_kill_worker.py: a fork server whose children save until killed."""

    def __init__(self, stderr_path: pathlib.Path) -> None:
        self.err = open(stderr_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, str(pathlib.Path(__file__).with_name("tf_kill_worker.py"))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        )
        self.buf = b""
        self.expect("ready")

    def line(self, timeout_s: float = 120.0) -> str:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.proc.stdout], [], [], max(left, 0))
            if not ready:
                raise AssertionError("the kill worker did not answer (see its stderr)")
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                raise AssertionError("the kill worker exited (see its stderr)")
            self.buf += chunk
        out, self.buf = self.buf.split(b"\n", 1)
        return out.decode()

    def expect(self, prefix: str) -> str:
        while True:
            got = self.line()
            if got.startswith(prefix):
                return got

    def send(self, text: str) -> None:
        self.proc.stdin.write((text + "\n").encode())
        self.proc.stdin.flush()

    def close(self) -> None:
        try:
            self.send("quit")
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.err.close()


def _check_after_kill(
    directory: pathlib.Path, checker: tuple[Any, Any, Any], last_step: int
) -> int:
    """Every committed checkpoint verifies and restores to its step's values;
    returns the newest step."""
    model, optimizer, ckpt = checker
    committed = {}
    for folder in sorted(directory.glob("checkpoint_*")):
        c = cairn.Checkpoint(str(folder))
        if not c.is_committed():
            continue
        assert c.verify() == [], folder
        (index,) = [p for p, _ in c.files() if p.endswith(".index")]
        prefix = str(folder / index[: -len(".index")])
        ckpt.restore(prefix).assert_consumed()
        step = int(ckpt.step.numpy())
        for i, v in enumerate(tf_kill_worker.variables(model, optimizer, ckpt)):
            want = tf_kill_worker.expected(step, i, tuple(v.shape), tf_kill_worker.numpy_dtype(v))
            assert np.asarray(v.numpy()).tobytes() == want.tobytes(), f"{prefix}: {v.path}"
        committed[prefix] = step
    if not committed:
        assert tf.train.latest_checkpoint(str(directory)) is None
        return last_step
    newest = max(committed.values())
    assert newest >= last_step, "the latest committed step went back"
    latest = tf.train.latest_checkpoint(str(directory))
    # TensorFlow's state file names a committed checkpoint: the newest, or the
    # one before it when the kill fell between the commit and the state file.
    assert latest in committed, f"{latest} is not committed: {sorted(committed)}"
    assert committed[latest] >= sorted(committed.values())[-2 if len(committed) > 1 else -1]
    return newest


def test_sigkill_at_random_instants_leaves_committed_checkpoints_whole(
    tmp_path: pathlib.Path,
) -> None:
    kills = int(os.environ.get("CAIRN_TF_KILLS", "200"))
    rng = random.Random(52)
    servers = [_Server(tmp_path / f"worker{i}.stderr") for i in range(2)]
    dirs = [tmp_path / f"run{i}" for i in range(2)]
    checker = tf_kill_worker.build()
    last = [0, 0]
    done = 0
    try:
        while done < kills:
            pids = []
            aimed = [bool((done // 2 + n) % 2) for n in range(2)]
            for s, d in zip(servers, dirs):
                s.send(f"run {d}")
                pids.append(int(s.expect("pid ").split()[1]))
            for n, (s, pid) in enumerate(zip(servers, pids)):
                if aimed[n]:
                    s.expect("c ")  # aimed: into the saves after a commit
                    time.sleep(rng.uniform(0.0, 0.08))
                else:
                    time.sleep(rng.uniform(0.0, 0.25))  # any instant from the start
                os.kill(pid, signal.SIGKILL)
            for s in servers:
                s.send("wait")
                status = int(s.expect("dead ").split()[1])
                assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
                    f"the saving child ended by itself (status {status}); its stderr: "
                    + pathlib.Path(s.err.name).read_text()[-3000:]
                )
                s.buf = b""  # the killed child's progress lines
            for n, d in enumerate(dirs):
                newest = _check_after_kill(d, checker, last[n])
                # An aimed kill came after the child's first (synchronous) commit.
                assert newest > last[n] or not aimed[n], f"{d}: no progress"
                last[n] = newest
            done += 2
    finally:
        for s in servers:
            s.close()
    assert min(last) > 0, "no save was ever committed"
    for d in dirs:
        assert _cli("verify", str(d)).returncode == 0
        # gc and a reopening manager remove what the kills left.
        assert _cli("gc", str(d)).returncode == 0
        model, opt, ckpt = tf_kill_worker.build()
        with cairn.tensorflow.CheckpointManager(ckpt, str(d), max_to_keep=3) as manager:
            manager.restore().assert_consumed()
            assert len(manager.checkpoints) <= 3
        assert not (d / cairn.tensorflow._manager.STAGING).exists()


# --- tensors: cairn.save / cairn.load with TensorFlow values ---------------------------


def test_keras_dense_weights_load_into_torch_linear(tmp_path: pathlib.Path) -> None:
    torch = pytest.importorskip("torch")
    import keras

    dense = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4)])
    kernel, bias = dense.layers[0].kernel, dense.layers[0].bias
    assert type(kernel).__module__.startswith("keras")
    path = tmp_path / "dense.safetensors"
    cairn.save({"dense": {"kernel": kernel, "bias": bias}}, path, metadata={"from": "keras"})
    state = cairn.load(path)
    linear = torch.nn.Linear(6, 4)
    linear.load_state_dict(
        {"weight": state["dense.kernel"].T.contiguous(), "bias": state["dense.bias"]}
    )
    x = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)
    want = dense(x).numpy()
    got = linear(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # The reference library reads the same file.
    from safetensors.numpy import load_file

    ref = load_file(str(path))
    assert np.array_equal(ref["dense.kernel"], kernel.numpy())


ALL_DTYPES = [
    "bool", "uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
    "float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2",
]  # fmt: skip


def test_every_tensorflow_dtype_round_trips_through_torch_and_safetensors(
    tmp_path: pathlib.Path,
) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    rng = np.random.default_rng(1)
    values = {}
    for name in ALL_DTYPES:
        np_dtype = tf.dtypes.as_dtype(name).as_numpy_dtype
        raw = rng.integers(0, 100, size=(3, 5)).astype(np.float64)
        values[name] = (
            tf.constant(raw.astype(np_dtype)) if name != "bool" else tf.constant(raw > 50)
        )
    values["variable"] = tf.Variable(tf.ones((2, 2), tf.bfloat16))
    values["scalar"] = tf.constant(3.5)
    path = tmp_path / "all.safetensors"
    cairn.save(values, path)
    ref = load_file(str(path))
    mine = cairn.load(path)
    as_tf = cairn.load(path, framework="tf")
    for key, t in values.items():
        want = np.asarray(t.numpy() if isinstance(t, tf.Variable) else t)
        for got in (ref[key], mine[key]):
            assert tuple(got.shape) == want.shape, key
            raw = got.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            assert raw == want.tobytes(), key
        assert as_tf[key].dtype == tf.dtypes.as_dtype(want.dtype), key
        assert np.asarray(as_tf[key]).tobytes() == want.tobytes(), key
    assert str(ref["float8_e4m3fn"].dtype) == "torch.float8_e4m3fn"
    assert str(ref["bfloat16"].dtype) == "torch.bfloat16"
    from safetensors import safe_open

    with safe_open(str(path), "np") as f:
        assert f.metadata() == {"format": "tf"}
    # Dtypes safetensors lacks are refused, naming the tensor; nothing is written.
    int4 = tf.cast(tf.constant([1, 2]), tf.dtypes.experimental.int4)
    for bad in (tf.constant(["a"]), tf.constant([1 + 2j]), int4):
        with pytest.raises(cairn.InvalidArgumentError, match="'bad'"):
            cairn.save({"bad": bad}, tmp_path / "bad.safetensors")
    assert not (tmp_path / "bad.safetensors").exists()


def test_load_variables_in_place_with_assert_consumed_strictness(tmp_path: pathlib.Path) -> None:
    import keras

    src = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, name="d")], name="m")
    path = tmp_path / "w.safetensors"
    cairn.save({v.path: v for v in src.weights}, path)
    dst = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, name="d")], name="m")
    target = {v.path: v for v in dst.weights}
    assert sorted(target) == sorted(v.path for v in src.weights)
    cairn.tensorflow.load_variables(target, path)
    for a, b in zip(src.weights, dst.weights):
        assert a.numpy().tobytes() == b.numpy().tobytes()
    # Missing, unexpected and mismatched names are listed; nothing is assigned.
    before = [v.numpy().copy() for v in dst.weights]
    (kernel_name,) = [k for k in target if k.endswith("kernel")]
    wrong = {kernel_name: tf.Variable(tf.zeros((6, 5))), "extra": tf.Variable(1.0)}
    with pytest.raises(cairn.InvalidArgumentError) as err:
        cairn.tensorflow.load_variables(wrong, path)
    msg = str(err.value)
    assert "mismatched" in msg and kernel_name in msg and "'extra'" in msg and "unexpected" in msg
    for v, b in zip(dst.weights, before):
        assert np.array_equal(v.numpy(), b)
    # Non-strict: only names in both, tf.Variable targets.
    (bias_name,) = [k for k in target if k.endswith("bias")]
    bias = tf.Variable(tf.zeros((4,)))
    cairn.tensorflow.load_variables({bias_name: bias}, path, strict=False)
    assert bias.numpy().tobytes() == src.weights[1].numpy().tobytes()
