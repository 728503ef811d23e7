"""One rank of a gloo group that saves and loads through cairn.torch.dcp
(test_dcp.py starts one per rank).

Usage: dcp_worker.py CONFIG_JSON RANK. CONFIG holds "world" (the group's
size), "store" (a file for torch.distributed's FileStore rendezvous: no
port to pick) and "steps", run in order by every rank:

- {"op": "save", "kind": "fsdp"|"dtensor", "dest": URI, "ref": PATH}: trains
  an FSDP2 model with Adam two steps (or builds DTensors) and saves the state
  through cairn.torch.dcp.Writer; rank 0 writes the full state (gathered) to
  "ref" with torch.save, for the loaders to compare with.
- {"op": "load", "kind": ..., "src": URI, "ref": PATH}: a fresh model (or
  DTensors of other placements) loaded through Reader; the gathered full
  state must equal "ref" bit for bit.
- {"op": "manager", "dest": EXPERIMENT, "losses": [...]}: one dcp.save per
  loss into a CheckpointManager (rank 0 opens it; num_to_keep=2, best by
  loss); rank 0 writes the names kept to EXPERIMENT + ".json".
- {"op": "async", "dest": URI, "process": bool}: dcp.async_save of the
  DTensors through the Writer (thread or process executor), waited for.
"""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any

import cairn
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from cairn.torch.dcp import Reader, Writer
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import torch

warnings.filterwarnings("ignore")


def _mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    # Odd sizes: shards of unequal length on every world size tried.
    return torch.nn.Sequential(
        torch.nn.Linear(13, 30), torch.nn.ReLU(), torch.nn.Linear(30, 7), torch.nn.Tanh()
    )


def _fsdp(world: int, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    mesh = init_device_mesh("cpu", (world,))
    model = _mlp(seed)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def _full(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """The whole state, gathered to rank 0 (empty elsewhere)."""
    model_sd, opt_sd = get_state_dict(
        model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    return {"model": model_sd, "optim": opt_sd}


def _dtensors(world: int, loading: bool) -> dict[str, Any]:
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(1)
    a = torch.randn(37, 11, generator=g)
    b = torch.randn(5, 23, generator=g).to(torch.bfloat16)
    r = torch.arange(17, dtype=torch.int64)
    if loading:  # other placements, zeroed: only the load can fill them
        a, b, r = torch.zeros_like(a), torch.zeros_like(b), torch.zeros_like(r)
        pa, pb, pr = [Shard(1)], [Shard(0)], [Shard(0)]
    else:
        pa, pb, pr = [Shard(0)], [Shard(1)], [Replicate()]
    return {
        "dt": {
            "a": distribute_tensor(a, mesh, pa),
            "b": distribute_tensor(b, mesh, pb),
            "r": distribute_tensor(r, mesh, pr),
        },
        "step": 0 if loading else 7,
        "note": "" if loading else "saved by DCP through Cairn",
        "blob": b"" if loading else b"\x00raw bytes\xff",
    }


def _dtensor_full(state: dict[str, Any]) -> dict[str, Any]:
    out = {k: v.full_tensor() for k, v in state["dt"].items()}
    return {"dt": out, "step": state["step"], "note": state["note"], "blob": state["blob"]}


def _bits(x: Any) -> Any:
    """x with every tensor as its dtype, shape and raw bytes (bitwise compare)."""
    if isinstance(x, torch.Tensor):
        t = x.detach().contiguous()
        return (str(t.dtype), tuple(t.shape), t.reshape(-1).view(torch.uint8).tolist())
    if isinstance(x, dict):
        return {k: _bits(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_bits(v) for v in x]
    return x


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, rank: int) -> None:
    for step in range(2):
        g = torch.Generator().manual_seed(100 * rank + step)
        loss = model(torch.randn(4, 13, generator=g)).square().sum()
        loss.backward()
        opt.step()
        opt.zero_grad()


def run(step: dict[str, Any], rank: int, world: int) -> None:
    op = step["op"]
    if op == "save" and step["kind"] == "fsdp":
        model, opt = _fsdp(world, seed=0)
        _train(model, opt, rank)
        model_sd, opt_sd = get_state_dict(model, opt)
        dcp.save({"model": model_sd, "optim": opt_sd}, storage_writer=Writer(step["dest"]))
        full = _full(model, opt)
        if rank == 0:
            torch.save(full, step["ref"])
    elif op == "load" and step["kind"] == "fsdp":
        model, opt = _fsdp(world, seed=5)  # other weights, no optimizer state yet
        model_sd, opt_sd = get_state_dict(model, opt)
        state = {"model": model_sd, "optim": opt_sd}
        dcp.load(state, storage_reader=Reader(step["src"]))
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        full = _full(model, opt)
        if rank == 0:
            ref = torch.load(step["ref"], weights_only=False)
            assert _bits(full) == _bits(ref), f"rank {rank}: the loaded state differs"
    elif op == "save" and step["kind"] == "dtensor":
        state = _dtensors(world, loading=False)
        dcp.save(state, storage_writer=Writer(step["dest"]))
        full = _dtensor_full(state)
        if rank == 0:
            torch.save(full, step["ref"])
    elif op == "load" and step["kind"] == "dtensor":
        state = _dtensors(world, loading=True)
        dcp.load(state, storage_reader=Reader(step["src"]))
        full = _dtensor_full(state)
        ref = torch.load(step["ref"], weights_only=False)
        assert _bits(full) == _bits(ref), f"rank {rank}: the loaded DTensors differ"
    elif op == "manager":
        config = cairn.CheckpointConfig(
            num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min"
        )
        manager = cairn.CheckpointManager(step["dest"], config=config) if rank == 0 else None
        model, opt = _fsdp(world, seed=0)
        for loss in step["losses"]:
            _train(model, opt, rank)
            model_sd, opt_sd = get_state_dict(model, opt)
            writer = Writer(manager, metrics={"loss": loss})
            dcp.save({"model": model_sd, "optim": opt_sd}, storage_writer=writer)
            if rank == 0:
                assert writer.record is not None and writer.record.metrics == {"loss": loss}
        if manager is not None:
            kept = [r.name for r in manager.best()]
            manager.close()
            with open(step["dest"] + ".json", "w") as f:
                json.dump(kept, f)
    elif op == "async":
        state = _dtensors(world, loading=False)
        kind = AsyncCheckpointerType.PROCESS if step["process"] else AsyncCheckpointerType.THREAD
        future = dcp.async_save(
            state, storage_writer=Writer(step["dest"]), async_checkpointer_type=kind
        )
        future.result()
        if rank == 0:
            assert cairn.Checkpoint(step["dest"]).is_committed(), step
    else:
        raise ValueError(f"unknown step {step}")


def main() -> None:
    config = json.loads(sys.argv[1])
    rank, world = int(sys.argv[2]), int(config["world"])
    dist.init_process_group(
        "gloo", init_method="file://" + config["store"], rank=rank, world_size=world
    )
    try:
        for step in config["steps"]:
            run(step, rank, world)
            dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
