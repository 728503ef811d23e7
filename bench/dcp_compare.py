#!/usr/bin/env python3
"""Cairn against torch.distributed.checkpoint (DCP), in one run, same state, same disk.

Usage: dcp_compare.py [--size-mib 1024] [--worlds 1,2,4] [--many 100000]
                      [--dir DIR] [--out FILE]

For each world size (processes on gloo, one per rank, each holding 1/W of
the rows of every tensor of a ``--size-mib`` state of float32 [rows, 4096]
tensors), rank 0 times, between barriers:

- ``torch.save`` of each rank's shards into a file of its own (+ fsync);
- ``dcp.save`` with ``FileSystemWriter`` (DTensors over the ranks' shards);
- ``dcp.async_save``: the stall (until it returns) and the whole save, with
  the thread executor (default stager; then ``DefaultStager`` with pinned
  memory on, and with shared memory on — DCP's staging options, off by
  default) and with the process executor;
- ``dcp.save`` through ``cairn.torch.dcp.Writer``;
- Cairn's own sharded save (``save_sharded`` on every rank, then
  ``commit_sharded``) and the stall of ``cairn.torch.AsyncSaver.save``
  (each rank's shards into a checkpoint of its own, staging reserved first).

Then the load with resharding: the world-4 saves loaded by 2 ranks, page
cache dropped first: ``dcp.load`` with ``FileSystemReader``, ``dcp.load``
with ``cairn.torch.dcp.Reader``, and ``cairn.torch.load_sharded``. Then
the many-tensor case: ``--many`` tensors of 64 floats spread over 4 ranks
(and a fifth as many, to see how each grows), where DCP's planning (every
step before ``write_data``) is timed apart. fio's sequential write of the
same bytes (O_DIRECT, 1 MiB blocks, fsync at the end) is the ceiling.
Prints a table with ratios; ``--out`` writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROW = 4096  # floats per row: 16 KiB
TENSOR_MIB = 64


# ---- the ranks' side ---------------------------------------------------------


def _rank_main(args: argparse.Namespace) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    import torch.distributed as dist

    import torch

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method="file://" + args.store, rank=args.rank, world_size=args.world
    )
    try:
        results = PHASES[args.phase](args)
        if args.rank == 0:
            with open(args.result, "w") as f:
                json.dump(results, f)
    finally:
        dist.destroy_process_group()


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds from a barrier before ``fn`` to a barrier after it, on every rank."""
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    out = fn()
    dist.barrier()
    return time.perf_counter() - t0, out


