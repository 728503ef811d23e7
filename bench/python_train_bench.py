#!/usr/bin/env python3
"""A Python training loop under cairn.train against the C++ Trainer, same work.

    PYTHONPATH=build/python .venv/bin/python3 bench/python_train_bench.py \\
        --train-step-bench build/bench/train_step_bench [--state-mib 64] [--step-ms 50]

Both sides run the loop of bench/train_step_bench.cc: each step updates a
float32 state of --state-mib MiB for about --step-ms milliseconds (each side
calibrates its own update to that time once, then repeats the same number
of passes), then reports: metrics only ("none"), or a safetensors file of
the state in a temporary folder reported synchronously ("sync") or
asynchronously ("async"). Rank 0 times every step from its start to
report()'s return, the first --warmup steps left out. The C++ figures come
from train_step_bench run in the same invocation (its --json); the Python
figures from TorchTrainer runs of this file's loop. Modes run interleaved,
--rounds times each; each figure is the median of the rounds' mean step
times.

Prints, per mode, the C++ and Python step times and their ratio. The goal
(issue: "Python training and tuning runtime"): a Python loop that reports
every step costs at most 5% more per step than the C++ Trainer with the
same work. The folder --dir (a temporary one by default) is removed at the
end.
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

MODES = ["none", "sync", "async"]


def _pass(w: Any, step: int) -> None:
    """One pass of "training": a cheap in-place update of every element."""
    w.mul_(0.9999).add_(1e-4 * (step % 7))


def calibrate(numel: int, ms: float) -> int:
    import torch

    w = torch.full((numel,), 0.5)
    _pass(w, 0)
    start = time.perf_counter()
    for i in range(3):
        _pass(w, i)
    per_pass = (time.perf_counter() - start) / 3
    return max(1, round(ms / 1000.0 / per_pass))


def loop(config: dict[str, Any]) -> None:
    import cairn
    from cairn import train

    import torch

    w = torch.full((config["numel"],), 0.5)
    total = 0.0
    timed = 0
    for step in range(config["steps"]):
        start = time.perf_counter()
        for _ in range(config["passes"]):
            _pass(w, step)
        metrics = {"step": step}
        if config["mode"] == "none":
            train.report(metrics)
        else:
            with tempfile.TemporaryDirectory(dir=config["scratch"]) as tmp:
                cairn.save({"w": w}, os.path.join(tmp, "model.safetensors"), durable=False)
                train.report(
                    metrics,
                    checkpoint=train.Checkpoint.from_directory(tmp),
                    async_report=config["mode"] == "async",
                )
        if step >= config["warmup"]:
            total += time.perf_counter() - start
            timed += 1
    train.report({"mean_step_s": total / timed})


def python_runs(args: argparse.Namespace, work: pathlib.Path) -> dict[str, list[float]]:
    from cairn.train import CheckpointConfig, RunConfig, ScalingConfig
    from cairn.train.torch import TorchTrainer

    numel = (args.state_mib << 20) // 4
    passes = calibrate(numel, args.step_ms)
    scratch = work / "scratch"
    scratch.mkdir(exist_ok=True)
    means: dict[str, list[float]] = {m: [] for m in MODES}
    for round_ in range(args.rounds):
        for mode in MODES:
            name = f"py-{mode}-{round_}"
            result = TorchTrainer(
                loop,
                train_loop_config={
                    "mode": mode,
                    "numel": numel,
                    "passes": passes,
                    "steps": args.steps,
                    "warmup": args.warmup,
                    "scratch": str(scratch),
                },
                scaling_config=ScalingConfig(num_workers=args.workers),
                run_config=RunConfig(
                    name=name, storage_path=work, checkpoint_config=CheckpointConfig(num_to_keep=2)
                ),
            ).fit()
            if result.error is not None:
                sys.exit(f"python_train_bench: the Python {mode} run failed: {result.error}")
            means[mode].append(float(result.metrics["mean_step_s"]))
            shutil.rmtree(work / name)
    return means


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-step-bench", required=True, help="build/bench/train_step_bench")
    parser.add_argument("--state-mib", type=int, default=64)
    parser.add_argument("--step-ms", type=float, default=50.0)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--dir", help="where the runs go (default: a temporary folder)")
    args = parser.parse_args()
    try:
        import torch  # noqa: F401  (TorchTrainer's workers need it)
    except ImportError:
        print("python_train_bench: torch is not installed; skipped", file=sys.stderr)
        return 77

    work = pathlib.Path(args.dir or tempfile.mkdtemp(prefix="cairn-train-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        figures = work / "cpp.json"
        subprocess.run(
            [
                args.train_step_bench,
                "--dir",
                str(work / "cpp"),
                "--state-mib",
                str(args.state_mib),
                "--step-ms",
                str(args.step_ms),
                "--steps",
                str(args.steps),
                "--warmup",
                str(args.warmup),
                "--rounds",
                str(args.rounds),
                "--workers",
                str(args.workers),
                "--json",
                str(figures),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        cpp = json.loads(figures.read_text())
        py = python_runs(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(
        f"Step time, a loop reporting every step, {args.workers} worker(s), "
        f"{args.state_mib} MiB state, ~{args.step_ms:g} ms of work a step, "
        f"{args.rounds} rounds (median of the rounds' means)"
    )
    print(
        f"{'mode':<8} {'C++ Trainer':>12} {'cairn.train':>12} {'Python / C++':>13}  Python rounds"
    )
    for mode in MODES:
        c = float(cpp["modes"][mode]["median_step_s"])
        p = statistics.median(py[mode])
        rounds = " ".join(f"{v:.4f}" for v in py[mode])
        print(f"{mode:<8} {c:>11.4f}s {p:>11.4f}s {p / c:>13.3f}  {rounds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
