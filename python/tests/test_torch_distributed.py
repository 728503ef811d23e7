"""cairn.torch.save_distributed / load_distributed: DTensor and FSDP2 state
saved by real gloo process groups (one OS process per rank, a file://
rendezvous in tmp_path) and loaded back by other world sizes and meshes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.fsdp")

import cairn  # noqa: E402

WORKER = Path(__file__).with_name("dist_state.py")


def run_ranks(kind: str, phase: str, world: int, mesh: str, folder: Path) -> None:
    """Runs `world` ranks of dist_state.py and waits for each (bounded)."""
    env = dict(os.environ)
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), kind, phase, str(r), str(world), mesh, str(folder)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for r in range(world)
    ]
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=240)
            outputs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0 and "DONE" in out, f"{kind} {phase} rank {r}/{world}:\n{out}"


def layout(folder: Path) -> dict:
    manifest = json.loads(cairn.Checkpoint(str(folder))._impl.manifest_json())
    return manifest["layout"]["tensors"]


def test_fsdp2_adam_saved_by_4_loads_into_2_and_1(tmp_path: Path) -> None:
    run_ranks("fsdp", "save", 4, "4", tmp_path)
    tensors = layout(tmp_path / "ckpt")
    # Each rank wrote its own rows only: 7 rows over 4 ranks are 2, 2, 2, 1;
    # 5 rows are 2, 2, 1 (the fourth rank holds none).
    assert [s["shape"][0] for s in tensors["model.0.weight"]["shards"]] == [2, 2, 2, 1]
    assert [s["rank"] for s in tensors["model.2.weight"]["shards"]] == [0, 1, 2]
    assert [s["rank"] for s in tensors["optim.state.0.weight.exp_avg"]["shards"]] == [0, 1, 2, 3]
    # The optimizer's step (a plain tensor on every rank) is written once.
    assert [s["rank"] for s in tensors["optim.state.0.weight.step"]["shards"]] == [0]
    assert cairn.Checkpoint(str(tmp_path / "ckpt")).verify() == []
    run_ranks("fsdp", "load", 2, "2", tmp_path)  # compares with the full state, then trains
    run_ranks("fsdp", "load", 1, "plain", tmp_path)  # also the error paths


def test_fsdp2_saved_by_1_loads_into_4(tmp_path: Path) -> None:
    run_ranks("fsdp", "save", 1, "plain", tmp_path)  # a model that is not sharded
    assert [s["rank"] for s in layout(tmp_path / "ckpt")["model.0.weight"]["shards"]] == [0]
    run_ranks("fsdp", "load", 4, "4", tmp_path)


def test_dtensor_2d_mesh_to_1d_and_plain(tmp_path: Path) -> None:
    run_ranks("dtensor", "save", 4, "2x2", tmp_path)  # also: one rank's bad placement
    tensors = layout(tmp_path / "ckpt")
    shapes = {"t.a": [7, 5], "t.b": [6, 9], "t.c": [9, 4], "t.d": [11], "t.e": [3, 3]}
    for name, shape in shapes.items():
        shards = tensors[name]["shards"]
        # Replicated boxes are written once: the shards hold each element once.
        assert sum(math.prod(s["shape"]) for s in shards) == math.prod(shape), name
    assert len(tensors["t.e"]["shards"]) == 1  # replicated over both mesh dimensions
    assert {s["rank"] for s in tensors["t.a"]["shards"]} == {0, 2}  # coordinate 0 on dim 1
    run_ranks("dtensor", "load", 2, "2", tmp_path)
    run_ranks("dtensor", "load", 1, "plain", tmp_path)


def test_dtensor_1d_mesh_to_2d(tmp_path: Path) -> None:
    run_ranks("dtensor", "save", 2, "2", tmp_path)
    run_ranks("dtensor", "load", 4, "2x2", tmp_path)


def test_load_distributed_refuses_other_checkpoints(tmp_path: Path) -> None:
    import cairn.torch as ct

    dest = tmp_path / "plain"
    report = ct.save_sharded(str(dest), 0, {"w": torch.ones(2)})
    ct.commit_sharded(str(dest), [report])
    with pytest.raises(cairn.CorruptionError, match="not written by save_distributed"):
        ct.load_distributed(str(dest), {"w": torch.zeros(2)})
    with pytest.raises(TypeError, match="state_dict"):
        ct.load_distributed(str(dest), [torch.zeros(2)])  # type: ignore[arg-type]
