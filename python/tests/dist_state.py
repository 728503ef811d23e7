"""Worker of test_torch_distributed.py: one rank of a gloo group saving or
loading DTensor / FSDP2 state with cairn.torch.save_distributed and
load_distributed. Prints DONE on success; any failure exits non-zero.

    python dist_state.py KIND PHASE RANK WORLD MESH DIR
      KIND  fsdp (a model under fully_shard and Adam) or dtensor (tensors on a mesh)
      PHASE save or load; MESH "4", "2x2", ... or "plain" (one process, no DTensor)
"""

from __future__ import annotations

import os
import sys

import cairn
import cairn.torch as ct
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

import torch

KIND, PHASE, RANK, WORLD, MESH, DIR = sys.argv[1:7]
RANK, WORLD = int(RANK), int(WORLD)
CKPT = os.path.join(DIR, "ckpt")


def model_and_optim(seed: int, shard: bool) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    # Uneven: 7 and 5 rows over 4 ranks (2, 2, 2, 1 and 2, 2, 1, 0).
    model = torch.nn.Sequential(torch.nn.Linear(10, 7), torch.nn.ReLU(), torch.nn.Linear(7, 5))
    if shard:
        mesh = init_device_mesh("cpu", (WORLD,))
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.95))


def full_state(model: torch.nn.Module, optim: torch.optim.Optimizer) -> dict:
    msd, osd = get_state_dict(
        model, optim, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    return {"model": msd, "optim": osd}


def same(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and torch.equal(a, b), f"{where}: {a} != {b}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), f"{where}: {list(a)} != {list(b)}"
        for k in a:
            same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), f"{where}: {a} != {b}"
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}.{i}")
    else:
        assert type(a) is type(b) and a == b, f"{where}: {a!r} != {b!r}"


def expect_error(cls: type, words: list[str], fn) -> None:
    try:
        fn()
    except cls as e:
        for w in words:
            assert w in str(e), f"{w!r} not in {e}"
        return
    raise AssertionError(f"no {cls.__name__}")


def fsdp() -> None:
    shard = MESH != "plain"
    if PHASE == "save":
        model, optim = model_and_optim(0, shard)
        torch.manual_seed(1)
        for _ in range(3):
            optim.zero_grad()
            model(torch.randn(8, 10)).square().mean().backward()
            optim.step()
        msd, osd = get_state_dict(model, optim)
        ct.save_distributed(CKPT, {"model": msd, "optim": osd}, metrics={"step": 3})
        ref = full_state(model, optim)
        if RANK == 0:
            torch.save(ref, os.path.join(DIR, "ref.pt"))
        return
    model, optim = model_and_optim(5, shard)  # other weights, no optimizer state yet
    msd, osd = get_state_dict(model, optim)
    state = {"model": msd, "optim": osd}
    if not shard:  # the error paths, in one process
        bad = {"model": dict(msd), "optim": osd}
        bad["model"]["0.weight"] = torch.zeros(3, 10)
        expect_error(
            cairn.InvalidArgumentError, ["0.weight"], lambda: ct.load_distributed(CKPT, bad)
        )
        fewer = {"model": {k: v for k, v in msd.items() if k != "2.bias"}, "optim": osd}
        expect_error(
            cairn.InvalidArgumentError,
            ["model.2.bias", "not in the state dict"],
            lambda: ct.load_distributed(CKPT, fewer),
        )
        assert torch.equal(msd["0.weight"], model_and_optim(5, False)[0].state_dict()["0.weight"])
    ct.load_distributed(CKPT, state)
    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    got = full_state(model, optim)
    if RANK == 0:
        same(torch.load(os.path.join(DIR, "ref.pt")), got, "state")
        assert cairn.Checkpoint(CKPT).get_metadata() is not None
    # Training goes on from the loaded state.
    optim.zero_grad()
    model(torch.randn(8, 10)).square().mean().backward()
    optim.step()


def tensors(mesh) -> dict:
    """The same global tensors, placed on `mesh` as MESH asks (or plain)."""
    torch.manual_seed(7)
    full = {
        "a": torch.randn(7, 5),
        "b": torch.randn(6, 9),
        "c": torch.arange(36, dtype=torch.int64).reshape(9, 4),
        "d": torch.randn(11, dtype=torch.float64),
        "e": torch.randn(3, 3).to(torch.bfloat16),
    }
    if mesh is None:
        return full
    if mesh.ndim == 2:
        places = {
            "a": [Shard(0), Replicate()],
            "b": [Replicate(), Shard(1)],
            "c": [Shard(0), Shard(1)],
            "d": [Shard(0), Shard(0)],
            "e": [Replicate(), Replicate()],
        }
    else:
        places = {
            "a": [Shard(1)],
            "b": [Shard(0)],
            "c": [Replicate()],
            "d": [Shard(0)],
            "e": [Shard(1)],
        }
    return {k: distribute_tensor(v, mesh, places[k]) for k, v in full.items()}


def dtensor() -> None:
    mesh = None
    if MESH != "plain":
        dims = tuple(int(x) for x in MESH.split("x"))
        mesh = init_device_mesh(
            "cpu", dims, mesh_dim_names=tuple(f"m{i}" for i in range(len(dims)))
        )
    if PHASE == "save":
        if mesh is not None and mesh.ndim == 2:
            # One rank's bad value: every rank raises, naming it; nothing is committed.
            bad_dest = os.path.join(DIR, "bad")
            state = {"t": distribute_tensor(torch.ones(4, 4), mesh, [Replicate(), Replicate()])}
            if RANK == 1:
                local = torch.ones(4, 4)
                state = {"t": DTensor.from_local(local, mesh, [Partial(), Replicate()])}
            # The failing rank raises its own error; the others name it.
            words = ["'t'", "Partial"] if RANK == 1 else ["rank 1", "'t'", "Partial"]
            expect_error(cairn.Error, words, lambda: ct.save_distributed(bad_dest, state))
            assert not cairn.Checkpoint(bad_dest).is_committed()
        state = {
            "t": tensors(mesh),
            "extra": {"step": 3, "lr": 0.5, "pair": (1, "x"), "none": None},
        }
        ct.save_distributed(CKPT, state)
        return
    like = tensors(mesh)
    zeros = {
        k: (
            DTensor.from_local(
                torch.zeros_like(v.to_local()),
                v.device_mesh,
                v.placements,
                shape=v.shape,
                stride=v.stride(),
            )
            if isinstance(v, DTensor)
            else torch.zeros_like(v)
        )
        for k, v in like.items()
    }
    state = {"t": zeros, "extra": {"step": 0}}
    ct.load_distributed(CKPT, state)
    for k, v in like.items():
        got = state["t"][k]
        if isinstance(v, DTensor):
            assert got.placements == v.placements
            got, v = got.to_local(), v.to_local()
        assert torch.equal(got, v), k
    assert state["extra"] == {"step": 3, "lr": 0.5, "pair": (1, "x"), "none": None}, state["extra"]


def main() -> None:
    dist.init_process_group(
        "gloo",
        init_method="file://" + os.path.join(DIR, f"rdv-{PHASE}-{WORLD}"),
        rank=RANK,
        world_size=WORLD,
    )
    try:
        fsdp() if KIND == "fsdp" else dtensor()
        dist.barrier()
    finally:
        dist.destroy_process_group()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
