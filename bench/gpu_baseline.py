#!/usr/bin/env python3
"""PyTorch's own checkpointing of GPU-resident state, for bench/gpu_report.py.

Builds the same CUDA tensors bench/gpu_bench.cc saves (the workload JSON that
`gpu_bench --workload` prints) and measures, each --runs times:
  d2h_pinned        copy of every tensor into pinned host tensors
  dcp_async_stall   torch.distributed.checkpoint.async_save() with its defaults
                    (checkpoint_id= only), call to return
  dcp_async_cached_stall
                    the same with FileSystemWriter(cache_staged_state_dict=True):
                    pinned staging allocated once and reused, DCP's best
                    documented configuration on the H200 (docs/benchmarks.md,
                    "GPU state from Python")
  dcp_save          dcp.save() (files fsync'd by its FileSystemWriter)
  torch_save        torch.save() of the CUDA state dict, then fsync
  dcp_load_gpu      dcp.load() into the CUDA tensors, page cache dropped first
Each async figure makes one call more than --runs and reports it apart
("first_s"): the first call pays DCP's setup (thread pool, planner, the
cached writer's allocation), the others are the steady state a training
loop sees. Prints one JSON object ({"tool", "bytes", "results": [{"name",
"runs_s", "first_s"?, "config"?}]}).
Runs in one process with a one-rank gloo process group (DCP's async save
wants a CPU process group); nothing leaves 127.0.0.1.
"""

import argparse
import json
import os
import shutil
import tempfile
import time

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from cache import drop_caches

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", required=True, help="JSON from gpu_bench --workload")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with open(args.workload) as f:
        specs = json.load(f)
    specs = specs["tensors"] if isinstance(specs, dict) else specs

    store_dir = tempfile.mkdtemp(prefix="pg-", dir=args.dir)
    dist.init_process_group(
        "gloo", init_method="file://" + os.path.join(store_dir, "store"), rank=0, world_size=1
    )
    state = {}
    for i, s in enumerate(specs):
        torch.manual_seed(i)
        state[s["name"]] = torch.rand(s["shape"], device="cuda")
    pinned = {k: torch.empty(v.shape, pin_memory=True) for k, v in state.items()}
    nbytes = sum(v.numel() * v.element_size() for v in state.values())
    sync = torch.cuda.synchronize
    sync()
    results = []

    def record(name, runs, **extra):
        results.append({"name": name, "bytes": nbytes, "runs_s": runs, **extra})

    runs = []
    for _ in range(args.runs):
        sync()
        t0 = time.perf_counter()
        for k, v in state.items():
            pinned[k].copy_(v, non_blocking=True)
        sync()
        runs.append(time.perf_counter() - t0)
    record("d2h_pinned", runs)

    def async_stalls(name, config, call):
        """--runs + 1 async saves, each waited for; the first apart."""
        times = []
        for i in range(args.runs + 1):
            path = os.path.join(args.dir, f"{name}{i}")
            os.sync()
            sync()
            t0 = time.perf_counter()
            fut = call(path)
            times.append(time.perf_counter() - t0)
            fut.result()
            shutil.rmtree(path)
        record(name, times[1:], first_s=times[0], config=config)

    async_stalls(
        "dcp_async_stall",
        "async_save(checkpoint_id=...), defaults",
        lambda path: dcp.async_save(state, checkpoint_id=path),
    )
    from torch.distributed.checkpoint import FileSystemWriter

    # One writer for every call, as its cache lives in it; each call names
    # its own folder through checkpoint_id.
    writer = FileSystemWriter(os.path.join(args.dir, "unused"), cache_staged_state_dict=True)
    async_stalls(
        "dcp_async_cached_stall",
        "FileSystemWriter(cache_staged_state_dict=True)",
        lambda path: dcp.async_save(state, checkpoint_id=path, storage_writer=writer),
    )

    runs = []
    last = None
    for i in range(args.runs):
        path = os.path.join(args.dir, f"dcp{i}")
        os.sync()
        t0 = time.perf_counter()
        dcp.save(state, checkpoint_id=path)
        runs.append(time.perf_counter() - t0)
        if last:
            shutil.rmtree(last)
        last = path
    record("dcp_save", runs)

    runs = []
    for i in range(args.runs):
        path = os.path.join(args.dir, f"torch{i}.pt")
        os.sync()
        t0 = time.perf_counter()
        torch.save(state, path)
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        runs.append(time.perf_counter() - t0)
        os.remove(path)
    record("torch_save", runs)

    runs = []
    method = ""
    for _ in range(args.runs):
        method = drop_caches([os.path.join(last, f) for f in os.listdir(last)])
        t0 = time.perf_counter()
        dcp.load(state, checkpoint_id=last)
        sync()
        runs.append(time.perf_counter() - t0)
    record("dcp_load_gpu", runs)
    shutil.rmtree(last)

    dist.destroy_process_group()
    shutil.rmtree(store_dir, ignore_errors=True)
    print(
        json.dumps(
            {
                "tool": "gpu_baseline",
                "torch": torch.__version__,
                "gpu": torch.cuda.get_device_name(0),
                "bytes": nbytes,
                "cache_drop": method,
                "results": results,
            }
        )
    )


if __name__ == "__main__":
    main()
