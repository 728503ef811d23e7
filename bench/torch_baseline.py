#!/usr/bin/env python3
"""The Python torch baseline: torch.save (+ flush + fsync) and torch.load, cold cache.

Usage: torch_baseline.py --workload FILE --runs N --dir DIR --out FILE

The workload file is what `cairn_bench --workload` prints, so this moves
exactly the tensors the C++ benchmarks move, as one flat state dict
{name: tensor}. Same JSON report shape as the C++ benchmark binaries.
"""

import argparse
import json
import os
import sys
import time

from cache import drop_caches

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    with open(args.workload) as f:
        workload = json.load(f)
    gen = torch.Generator().manual_seed(1)
    state = {}
    for t in workload["tensors"]:
        state[t["name"]] = torch.rand(t["shape"], dtype=torch.float32, generator=gen) * 2 - 1
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    os.makedirs(args.dir, exist_ok=True)
    path = os.path.join(args.dir, "torch_py.pt")
    results = []

    runs = []
    for _ in range(args.runs):
        if os.path.exists(path):
            os.remove(path)
        os.sync()
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        runs.append(time.perf_counter() - t0)
    results.append(
        {
            "name": "torch.save",
            "what": "torch.save to an open file + flush + os.fsync",
            "bytes": nbytes,
            "runs_s": runs,
        }
    )

    runs = []
    cache_drop = "none"
    loaded = None
    for _ in range(args.runs):
        loaded = None  # free the previous run's tensors before timing the next
        cache_drop = drop_caches([path])
        t0 = time.perf_counter()
        loaded = torch.load(path)
        runs.append(time.perf_counter() - t0)
    results.append(
        {
            "name": "torch.load",
            "what": "torch.load of the file, cold cache",
            "bytes": nbytes,
            "runs_s": runs,
        }
    )
    for name, t in state.items():
        if not torch.equal(loaded[name], t):
            sys.exit(f"torch_baseline: torch.load returned different data for {name}")
    os.remove(path)

    report = {
        "tool": "torch " + torch.__version__ + " (Python)",
        "bytes": nbytes,
        "tensors": len(state),
        "cache_drop": cache_drop,
        "results": results,
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
