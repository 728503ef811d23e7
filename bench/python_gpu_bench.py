#!/usr/bin/env python3
"""Cairn from Python against PyTorch DCP on GPU-resident state, in one process.

Usage (scripts/gpu-check.sh runs it; docs/benchmarks.md, "GPU state from
Python")::

    PYTHONPATH=<build>/python python3 bench/python_gpu_bench.py \\
        --workload WORKLOAD.json --dir DIR [--runs 3] [--json FILE]

The state is ``cairn_bench --workload``'s (261 float32 tensors of a
transformer and its Adam state) made on the GPU. Each figure is timed
``--runs`` + 1 times in a row: the first call is reported on its own (it
pays one-time setup: staging allocation, pinning, thread pools, a spawned
process) and the figure is the median of the others, the steady state of a
loop that checkpoints periodically. Each save is waited for before the next
one. Writes start after ``sync``; loads start with the page cache dropped
(bench/cache.py).

Cairn (Python package built with CUDA):
  cairn_async_stall      ``cairn.torch.AsyncSaver.save`` into a CheckpointManager
                         with staging reserved, until it returns (the tensors
                         may change from then on)
  cairn_async_unreserved the first save of a saver without ``reserve()``
  cairn_save             ``cairn.save`` of the CUDA tensors, durable
  cairn_save_host        ``cairn.save`` of a host copy of them, durable
  cairn_load_gpu         ``cairn.load(device="cuda")``, cold
  cairn_restore_gpu      ``StateCheckpointManager.restore`` into the CUDA tensors
                         in place, checksum checked, cold
PyTorch (the same tensors):
  d2h_pinned             a copy of every tensor into pinned host tensors (floor)
  d2h_fresh              ``{k: v.cpu()}``: pageable memory allocated per call
  dcp_async_default      ``dcp.async_save(state, checkpoint_id=...)``, defaults
  dcp_async_cached       with ``FileSystemWriter(cache_staged_state_dict=True)``
                         (staging allocated pinned once, reused)
  dcp_async_stager       with ``async_stager=DefaultStager(StagingOptions(pinned,
                         async staging, non-blocking copy))``: until the call
                         returns, and ``_staged`` until its staging is done
                         (when the tensors may change)
  dcp_async_process      the cached writer above with ``AsyncCheckpointerType.PROCESS``
  dcp_save               ``dcp.save`` (FileSystemWriter fsyncs its files)
  torch_save             ``torch.save`` of the CUDA state dict, then fsync
  dcp_load_gpu           ``dcp.load`` into the CUDA tensors, cold

A DCP configuration the installed torch lacks is reported as skipped with
the reason. Prints one JSON line per figure as it is measured, then a table.
Runs a one-rank gloo process group (DCP's async save wants a CPU group) on
127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cache import drop_caches

results: list[dict[str, Any]] = []
WAIT_S = 120  # a background save that takes longer has hung: fail, do not wait forever


def record(name: str, runs: list[float], nbytes: int, config: str, **extra: Any) -> None:
    """Adds a figure: the first call alone, the median of the rest."""
    entry = {
        "name": name,
        "config": config,
        "bytes": nbytes,
        "first_s": runs[0],
        "runs_s": runs[1:],
        "median_s": statistics.median(runs[1:]) if runs[1:] else None,
        **extra,
    }
    results.append(entry)
    print(json.dumps(entry), flush=True)


def skipped(name: str, config: str, why: str) -> None:
    entry = {"name": name, "config": config, "skipped": why}
    results.append(entry)
    print(json.dumps(entry), flush=True)


def fsync_tree(path: str) -> None:
    for root, _, files in os.walk(path):
        for f in files:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)


def files_of(path: str) -> list[str]:
    if os.path.isfile(path):
        return [path]
    return [os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", required=True, help="JSON from cairn_bench --workload")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", help="also write every figure here")
    args = ap.parse_args()
    n = args.runs + 1

    import cairn
    import cairn.torch as ct
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    import torch

    if not (cairn.CUDA and torch.cuda.is_available()):
        print("python_gpu_bench: needs a Cairn built with CUDA and a GPU", file=sys.stderr)
        return 2
    with open(args.workload) as f:
        specs = json.load(f)["tensors"]
    os.makedirs(args.dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="pygpu-", dir=args.dir)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo", rank=0, world_size=1)

    gen = torch.Generator(device="cuda").manual_seed(1)
    state = {s["name"]: torch.rand(s["shape"], device="cuda", generator=gen) for s in specs}
    nbytes = sum(v.numel() * v.element_size() for v in state.values())
    torch.cuda.synchronize()
    print(
        json.dumps(
            {
                "torch": torch.__version__,
                "gpu": torch.cuda.get_device_name(0),
                "bytes": nbytes,
                "tensors": len(state),
            }
        ),
        flush=True,
    )

    def timed(fn: Callable[[], Any], sync: bool = True) -> tuple[float, Any]:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if sync:
            torch.cuda.synchronize()
        return time.perf_counter() - t0, out

    # ---- floors --------------------------------------------------------
    pinned = {k: torch.empty(v.shape, pin_memory=True) for k, v in state.items()}

    def d2h() -> None:
        for k, v in state.items():
            pinned[k].copy_(v, non_blocking=True)  # noqa: F821 (deleted after the loop)

    record("d2h_pinned", [timed(d2h)[0] for _ in range(n)], nbytes, "pinned, reused")
    del pinned
    record(
        "d2h_fresh",
        [timed(lambda: {k: v.cpu() for k, v in state.items()})[0] for _ in range(n)],
        nbytes,
        "tensor.cpu(), fresh pageable memory",
    )

    # ---- Cairn ---------------------------------------------------------
    manager = cairn.CheckpointManager(
        os.path.join(work, "cairn"), "exp", cairn.CheckpointConfig(num_to_keep=1)
    )
    with ct.AsyncSaver() as fresh:
        os.sync()
        stall, h = timed(lambda: fresh.save(state, manager), sync=False)
        h.wait()
    record("cairn_async_unreserved", [stall], nbytes, "AsyncSaver, no reserve()")
    with ct.AsyncSaver() as saver:
        reserve_s, _ = timed(lambda: saver.reserve(state, background=False), sync=False)
        runs, engine = [], []
        for _ in range(n):
            os.sync()
            stall, h = timed(lambda: saver.save(state, manager), sync=False)
            engine.append(saver.stats()["last_stall_seconds"])  # the C++ save() alone
            h.wait()
            runs.append(stall)
        record(
            "cairn_async_stall",
            runs,
            nbytes,
            "AsyncSaver, reserve() before the loop",
            reserve_s=reserve_s,
            engine_stall_s=engine,
        )
    manager.close()

    path = os.path.join(work, "cairn.safetensors")
    runs = []
    for _ in range(n):
        os.sync()
        runs.append(timed(lambda: cairn.save(state, path), sync=False)[0])
    record("cairn_save", runs, nbytes, "cairn.save, durable")
    host = {k: v.cpu() for k, v in state.items()}
    runs = []
    for _ in range(n):
        os.sync()
        runs.append(timed(lambda: cairn.save(host, path), sync=False)[0])  # noqa: F821 (deleted after the loop)
    record("cairn_save_host", runs, nbytes, "cairn.save of a host copy, durable")
    del host
    runs = []
    for _ in range(n):
        drop_caches([path])
        seconds, loaded = timed(lambda: cairn.load(path, device="cuda"))
        runs.append(seconds)
        assert all(loaded[k].is_cuda for k in loaded)
        del loaded
    record("cairn_load_gpu", runs, nbytes, "cairn.load(device='cuda'), cold")
    os.remove(path)

    with ct.StateCheckpointManager(os.path.join(work, "restore"), max_to_keep=1) as m:
        m.save(0, state)
        target = {k: torch.empty_like(v) for k, v in state.items()}
        runs = []
        for _ in range(n):
            drop_caches(files_of(os.path.join(work, "restore")))
            runs.append(timed(lambda: m.restore(target))[0])  # noqa: F821 (deleted after the loop)
        assert all(torch.equal(target[k], state[k]) for k in list(state)[:8])
        del target
    record("cairn_restore_gpu", runs, nbytes, "StateCheckpointManager.restore in place, cold")
    shutil.rmtree(os.path.join(work, "restore"))

    # ---- DCP -----------------------------------------------------------
    from torch.distributed.checkpoint import FileSystemWriter

    counter = [0]

    def new_id() -> str:
        counter[0] += 1
        return os.path.join(work, f"dcp{counter[0]}")

    def async_runs(name: str, config: str, call: Callable[[str], Any]) -> None:
        """Async saves, each waited for: `name` until the call returns and,
        where staging may finish later (an AsyncSaveResponse), `name`_staged
        until it has (when the tensors may change)."""
        returned, staged, last = [], [], None
        for _ in range(n):
            os.sync()
            where = new_id()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = call(where)
            returned.append(time.perf_counter() - t0)
            if hasattr(out, "staging_completion"):
                out.staging_completion.result(timeout=WAIT_S)
                staged.append(time.perf_counter() - t0)
                out = out.upload_completion
            out.result(timeout=WAIT_S)
            if last:
                shutil.rmtree(last, ignore_errors=True)
            last = where
        shutil.rmtree(last, ignore_errors=True)
        record(name, returned, nbytes, config)
        if staged:
            record(name + "_staged", staged, nbytes, config)

    def attempt(name: str, config: str, body: Callable[[], None]) -> None:
        try:
            body()
        except Exception as e:  # an API this torch lacks: say so, go on
            skipped(name, config, f"{type(e).__name__}: {e}")
            traceback.print_exc()

    attempt(
        "dcp_async_default",
        "defaults",
        lambda: async_runs(
            "dcp_async_default",
            "async_save(checkpoint_id=...), defaults",
            lambda where: dcp.async_save(state, checkpoint_id=where),
        ),
    )

    def cached() -> None:
        writer = FileSystemWriter(new_id(), cache_staged_state_dict=True)
        async_runs(
            "dcp_async_cached",
            "FileSystemWriter(cache_staged_state_dict=True)",
            lambda where: dcp.async_save(state, checkpoint_id=where, storage_writer=writer),
        )

    attempt("dcp_async_cached", "FileSystemWriter(cache_staged_state_dict=True)", cached)

    def stager_options() -> Any:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        return DefaultStager(
            StagingOptions(
                use_pinned_memory=True,
                use_shared_memory=False,
                use_async_staging=True,
                use_non_blocking_copy=True,
            )
        )

    def with_stager() -> None:
        stager = stager_options()
        async_runs(
            "dcp_async_stager",
            "DefaultStager(pinned, async staging, non-blocking)",
            lambda where: dcp.async_save(state, checkpoint_id=where, async_stager=stager),
        )
        getattr(stager, "close", lambda: None)()

    attempt("dcp_async_stager", "DefaultStager", with_stager)

    def process() -> None:
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        writer = FileSystemWriter(new_id(), cache_staged_state_dict=True)
        async_runs(
            "dcp_async_process",
            "AsyncCheckpointerType.PROCESS + FileSystemWriter(cache_staged_state_dict=True)",
            lambda where: dcp.async_save(
                state,
                checkpoint_id=where,
                storage_writer=writer,
                async_checkpointer_type=AsyncCheckpointerType.PROCESS,
            ),
        )

    attempt("dcp_async_process", "AsyncCheckpointerType.PROCESS", process)

    runs, last = [], None
    for _ in range(n):
        os.sync()
        where = new_id()
        runs.append(timed(lambda: dcp.save(state, checkpoint_id=where), sync=False)[0])
        if last:
            shutil.rmtree(last)
        last = where
    record("dcp_save", runs, nbytes, "dcp.save, FileSystemWriter defaults (fsync)")
    runs = []
    for _ in range(n):
        drop_caches(files_of(last))
        runs.append(timed(lambda: dcp.load(state, checkpoint_id=last))[0])
    record("dcp_load_gpu", runs, nbytes, "dcp.load into the CUDA tensors, cold")
    shutil.rmtree(last)

    runs = []
    for i in range(n):
        where = os.path.join(work, f"torch{i}.pt")
        os.sync()

        def save_fsync() -> None:
            torch.save(state, where)
            fsync_tree(where)

        runs.append(timed(save_fsync, sync=False)[0])
        os.remove(where)
    record("torch_save", runs, nbytes, "torch.save + fsync")

    dist.destroy_process_group()
    shutil.rmtree(work, ignore_errors=True)
    report(nbytes)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name(0),
                    "bytes": nbytes,
                    "results": results,
                },
                f,
                indent=1,
            )
    return 0


def report(nbytes: int) -> None:
    """A table of every figure, then the comparisons."""
    by = {r["name"]: r for r in results if "median_s" in r}
    print("\n| figure | first call | steady (median) | GB/s steady | configuration |")
    print("|---|---:|---:|---:|---|")
    for r in results:
        if "skipped" in r:
            print(f"| {r['name']} | | | | skipped: {r['skipped'][:120]} |")
            continue
        med = r["median_s"]
        rate = f"{nbytes / med / 1e9:.2f}" if med else ""
        steady = f"{med:.3f} s" if med is not None else ""
        print(f"| {r['name']} | {r['first_s']:.3f} s | {steady} | {rate} | {r['config']} |")

    def ratio(a: str, b: str, label: str) -> None:
        if a in by and b in by and by[a]["median_s"] and by[b]["median_s"]:
            print(f"- {label}: {by[b]['median_s'] / by[a]['median_s']:.2f}x")

    print()
    ratio("d2h_pinned", "cairn_async_stall", "Cairn async stall / the pinned copy")
    for ref in (
        "dcp_async_default",
        "dcp_async_cached",
        "dcp_async_stager_staged",
        "dcp_async_process",
    ):
        ratio("cairn_async_stall", ref, f"{ref} stall / Cairn's")
    ratio("cairn_save", "cairn_save_host", "Cairn GPU save speed / Cairn host save's")
    ratio("cairn_save", "dcp_save", "Cairn save speed / dcp.save's")
    ratio("cairn_save", "torch_save", "Cairn save speed / torch.save's")
    ratio("cairn_load_gpu", "dcp_load_gpu", "Cairn cold load speed / dcp.load's")
    ratio("cairn_restore_gpu", "dcp_load_gpu", "Cairn cold restore speed / dcp.load's")


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # DCP's process-based checkpointer may leave its process and threads
    # behind; the figures are out, so do not wait for them at exit.
    os._exit(code)
