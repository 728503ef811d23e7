#!/usr/bin/env python3
"""cairn.torch's distributed and Hugging Face paths against PyTorch's and
transformers' own, in one run, same state, same disk.

Usage: fsdp_hf_compare.py [--params-m 32] [--world 2] [--hf-layers 6] [--dir DIR]

1. FSDP2 (``fully_shard``) model of ``--params-m`` million float32
   parameters with Adam after one step, on ``--world`` gloo ranks (one
   process each): the state dict of ``get_state_dict`` saved with
   ``torch.distributed.checkpoint.save`` (``FileSystemWriter``) and with
   ``cairn.torch.save_distributed``, then loaded back by the same ranks with
   ``dcp.load`` and ``cairn.torch.load_distributed``. Rank 0 times each
   between barriers; best of 3.
2. A GPT-2 of ``--hf-layers`` layers (n_embd 768) saved with transformers'
   ``save_pretrained`` and with ``cairn.torch.save_pretrained`` (both
   ``max_shard_size="100MB"``, sharded), and loaded with
   ``from_pretrained`` and with ``cairn.torch.load_pretrained`` into a built
   model (checksums checked against the manifest), and from transformers'
   folder (no manifest). Best of 3. ``from_pretrained`` maps the files and
   builds a model on them; Cairn copies into the model's own memory.

Cairn's saves are durable when they return (fsync, manifest last); DCP's and
transformers' are not (no fsync). The page cache is warm for the loads.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time


def _best(fn, reps: int = 3) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _rank(args: argparse.Namespace) -> None:
    import cairn.torch as ct
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import torch

    rank, world = args.rank, args.world
    dist.init_process_group(
        "gloo", init_method="file://" + os.path.join(args.dir, "rdv"), rank=rank, world_size=world
    )
    torch.manual_seed(0)
    width = 2048
    layers = max(1, int(args.params_m * 1e6) // (width * width))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, width)).sum().backward()
    optim.step()
    msd, osd = get_state_dict(model, optim)
    state = {"model": msd, "optim": osd}
    counter = [0]

    def fresh(name: str) -> str:
        counter[0] += 1
        path = os.path.join(args.dir, f"{name}-{counter[0]}")
        return path

    def timed(fn) -> float:
        dist.barrier()
        t = time.perf_counter()
        fn()
        dist.barrier()
        return time.perf_counter() - t

    res = {}
    last = {}

    def dcp_save() -> None:
        last["dcp"] = fresh("dcp")
        dcp.save(state, storage_writer=dcp.FileSystemWriter(last["dcp"]))

    def cairn_save() -> None:
        last["cairn"] = fresh("cairn")
        ct.save_distributed(last["cairn"], state)

    res["dcp.save"] = min(timed(dcp_save) for _ in range(3))
    res["cairn save_distributed"] = min(timed(cairn_save) for _ in range(3))
    res["dcp.load"] = min(
        timed(lambda: dcp.load(state, checkpoint_id=last["dcp"])) for _ in range(3)
    )
    res["cairn load_distributed"] = min(
        timed(lambda: ct.load_distributed(last["cairn"], state)) for _ in range(3)
    )
    if rank == 0:
        nbytes = sum(
            t.numel() * t.element_size()
            for t in list(msd.values()) + [v for s in osd["state"].values() for v in s.values()]
            if isinstance(t, torch.Tensor)
        )
        print(f"FSDP2 + Adam, {world} ranks, {nbytes / 2**20:.0f} MiB of state (global)")
        for a, b in (
            ("dcp.save", "cairn save_distributed"),
            ("dcp.load", "cairn load_distributed"),
        ):
            print(
                f"  {a:<16} {res[a]:7.3f} s   {b:<24} {res[b]:7.3f} s   "
                f"ratio {res[a] / res[b]:.2f}x"
            )
    dist.destroy_process_group()


def _hf(args: argparse.Namespace) -> None:
    import cairn.torch as ct
    import transformers

    import torch

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=args.hf_layers, n_embd=768, n_head=12)
    model = transformers.GPT2LMHeadModel(config)
    unique = {t.data_ptr(): t.numel() * t.element_size() for t in model.state_dict().values()}
    nbytes = sum(unique.values())  # a tied head once
    counter = [0]

    def fresh(name: str) -> str:
        counter[0] += 1
        return os.path.join(args.dir, f"{name}-{counter[0]}")

    last = {}

    def hf_save() -> None:
        last["hf"] = fresh("hf")
        model.save_pretrained(last["hf"], max_shard_size="100MB")

    def cairn_save() -> None:
        last["cairn"] = fresh("cairnhf")
        ct.save_pretrained(model, last["cairn"], max_shard_size="100MB")

    res = {
        "transformers save_pretrained": _best(hf_save),
        "cairn save_pretrained": _best(cairn_save),
        "transformers from_pretrained": _best(
            lambda: transformers.GPT2LMHeadModel.from_pretrained(last["hf"])
        ),
        "cairn load_pretrained": _best(lambda: ct.load_pretrained(last["cairn"], model)),
        "cairn load, no manifest": _best(lambda: ct.load_pretrained(last["hf"], model)),
    }
    print(f"GPT-2, {args.hf_layers} layers, {nbytes / 2**20:.0f} MiB of weights")
    for a, b in (
        ("transformers save_pretrained", "cairn save_pretrained"),
        ("transformers from_pretrained", "cairn load_pretrained"),
        ("transformers from_pretrained", "cairn load, no manifest"),
    ):
        print(f"  {a:<29} {res[a]:7.3f} s   {b:<22} {res[b]:7.3f} s   ratio {res[a] / res[b]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params-m", type=float, default=32)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--hf-layers", type=int, default=6)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("--part", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part == "rank":
        _rank(args)
        return
    if args.part == "hf":
        _hf(args)
        return
    top = tempfile.mkdtemp(prefix="fsdp_hf_compare-", dir=args.dir)
    try:
        base = [
            sys.executable,
            os.path.abspath(__file__),
            "--params-m",
            str(args.params_m),
            "--world",
            str(args.world),
            "--hf-layers",
            str(args.hf_layers),
        ]
        fsdp_dir = os.path.join(top, "fsdp")
        os.makedirs(fsdp_dir)
        procs = [
            subprocess.Popen(base + ["--dir", fsdp_dir, "--part", "rank", "--rank", str(r)])
            for r in range(args.world)
        ]
        if any(p.wait() != 0 for p in procs):
            sys.exit("a rank failed")
        hf_dir = os.path.join(top, "hf")
        os.makedirs(hf_dir)
        subprocess.run(base + ["--dir", hf_dir, "--part", "hf"], check=True)
    finally:
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
