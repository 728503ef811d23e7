#!/usr/bin/env python3
"""cairn.tensorflow.CheckpointManager against tf.train.CheckpointManager, in one run.

Usage: PYTHONPATH=build/python python3 bench/tf_compare.py [--dir DIR] [--runs N] [--out FILE]

The same Keras model (Dense 4096x4096 and 4096x2048 with Adam's two slots:
about 300 MB of variables) is saved and restored by:

- ``tf.train.CheckpointManager.save()`` (synchronous; TensorFlow does not
  fsync, so "tf.save+fsync" also times an ``os.sync()`` after it, the
  durability Cairn's save has when it returns);
- the same with ``CheckpointOptions(enable_async=True)``: the stall (until
  ``save()`` returns) and the whole save (until ``sync()``). In TensorFlow
  2.21 with Keras 3 only a Checkpoint's first asynchronous save works, so
  each round uses a fresh Checkpoint and manager;
- ``cairn.tensorflow.CheckpointManager.save()``, synchronous and with
  ``enable_async=True`` (stall and whole), default staging (RAM);
- restores with a cold page cache: ``tf.train.Checkpoint.restore(prefix)``
  against Cairn's ``restore()`` (checksums verified first);
- fio's sequential write (O_DIRECT, libaio, fsync at the end) of the same
  bytes in the same folder: the disk's ceiling.

Each figure is the median of ``--runs`` rounds; the ratios say how much
faster Cairn is (>1: Cairn faster; for stalls, TF's stall / Cairn's).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cache import drop_caches
from fio_write import fio_write

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import cairn
import cairn.tensorflow
import tensorflow as tf


def build() -> tuple[Any, Any, Any]:
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [tf.keras.Input((4096,)), tf.keras.layers.Dense(4096), tf.keras.layers.Dense(2048)]
    )
    optimizer = tf.keras.optimizers.Adam(learning_rate=0.001)
    optimizer.build(model.trainable_variables)
    for v in optimizer.variables:  # slots with data, not zeros
        if v.dtype == "float32" and len(v.shape) > 0:
            v.assign(tf.random.normal(v.shape))
    ckpt = tf.train.Checkpoint(step=tf.Variable(1), optimizer=optimizer, model=model)
    return model, optimizer, ckpt


def nbytes_of(model: Any, optimizer: Any) -> int:
    return sum(int(tf.size(v)) * 4 for v in [*model.weights, *optimizer.variables])


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def files_of(prefix: str) -> list[str]:
    d = os.path.dirname(prefix)
    base = os.path.basename(prefix)
    return [os.path.join(d, f) for f in os.listdir(d) if f.startswith(base + ".")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=None, help="a folder on the disk to measure")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="tf-compare-", dir=args.dir)
    model, optimizer, ckpt = build()
    nbytes = nbytes_of(model, optimizer)
    times: dict[str, list[float]] = {}

    def add(name: str, seconds: float) -> None:
        times.setdefault(name, []).append(seconds)

    try:
        tf_dir = os.path.join(root, "tf")
        tf_manager = tf.train.CheckpointManager(ckpt, tf_dir, max_to_keep=2)
        cairn_dir = os.path.join(root, "cairn")
        manager = cairn.tensorflow.CheckpointManager(ckpt, cairn_dir, max_to_keep=2)
        async_opts = tf.train.CheckpointOptions(enable_async=True)
        tf_manager.save()  # warm-up: TensorFlow traces its save functions once
        manager.save()
        for r in range(args.runs):
            os.sync()
            s, tf_path = timed(tf_manager.save)
            add("tf.save", s)
            s2, _ = timed(os.sync)
            add("tf.save+fsync", s + s2)

            os.sync()
            s, cairn_path = timed(manager.save)
            add("cairn.save", s)

            # TensorFlow async: a fresh Checkpoint each round (see the docstring).
            fresh = tf.train.Checkpoint(step=ckpt.step, optimizer=optimizer, model=model)
            m = tf.train.CheckpointManager(fresh, os.path.join(root, f"tfa{r}"), max_to_keep=1)
            os.sync()
            t0 = time.perf_counter()
            m.save(options=async_opts)
            add("tf.async_stall", time.perf_counter() - t0)
            m.sync()
            add("tf.async_total", time.perf_counter() - t0)
            del m, fresh
            shutil.rmtree(os.path.join(root, f"tfa{r}"), ignore_errors=True)

            os.sync()
            t0 = time.perf_counter()
            manager.save(options=async_opts)
            add("cairn.async_stall", time.perf_counter() - t0)
            manager.sync()
            add("cairn.async_total", time.perf_counter() - t0)

            drop_caches(files_of(tf_path))
            s, status = timed(lambda p=tf_path: ckpt.restore(p))
            status.assert_consumed()
            add("tf.restore", s)
            drop_caches(files_of(manager.latest_checkpoint))
            s, status = timed(manager.restore)
            status.assert_consumed()
            add("cairn.restore", s)

            fio_file = os.path.join(root, "fio.dat")
            add("fio.write", fio_write(fio_file, nbytes)[0])
            os.remove(fio_file)
        del cairn_path
        manager.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    gb = nbytes / 1e9
    print(f"TensorFlow {tf.__version__}, {nbytes / 2**20:.0f} MiB of variables, {args.runs} runs")
    print(f"{'measure':<20} {'median s':>9} {'GB/s':>7}")
    for k, v in med.items():
        print(f"{k:<20} {v:9.3f} {gb / v:7.2f}")
    ratios = {
        "save: tf.save / cairn.save": med["tf.save"] / med["cairn.save"],
        "save: tf.save+fsync / cairn.save": med["tf.save+fsync"] / med["cairn.save"],
        "stall: tf.async_stall / cairn.async_stall": med["tf.async_stall"]
        / med["cairn.async_stall"],
        "restore: tf.restore / cairn.restore": med["tf.restore"] / med["cairn.restore"],
        "ceiling: fio.write / cairn.save": med["fio.write"] / med["cairn.save"],
    }
    for k, v in ratios.items():
        print(f"{k:<44} {v:6.2f}x")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"bytes": nbytes, "runs_s": times, "median_s": med, "ratios": ratios}, f)


if __name__ == "__main__":
    main()
