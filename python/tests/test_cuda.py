"""CUDA tensors through the Python package (docs/python.md, "CUDA tensors").

With a Cairn built with CUDA (``cairn.CUDA``) on a machine with a GPU, CUDA
tensors cross to the C++ engine by device address: saves copy them with the
GPU's copy engines after the work queued on the current stream, loads read
the file into them through pinned bounce buffers. Without a GPU only the
refusal of a build without CUDA is tested here (scripts/gpu-check.sh runs
the rest on a GPU machine).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import cairn
import pytest
from cairn import _cairn

torch = pytest.importorskip("torch")

HERE = pathlib.Path(__file__).parent
gpu = pytest.mark.skipif(
    not (cairn.CUDA and torch.cuda.is_available()), reason="needs a Cairn built with CUDA and a GPU"
)


def test_a_build_without_cuda_refuses_device_tensors_by_name(tmp_path: pathlib.Path) -> None:
    if cairn.CUDA:
        pytest.skip("this Cairn was built with CUDA")
    # What cairn.save hands over for a CUDA tensor in a build with CUDA.
    with pytest.raises(cairn.InvalidArgumentError, match=r'tensor "w": on cuda:0.*without CUDA'):
        _cairn.save_tensors(
            [("w", "F32", (1,), 4096, 4, 0, 0)], str(tmp_path / "x.safetensors"), None, {}, True
        )
    assert not (tmp_path / "x.safetensors").exists()


def test_a_save_asks_each_cuda_device_for_its_current_stream_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cairn import _tensors

    asked = []

    class Stream:
        def __init__(self, index: int) -> None:
            self.cuda_stream = 1000 + index

    def current_stream(index: int) -> Stream:
        asked.append(index)
        return Stream(index)

    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    # What _describe gives for CUDA tensors: (..., keep-alive, device index).
    flat = {f"t{i}": (f"t{i}", "F32", (1,), 4096 * (i + 1), 4, None, i % 2) for i in range(6)}
    described, _, _ = _tensors._describe_all(flat, lambda name, entry: entry)
    assert sorted(asked) == [0, 1]
    assert described[0] == ("t0", "F32", (1,), 4096, 4, 0, 1000)
    assert described[3] == ("t3", "F32", (1,), 4096 * 4, 4, 1, 1001)


def _state(device: str) -> dict[str, Any]:
    g = torch.Generator().manual_seed(3)
    state = {
        "f32": torch.randn(1000, 37, generator=g),
        "bf16": torch.randn(513, generator=g).to(torch.bfloat16),
        "f16": torch.randn(7, 9, generator=g).half(),
        "i64": torch.randint(-(2**40), 2**40, (33,), generator=g),
        "u8": torch.randint(0, 255, (4097,), generator=g, dtype=torch.uint8),
        "bool": torch.rand(100, generator=g) > 0.5,
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.empty(0, 4),
    }
    return {k: v.to(device) for k, v in state.items()}


@gpu
def test_cuda_tensors_save_the_same_bytes_as_their_host_copies(tmp_path: pathlib.Path) -> None:
    state = _state("cuda")
    cairn.save({"model": state}, tmp_path / "gpu.safetensors", metadata={"step": 4})
    cairn.save(
        {"model": {k: v.cpu() for k, v in state.items()}},
        tmp_path / "cpu.safetensors",
        metadata={"step": 4},
    )
    assert (tmp_path / "gpu.safetensors").read_bytes() == (
        tmp_path / "cpu.safetensors"
    ).read_bytes()


@gpu
def test_a_load_onto_a_cuda_device_makes_the_tensors_there(tmp_path: pathlib.Path) -> None:
    state = _state("cpu")
    cairn.save(state, tmp_path / "s.safetensors")
    for device in ("cuda", "cuda:0", torch.device("cuda", 0)):
        loaded = cairn.load(tmp_path / "s.safetensors", device=device)
        assert sorted(loaded) == sorted(state)
        for name, t in loaded.items():
            assert t.device.type == "cuda" and t.device.index == 0, name
            assert t.dtype == state[name].dtype and t.shape == state[name].shape, name
            assert torch.equal(t.cpu(), state[name]), name
    # A damaged file is an error naming it, as for host loads.
    data = bytearray((tmp_path / "s.safetensors").read_bytes())
    (tmp_path / "bad.safetensors").write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(cairn.CorruptionError, match="bad.safetensors"):
        cairn.load(tmp_path / "bad.safetensors", device="cuda")


@gpu
def test_a_save_copies_after_the_work_queued_on_the_current_stream(
    tmp_path: pathlib.Path,
) -> None:
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.ones(64 << 20, device="cuda")  # 256 MiB: the products take a while
        for _ in range(20):
            x.mul_(1.0001)
        x.add_(1)
        # Queued, maybe not yet run: the save must see their result.
        cairn.save({"x": x}, tmp_path / "x.safetensors")
        torch.cuda.current_stream().synchronize()
    assert torch.equal(cairn.load(tmp_path / "x.safetensors")["x"], x.cpu())


@gpu
def test_an_async_save_of_cuda_tensors_lets_them_change_once_it_returns(
    tmp_path: pathlib.Path,
) -> None:
    import cairn.torch as ct

    state = _state("cuda")
    want = {k: v.cpu() for k, v in state.items()}
    manager = cairn.CheckpointManager(tmp_path / "exp", "run")
    with ct.AsyncSaver() as saver:
        saver.reserve(state)
        for step in range(3):
            handle = saver.save(state, manager, metrics={"step": step})
            for t in state.values():  # the next step changes them at once
                if t.dtype == torch.bool:
                    t.logical_not_()
                else:
                    t.add_(1)
            record = handle.wait()
            assert record is not None
            with handle.checkpoint.as_directory() as d:
                saved = cairn.load(pathlib.Path(d) / "state.safetensors")
            for name, t in saved.items():
                assert torch.equal(t, want[name]), (step, name)
            want = {k: v.cpu() for k, v in state.items()}
        # The GPU copied into the saver's pinned staging (no tensor.cpu()).
        assert saver.stats()["staging_pinned_bytes"] > 0
    manager.close()


@gpu
def test_a_manager_restores_cuda_tensors_in_place_bit_for_bit(tmp_path: pathlib.Path) -> None:
    import cairn.torch as ct

    state = _state("cuda")
    with ct.StateCheckpointManager(tmp_path / "m", max_to_keep=2) as m:
        m.save(7, state)
        target = {k: torch.zeros_like(v) for k, v in state.items()}
        before = {k: v.data_ptr() for k, v in target.items()}
        assert m.restore(target) == 7
        for name, t in target.items():
            assert t.data_ptr() == before[name], name  # in place
            assert torch.equal(t, state[name]), name
        # assert_consumed: a shape that differs is named, nothing written.
        target["f32"] = torch.zeros(1000, 36, device="cuda")
        target["u8"].fill_(9)
        with pytest.raises(cairn.InvalidArgumentError, match="f32"):
            m.restore(target)
        assert bool((target["u8"] == 9).all())


@gpu
def test_cuda_shards_saved_by_two_ranks_load_into_three_cuda_shards(
    tmp_path: pathlib.Path,
) -> None:
    import cairn.torch as ct

    g = torch.Generator().manual_seed(5)
    full = torch.randn(1001, 64, generator=g).cuda()
    bias = torch.randn(64, generator=g).cuda()
    dest = tmp_path / "ckpt"
    reports = []
    for rank in range(2):
        offsets, shape = ct.even_split(full.shape, 0, rank, 2)
        part = full[offsets[0] : offsets[0] + shape[0]].contiguous()
        reports.append(
            ct.save_sharded(dest, rank, {"w": ct.Shard(part, full.shape, offsets), "b": bias})
        )
    ct.commit_sharded(dest, reports)
    for rank in range(3):
        offsets, shape = ct.even_split(full.shape, 0, rank, 3)
        mine = torch.empty(tuple(shape), device="cuda")
        b = torch.empty(64, device="cuda")
        ct.load_sharded(dest, {"w": ct.Shard(mine, full.shape, offsets), "b": b})
        assert torch.equal(mine, full[offsets[0] : offsets[0] + shape[0]]), rank
        assert torch.equal(b, bias), rank


@gpu
def test_a_gpu_training_run_killed_once_ends_as_a_run_that_never_failed(
    tmp_path: pathlib.Path,
) -> None:
    workers = torch.cuda.device_count()  # NCCL takes one GPU per rank
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8")

    def run(name: str, *kill: str) -> dict[str, Any]:
        out = subprocess.run(
            [
                sys.executable,
                str(HERE / "gpu_train.py"),
                str(tmp_path / name),
                str(workers),
                "5",
                *kill,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, out.stderr[-4000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    clean, failed = run("clean"), run("failed", "2")
    assert [row["epoch"] for row in failed["history"]] == [0, 1, 2, 3, 4]
    assert {row["backend"] for row in failed["history"]} == {"nccl"}
    assert {row["group"] for row in failed["history"]} == {float(workers)}
    assert failed["history"][-1]["attempt"] == 1  # it did restart
    want = cairn.load(pathlib.Path(clean["checkpoint"]) / "state.safetensors")
    got = cairn.load(pathlib.Path(failed["checkpoint"]) / "state.safetensors")
    assert sorted(want) == sorted(got)
    for name in want:
        assert torch.equal(want[name], got[name]), name
