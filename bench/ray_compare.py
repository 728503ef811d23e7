#!/usr/bin/env python3
"""Ray Train and Ray Tune against cairn.train and cairn.tune, and Ray Train
with Cairn inside, on the same loop (docs/benchmarks.md, "Against Ray").

    PYTHONPATH=build/python .venv/bin/python3 bench/ray_compare.py \\
        [--state-mib 256] [--epochs 6] [--trials 100] [--only train|tune]

Train: the Ray Train guide's PyTorch loop shape with two workers on gloo: a
model of --state-mib MiB of float32 state (a stack of Linear layers), one
step per epoch, and rank 0 reporting a checkpoint of the model
(``torch.save`` into a temporary folder) every epoch; rank 1 reports metrics
only. In the first attempt rank 1 SIGKILLs itself at epoch 3 and
``FailureConfig(max_failures=1)`` restarts the group from the latest
checkpoint. Three runs: ``ray`` (ray.train.torch.TorchTrainer), ``cairn``
(cairn.train.torch.TorchTrainer, same code, imports changed) and
``ray+cairn`` (Ray, with ``checkpoint_upload_fn=cairn.ray.checkpoint_upload_fn``);
each once with a synchronous report and once with an asynchronous one
(Ray's ``CheckpointUploadMode.ASYNC``, Cairn's ``async_report=True``).
Measured from inside: time from ``fit()`` to the first step, rank 0's time
in ``report()`` with a checkpoint (median), time from the kill to the next
step, and the peak RSS of the driver (the script; Ray's own daemons are
other processes and not counted) and of rank 0.

Tune: --trials trials of a function trainable that reports three times,
each with a 1 KiB checkpoint: the wall time of ``fit()``.

Every framework runs in a process of its own. Prints the figures and the
ratios (Ray / Cairn: above 1, Cairn is faster or smaller).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

KILL_AT = 3


def _framework(name: str) -> Any:
    if name == "cairn":
        import cairn.train as train
        import cairn.train.torch as train_torch
        import cairn.tune as tune
    else:
        import ray.train as train
        import ray.train.torch as train_torch
        import ray.tune as tune
    return train, train_torch, tune


def train_func(config: dict[str, Any]) -> None:
    import resource
    import signal

    import torch

    train, _, _ = _framework("cairn" if config["framework"] == "cairn" else "ray")
    rank = train.get_context().get_world_rank()
    layers = max(1, config["state_mib"] // 4)  # 1024 x 1024 float32: 4 MiB each
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024, bias=False) for _ in range(layers)])
    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "model.pt"))
            model.load_state_dict(state["model"])
            start = state["epoch"] + 1
    log = pathlib.Path(config["log_dir"])
    marker = log / "killed"
    for epoch in range(start, config["epochs"]):
        step_start = time.time()
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.999)
        if rank == 1 and epoch == KILL_AT and not marker.exists():
            marker.write_text(str(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        metrics = {"epoch": epoch}
        # Ray's asynchronous upload reads the folder after report() returns
        # and removes it itself; every other report is done with it on return.
        ray_async = config["async"] and config["framework"] != "cairn"
        d = tempfile.mkdtemp()
        try:
            kwargs: dict[str, Any] = {}
            ckpt = None
            if rank == 0:
                torch.save(
                    {"model": model.state_dict(), "epoch": epoch}, os.path.join(d, "model.pt")
                )
                ckpt = train.Checkpoint.from_directory(d)
                if config["framework"] == "ray+cairn":
                    import cairn.ray

                    kwargs["checkpoint_upload_fn"] = cairn.ray.checkpoint_upload_fn
            if config["async"]:
                if config["framework"] == "cairn":
                    kwargs["async_report"] = True
                else:
                    kwargs["checkpoint_upload_mode"] = train.CheckpointUploadMode.ASYNC
            before = time.time()
            train.report(metrics, checkpoint=ckpt, **kwargs)
            after = time.time()
        finally:
            if not (ray_async and ckpt is not None):
                shutil.rmtree(d, ignore_errors=True)
        if rank == 0:
            with open(log / "rank0.jsonl", "a") as f:
                rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
                line = {"epoch": epoch, "step_start": step_start, "report_s": after - before}
                f.write(json.dumps(dict(line, rss=rss)) + "\n")


def run_train(
    framework: str, asynchronous: bool, args: argparse.Namespace, work: pathlib.Path
) -> dict[str, Any]:
    import resource

    train, train_torch, _ = _framework("cairn" if framework == "cairn" else "ray")
    log = work / "log"
    log.mkdir()
    config = {
        "framework": framework,
        "async": asynchronous,
        "state_mib": args.state_mib,
        "epochs": args.epochs,
        "log_dir": str(log),
    }
    trainer = train_torch.TorchTrainer(
        train_func,
        train_loop_config=config,
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(
            name="run",
            storage_path=str(work / "results"),
            failure_config=train.FailureConfig(max_failures=1),
        ),
    )
    started = time.time()
    result = trainer.fit()
    if result.error is not None:
        raise RuntimeError(f"{framework}: {result.error}")
    rows = [json.loads(line) for line in (log / "rank0.jsonl").read_text().splitlines()]
    killed_at = float((log / "killed").read_text())
    after_kill = [r["step_start"] for r in rows if r["step_start"] > killed_at]
    return {
        "first step (s)": rows[0]["step_start"] - started,
        "report with checkpoint (s)": statistics.median(r["report_s"] for r in rows),
        "kill to next step (s)": min(after_kill) - killed_at,
        "driver RSS (MiB)": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rank 0 RSS (MiB)": max(r["rss"] for r in rows) / 2**20,
    }


def trial(config: dict[str, Any]) -> None:
    train, _, tune = _framework(config["framework"])
    for i in range(3):
        with tempfile.TemporaryDirectory() as d:
            pathlib.Path(d, "state.bin").write_bytes(bytes(1024))
            tune.report({"score": config["x"] * i}, checkpoint=train.Checkpoint.from_directory(d))


def run_tune(framework: str, args: argparse.Namespace, work: pathlib.Path) -> dict[str, Any]:
    _, _, tune = _framework(framework)
    tuner = tune.Tuner(
        trial,
        param_space={"framework": framework, "x": tune.grid_search(list(range(args.trials)))},
        run_config=tune.RunConfig(name="sweep", storage_path=str(work / "results"), verbose=0),
    )
    started = time.time()
    grid = tuner.fit()
    seconds = time.time() - started
    if grid.errors:
        raise RuntimeError(f"{framework}: {grid.errors[0]}")
    return {f"Tune, {args.trials} trials (s)": seconds}


def child(args: argparse.Namespace) -> None:
    work = pathlib.Path(args.work)
    if args.child == "train":
        out = run_train(args.framework, args.asynchronous, args, work)
    else:
        out = run_tune(args.framework, args, work)
    pathlib.Path(args.out).write_text(json.dumps(out))


def measure(
    kind: str, framework: str, asynchronous: bool, args: argparse.Namespace
) -> dict[str, Any]:
    work = pathlib.Path(tempfile.mkdtemp(prefix="rb"))  # short: Ray's socket paths
    try:
        out = work / "out.json"
        env = dict(os.environ, HOME=str(work), TMPDIR=str(work), RAY_USAGE_STATS_ENABLED="0")
        cmd = [
            sys.executable,
            __file__,
            "--child",
            kind,
            "--framework",
            framework,
            "--work",
            str(work),
            "--out",
            str(out),
            "--state-mib",
            str(args.state_mib),
            "--epochs",
            str(args.epochs),
            "--trials",
            str(args.trials),
        ]
        if asynchronous:
            cmd.append("--asynchronous")
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            raise RuntimeError(f"{kind} under {framework}: {done.stderr[-3000:]}")
        return json.loads(out.read_text())
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--state-mib", type=int, default=256)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--only", choices=["train", "tune"])
    p.add_argument("--child", choices=["train", "tune"], help=argparse.SUPPRESS)
    p.add_argument("--framework", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--asynchronous", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    print(
        f"# ray_compare: {os.cpu_count()} cores, state {args.state_mib} MiB, {args.epochs} epochs"
    )
    if args.only in (None, "train"):
        for asynchronous in (False, True):
            mode = "async" if asynchronous else "sync"
            figures = {
                fw: measure("train", fw, asynchronous, args) for fw in ("ray", "cairn", "ray+cairn")
            }
            print(f"\n## Train, {mode} report")
            print("| figure | Ray | Cairn | Ray with Cairn | Ray / Cairn | Ray / Ray with Cairn |")
            print("|---|---:|---:|---:|---:|---:|")
            for key in figures["ray"]:
                r, c, rc = (figures[fw][key] for fw in ("ray", "cairn", "ray+cairn"))
                print(f"| {key} | {r:.3f} | {c:.3f} | {rc:.3f} | {r / c:.2f} | {r / rc:.2f} |")
    if args.only in (None, "tune"):
        figures = {fw: measure("tune", fw, False, args) for fw in ("ray", "cairn")}
        print("\n## Tune")
        print("| figure | Ray | Cairn | Ray / Cairn |\n|---|---:|---:|---:|")
        for key in figures["ray"]:
            r, c = figures["ray"][key], figures["cairn"][key]
            print(f"| {key} | {r:.2f} | {c:.2f} | {r / c:.2f} |")


if __name__ == "__main__":
    main()