def _state(size_mib: int, rank: int, world: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each rank's shards: (name -> local rows, name -> (global shape, offsets))."""
    from cairn.torch import even_split

    import torch

    rows = TENSOR_MIB * 1024 * 1024 // (ROW * 4)
    local, layout = {}, {}
    g = torch.Generator().manual_seed(rank)
    for i in range(max(1, size_mib // TENSOR_MIB)):
        offsets, shape = even_split([rows, ROW], 0, rank, world)
        local[f"layer{i:03d}.weight"] = torch.rand(shape, generator=g)
        layout[f"layer{i:03d}.weight"] = ([rows, ROW], offsets)
    return local, layout


def _dtensors(local: dict[str, Any], world: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cpu", (world,))
    return {
        k: DTensor.from_local(
            v, mesh, [Shard(0)], run_check=False, shape=_global(v), stride=(v.shape[1], 1)
        )
        for k, v in local.items()
    }


def _global(v: Any) -> Any:
    import torch

    rows = TENSOR_MIB * 1024 * 1024 // (ROW * 4)
    return torch.Size([rows, v.shape[1]])


def _sync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _gather_reports(report: Any) -> list[Any]:
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, report)
    return out


def _phase_save(args: argparse.Namespace) -> dict[str, Any]:
    import cairn
    import cairn.torch as ct
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from cairn.torch.dcp import Writer
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    import torch

    rank, world, root = args.rank, args.world, args.dir
    local, layout = _state(args.size_mib, rank, world)
    dstate = _dtensors(local, world)
    res: dict[str, Any] = {}
    keep = args.keep  # the world whose saves the resharding load reads

    def fresh(name: str) -> str:
        path = os.path.join(root, f"w{world}-{name}")
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)
        dist.barrier()
        return path

    def done(path: str, keep_it: bool = False) -> None:
        dist.barrier()
        if rank == 0 and not keep_it:
            shutil.rmtree(path, ignore_errors=True)
        dist.barrier()

    # torch.save: each rank its own file.
    p = fresh("torch")
    os.makedirs(p, exist_ok=True)

    def torch_save() -> None:
        f = os.path.join(p, f"rank{rank}.pt")
        with open(f, "wb") as out:
            torch.save(local, out)
            out.flush()
            os.fsync(out.fileno())
        _sync_dir(p)

    res["torch.save"], _ = _timed(torch_save)
    done(p)

    # dcp.save, FileSystemWriter.
    p = fresh("dcp")
    res["dcp.save"], _ = _timed(
        lambda: dcp.save(dstate, storage_writer=dcp.FileSystemWriter(p, sync_files=True))
    )
    done(p, keep_it=keep)

    # dcp.async_save: stall and whole.
    def async_round(label: str, **kw: Any) -> None:
        q = fresh(label.replace(" ", "_"))
        try:
            dist.barrier()
            t0 = time.perf_counter()
            fut = dcp.async_save(dstate, storage_writer=dcp.FileSystemWriter(q), **kw)
            stall = time.perf_counter() - t0
            if hasattr(fut, "upload_completion"):
                fut.upload_completion.result()
            else:
                fut.result()
            dist.barrier()
            total = time.perf_counter() - t0
            res[f"{label} stall"] = max(_gather_reports(stall))
            res[f"{label} total"] = total
        except Exception as e:  # an option this machine lacks (pinned memory without CUDA)
            res[f"{label} stall"] = f"n/a: {type(e).__name__}: {str(e).splitlines()[0][:90]}"
        done(q)

    async_round("dcp.async_save thread")
    for label, options in (
        ("dcp.async_save thread+pinned", StagingOptions(True, False, False, False)),
        ("dcp.async_save thread+shm", StagingOptions(False, True, False, False)),
    ):
        stager = DefaultStager(options)
        try:
            async_round(label, async_stager=stager)
        finally:
            stager.close()
    # The process executor starts its process on the first call: warm it up.
    warm = fresh("warm")
    dcp.async_save(
        {"x": torch.zeros(1)},
        storage_writer=dcp.FileSystemWriter(warm),
        async_checkpointer_type=AsyncCheckpointerType.PROCESS,
    ).result()
    done(warm)
    async_round("dcp.async_save process", async_checkpointer_type=AsyncCheckpointerType.PROCESS)

    # dcp.save through Cairn's Writer.
    p = fresh("dcp_cairn")
    res["dcp.save via cairn Writer"], _ = _timed(lambda: dcp.save(dstate, storage_writer=Writer(p)))
    done(p, keep_it=keep)

    # Cairn's own sharded save.
    p = fresh("cairn")

    def cairn_save() -> None:
        shards = {k: ct.Shard(v, *layout[k]) for k, v in local.items()}
        report = ct.save_sharded(p, rank, shards)
        reports = _gather_reports(report)
        if rank == 0:
            ct.commit_sharded(p, reports)

    res["cairn save_sharded"], _ = _timed(cairn_save)
    done(p, keep_it=keep)

    # Cairn's async stall: AsyncSaver.save returns once the shards are copied.
    p = fresh("cairn_async")
    with ct.AsyncSaver() as saver:
        saver.reserve(local, background=False)
        dist.barrier()
        t0 = time.perf_counter()
        handle = saver.save(local, cairn.Checkpoint(os.path.join(p, f"rank{rank}")))
        stall = time.perf_counter() - t0
        handle.wait()
        dist.barrier()
        res["cairn AsyncSaver total"] = time.perf_counter() - t0
        res["cairn AsyncSaver stall"] = max(_gather_reports(stall))
    done(p)
    res["bytes"] = sum(v.numel() * 4 for v in local.values()) * world
    return res


def _phase_load(args: argparse.Namespace) -> dict[str, Any]:
    """Saved by 4 (the kept world-4 saves), loaded by this world."""
    import cairn.torch as ct
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from cairn.torch.dcp import Reader

    sys.path.insert(0, HERE)
    from cache import drop_caches

    rank, world, root = args.rank, args.world, args.dir
    local, layout = _state(args.size_mib, rank, world)
    for v in local.values():
        v.zero_()
    dstate = _dtensors(local, world)
    res: dict[str, Any] = {}

    def cold() -> None:
        if rank == 0:
            drop_caches([])
        dist.barrier()

    cold()
    res["dcp.load (FileSystemReader)"], _ = _timed(
        lambda: dcp.load(dstate, storage_reader=dcp.FileSystemReader(f"{root}/w4-dcp"))
    )
    cold()
    shards = {k: ct.Shard(v, *layout[k]) for k, v in local.items()}
    res["cairn load_sharded"], _ = _timed(lambda: ct.load_sharded(f"{root}/w4-cairn", shards))
    cold()
    res["dcp.load via cairn Reader"], _ = _timed(
        lambda: dcp.load(dstate, storage_reader=Reader(f"{root}/w4-dcp_cairn"))
    )
    return res


def _phase_many(args: argparse.Namespace) -> dict[str, Any]:
    """``--many`` tensors of 64 floats over the ranks (each rank its own)."""
    import cairn.torch as ct
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    import torch

    rank, world, root = args.rank, args.world, args.dir
    per = args.many // world
    local = {f"r{rank}.t{i:06d}": torch.full((64,), float(i)) for i in range(per)}
    res: dict[str, Any] = {}
    marks: dict[str, float] = {}

    class Timed(dcp.FileSystemWriter):
        def write_data(self, plan: Any, planner: Any) -> Any:
            marks["write"] = time.perf_counter()
            return super().write_data(plan, planner)

    p = os.path.join(root, f"many{args.many}-dcp")
    if rank == 0:
        shutil.rmtree(p, ignore_errors=True)
    dist.barrier()
    t0 = time.perf_counter()
    res["dcp.save"], _ = _timed(lambda: dcp.save(local, storage_writer=Timed(p)))
    res["dcp planning"] = max(_gather_reports(marks["write"] - t0))
    p = os.path.join(root, f"many{args.many}-cairn")
    if rank == 0:
        shutil.rmtree(p, ignore_errors=True)
    dist.barrier()

    def cairn_save() -> None:
        report = ct.save_sharded(p, rank, local)
        reports = _gather_reports(report)
        if rank == 0:
            ct.commit_sharded(p, reports)

    res["cairn save_sharded"], _ = _timed(cairn_save)
    dist.barrier()
    if rank == 0:
        for q in (f"many{args.many}-dcp", f"many{args.many}-cairn"):
            shutil.rmtree(os.path.join(root, q), ignore_errors=True)
    return res


PHASES: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "save": _phase_save,
    "load": _phase_load,
    "many": _phase_many,
}


# ---- the driver --------------------------------------------------------------


def _group(world: int, phase: str, args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    tmp = tempfile.mkdtemp(prefix="dcp-compare-")
    result = os.path.join(tmp, "result.json")
    base = [sys.executable, os.path.abspath(__file__), "--phase", phase]
    base += ["--world", str(world), "--store", os.path.join(tmp, "store"), "--result", result]
    base += ["--dir", args.dir, "--size-mib", str(args.size_mib)]
    for k, v in extra.items():
        base += [f"--{k}", str(v)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    t0 = time.perf_counter()
    procs = [subprocess.Popen(base + ["--rank", str(r)], env=env) for r in range(world)]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"{phase} with {world} ranks failed: exit codes {codes}")
    with open(result) as f:
        out = json.load(f)
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"  ({phase}, {world} rank(s): {time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return out


def _fio_write(folder: str, nbytes: int) -> float:
    """fio's write bandwidth in bytes per second (bench/fio_write.py)."""
    sys.path.insert(0, HERE)
    from fio_write import fio_write

    path = os.path.join(folder, "fio.bin")
    try:
        seconds, written = fio_write(path, nbytes)
    finally:
        if os.path.exists(path):
            os.remove(path)
    return written / seconds


def _fmt(v: Any) -> str:
    return f"{v:8.3f}" if isinstance(v, (int, float)) else str(v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--worlds", default="1,2,4")
    ap.add_argument("--many", type=int, default=100000)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--out", default=None)
    # A rank's own arguments.
    ap.add_argument("--phase", default=None)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--store", default=None)
    ap.add_argument("--result", default=None)
    ap.add_argument("--keep", type=int, default=0)
    args = ap.parse_args()
    if args.phase:
        _rank_main(args)
        return
    own = args.dir is None
    args.dir = args.dir or tempfile.mkdtemp(prefix="dcp-compare-data-", dir=os.getcwd())
    os.makedirs(args.dir, exist_ok=True)
    report: dict[str, Any] = {"size_mib": args.size_mib, "saves": {}, "many": {}}
    try:
        nbytes = args.size_mib << 20
        fio = _fio_write(args.dir, nbytes)
        report["fio_write_Bps"] = fio
        worlds = [int(w) for w in args.worlds.split(",") if w]
        for w in worlds:
            report["saves"][w] = _group(w, "save", args, keep=int(w == 4))
        if 4 in worlds:
            report["load_4_to_2"] = _group(2, "load", args)
        for n in (args.many // 5, args.many):
            report["many"][n] = _group(4, "many", args, many=n)
    finally:
        if own:
            shutil.rmtree(args.dir, ignore_errors=True)
    _print(report)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


def _print(r: dict[str, Any]) -> None:
    gib = r["size_mib"] / 1024
    print(f"fio sequential write (O_DIRECT, fsync): {r['fio_write_Bps'] / 1e9:.2f} GB/s")
    print(f"ceiling for {gib:.2f} GiB: {(r['size_mib'] << 20) / r['fio_write_Bps']:.3f} s")
    for w, s in r["saves"].items():
        print(f"\nsave, {w} rank(s), {gib:.2f} GiB (seconds; ratio = DCP's / Cairn's)")
        for k, v in s.items():
            if k != "bytes":
                print(f"  {k:36s} {_fmt(v)}")
        c = s["cairn save_sharded"]
        print(f"  dcp.save / cairn save_sharded: {s['dcp.save'] / c:.2f}x")
        stalls = [v for k, v in s.items() if k.endswith("stall") and k.startswith("dcp")]
        best = min(v for v in stalls if isinstance(v, (int, float)))
        print(f"  best DCP async stall / Cairn's: {best / s['cairn AsyncSaver stall']:.2f}x")
    if "load_4_to_2" in r:
        ld = r["load_4_to_2"]
        print("\nload with resharding, saved by 4, loaded by 2 (cold cache, seconds)")
        for k, v in ld.items():
            print(f"  {k:36s} {_fmt(v)}")
        ratio = ld["dcp.load (FileSystemReader)"] / ld["cairn load_sharded"]
        print(f"  dcp.load / cairn load_sharded: {ratio:.2f}x")
    print("\nmany small tensors (64 floats each) over 4 ranks (seconds)")
    for n, m in r["many"].items():
        print(f"  {n:7d} tensors: " + ", ".join(f"{k} {_fmt(v).strip()}" for k, v in m.items()))


if __name__ == "__main__":
    main()
