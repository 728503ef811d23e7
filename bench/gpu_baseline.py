#!/usr/bin/env python3
"""PyTorch's own checkpointing of GPU-resident state, for bench/gpu_report.py.

Builds the same CUDA tensors bench/gpu_bench.cc saves (the workload JSON that
`gpu_bench --workload` prints) and measures, each --runs times:
  d2h_pinned        copy of every tensor into pinned host tensors
  dcp_async_stall   torch.distributed.checkpoint.async_save(), call to return
  dcp_save          dcp.save() (files fsync'd by its FileSystemWriter)
  torch_save        torch.save() of the CUDA state dict, then fsync
  dcp_load_gpu      dcp.load() into the CUDA tensors, page cache dropped first
Prints one JSON object ({"tool", "bytes", "results": [{"name", "runs_s"}]}).
Runs in one process with a one-rank gloo process group (DCP's async save
wants a CPU process group); nothing leaves 127.0.0.1.
"""
import argparse
import json
import os
import shutil
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from cache import drop_caches


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
    dist.init_process_group("gloo", init_method="file://" + os.path.join(store_dir, "store"),
                            rank=0, world_size=1)
    state = {}
    for i, s in enumerate(specs):
        torch.manual_seed(i)
        state[s["name"]] = torch.rand(s["shape"], device="cuda")
    pinned = {k: torch.empty(v.shape, pin_memory=True) for k, v in state.items()}
    nbytes = sum(v.numel() * v.element_size() for v in state.values())
    torch.cuda.synchronize()
    results = []

    def record(name, runs):
        results.append({"name": name, "bytes": nbytes, "runs_s": runs})

    runs = []
    for _ in range(args.runs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for k, v in state.items():
            pinned[k].copy_(v, non_blocking=True)
        torch.cuda.synchronize()
        runs.append(time.perf_counter() - t0)
    record("d2h_pinned", runs)

    runs = []
    for i in range(args.runs):
        path = os.path.join(args.dir, f"dcp_async{i}")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fut = dcp.async_save(state, checkpoint_id=path)
        runs.append(time.perf_counter() - t0)
        fut.result()
        shutil.rmtree(path)
    record("dcp_async_stall", runs)

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
        torch.cuda.synchronize()
        runs.append(time.perf_counter() - t0)
    record("dcp_load_gpu", runs)
    shutil.rmtree(last)

    dist.destroy_process_group()
    shutil.rmtree(store_dir, ignore_errors=True)
    print(json.dumps({"tool": "gpu_baseline", "torch": torch.__version__,
                      "gpu": torch.cuda.get_device_name(0), "bytes": nbytes,
                      "cache_drop": method, "results": results}))


if __name__ == "__main__":
    main()
