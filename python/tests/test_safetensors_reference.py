"""Cairn's safetensors files against the reference library (PyPI ``safetensors``).

Every file Cairn writes (``cairn.save`` and a ``StateCheckpointManager``'s
checkpoints, both the C++ engine's writer) loads in the reference library
with the same tensors, dtype, shape and bytes, and keeps the header's
string metadata; every file the reference library writes loads in Cairn the
same way. Over every dtype both sides have, scalars, empty tensors and
metadata. Bytes are compared, not values, so NaNs and float8 compare too.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import cairn
import cairn.torch
import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file as np_load_file
from safetensors.numpy import save_file as np_save_file
from safetensors.torch import load_file as pt_load_file
from safetensors.torch import save_file as pt_save_file
from test_tensors import NUMPY_DTYPES, TORCH_DTYPES, bits, torch_values

import torch

# A scalar, empty tensors of rank 1 and 2, and ordinary ones.
SHAPES = [(), (0,), (3, 0), (7,), (2, 3, 4)]


def _numpy_array(dtype: Any, shape: tuple[int, ...], seed: int) -> np.ndarray:
    count = int(np.prod(shape)) if shape else 1
    size = np.dtype(dtype).itemsize
    raw = np.random.default_rng(seed).integers(0, 256, count * size, dtype=np.uint8)
    if dtype == np.bool_:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def _torch_state() -> dict[str, Any]:
    state = {}
    for i, dtype in enumerate(TORCH_DTYPES):
        for j, shape in enumerate(SHAPES):
            name = f"{str(dtype).removeprefix('torch.')}.{'x'.join(map(str, shape)) or 'scalar'}"
            state[name] = torch_values(dtype, shape, 100 * i + j)
    state["名前.ünïcode"] = torch.arange(5, dtype=torch.float32)
    return state


def _numpy_state() -> dict[str, np.ndarray]:
    state = {}
    for i, dtype in enumerate(NUMPY_DTYPES):
        for j, shape in enumerate(SHAPES):
            name = f"{np.dtype(dtype).name}.{'x'.join(map(str, shape)) or 'scalar'}"
            state[name] = _numpy_array(dtype, shape, 100 * i + j)
    return state


def _same_torch(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert sorted(a) == sorted(b)
    for name, x in a.items():
        y = b[name]
        assert y.dtype == x.dtype, name
        assert tuple(y.shape) == tuple(x.shape), name
        assert x.numel() == 0 or bits(y) == bits(x), name  # empty: the shapes say all


def _same_numpy(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for name, x in a.items():
        y = b[name]
        assert y.dtype == x.dtype, name
        assert y.shape == x.shape, name
        assert y.tobytes() == x.tobytes(), name


def test_every_torch_tensor_cairn_writes_loads_in_the_reference_library(
    tmp_path: pathlib.Path,
) -> None:
    state = _torch_state()
    path = tmp_path / "cairn.safetensors"
    metadata = {"step": 3, "loss": 0.25, "name": "run-ä"}
    cairn.save(state, path, metadata=metadata)

    _same_torch(state, pt_load_file(str(path)))
    with safe_open(str(path), framework="pt") as f:
        header = f.metadata()
        for name in f.keys():
            assert f.get_slice(name).get_shape() == list(state[name].shape), name
    assert header["format"] == "pt"
    assert json.loads(header["cairn.metadata"]) == metadata
    assert cairn.load_metadata(path) == metadata


def test_every_numpy_array_cairn_writes_loads_in_the_reference_library(
    tmp_path: pathlib.Path,
) -> None:
    state = _numpy_state()
    path = tmp_path / "cairn.safetensors"
    cairn.save(state, path)
    _same_numpy(state, np_load_file(str(path)))
    with safe_open(str(path), framework="np") as f:
        assert f.metadata() == {"format": "np"}


def test_every_file_the_reference_library_writes_loads_in_cairn(tmp_path: pathlib.Path) -> None:
    state = _torch_state()
    path = tmp_path / "reference.safetensors"
    pt_save_file(state, str(path), metadata={"format": "pt", "note": "from the reference"})
    for mmap in (True, False):
        _same_torch(state, cairn.load(path, mmap=mmap))
    # Metadata that is not Cairn's: no JSON metadata, and the file loads.
    assert cairn.load_metadata(path) == {}

    arrays = _numpy_state()
    np_path = tmp_path / "reference-np.safetensors"
    np_save_file(arrays, str(np_path))
    _same_numpy(arrays, cairn.load(np_path, framework="np"))
    _same_torch(
        {k: torch.from_numpy(v.copy()) for k, v in arrays.items()},
        cairn.load(np_path),
    )


def test_a_file_of_nothing_but_empty_tensors_round_trips_both_ways(tmp_path: pathlib.Path) -> None:
    state = {"a": torch.empty(0, dtype=torch.float32), "b": torch.empty(4, 0, dtype=torch.int64)}
    ours = tmp_path / "ours.safetensors"
    cairn.save(state, ours)
    _same_torch(state, pt_load_file(str(ours)))
    theirs = tmp_path / "theirs.safetensors"
    pt_save_file(state, str(theirs))
    _same_torch(state, cairn.load(theirs))
    # And an empty state dict.
    cairn.save({}, tmp_path / "none.safetensors")
    assert pt_load_file(str(tmp_path / "none.safetensors")) == {}
    pt_save_file({}, str(tmp_path / "none-theirs.safetensors"))
    assert cairn.load(tmp_path / "none-theirs.safetensors") == {}


def test_a_state_checkpoint_managers_file_loads_in_the_reference_library(
    tmp_path: pathlib.Path,
) -> None:
    model = torch.nn.Linear(8, 4).to(torch.bfloat16)
    state = dict(model.state_dict())
    with cairn.torch.StateCheckpointManager(tmp_path / "run") as manager:
        record = manager.save(7, state, metadata={"epoch": 2})
        assert record is not None
    file = tmp_path / "run" / record.name / "state.safetensors"
    loaded = pt_load_file(str(file))
    for name, value in state.items():
        assert torch.equal(loaded[name], value), name
    with safe_open(str(file), framework="pt") as f:
        assert json.loads(f.metadata()["cairn.metadata"])["epoch"] == 2


def test_sharded_saves_rank_files_load_in_the_reference_library(tmp_path: pathlib.Path) -> None:
    # Each rank's file holds that rank's boxes under the tensors' names; the
    # boxes' places in the global tensors are Cairn's metadata, a string.
    full = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    dest = tmp_path / "sharded"
    reports = []
    for rank in range(2):
        offsets, shape = cairn.torch.even_split(full.shape, 0, rank, 2)
        box = full[offsets[0] : offsets[0] + shape[0]].clone()
        reports.append(
            cairn.torch.save_sharded(
                dest, rank, {"w": cairn.torch.Shard(box, full.shape, offsets), "b": full[0]}
            )
        )
    cairn.torch.commit_sharded(dest, reports)
    for rank in range(2):
        loaded = pt_load_file(str(dest / f"rank_{rank:05d}.safetensors"))
        assert torch.equal(loaded["w"], full[3 * rank : 3 * rank + 3]), rank
        assert torch.equal(loaded["b"], full[0]), rank
        with safe_open(str(dest / f"rank_{rank:05d}.safetensors"), framework="pt") as f:
            assert all(isinstance(v, str) for v in f.metadata().values())


def test_a_training_state_file_loads_in_the_reference_library(tmp_path: pathlib.Path) -> None:
    # save_state's file: the model's and optimizer's tensors under flattened
    # names; the rest (param groups, python numbers) in string metadata.
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    path = tmp_path / "state.safetensors"
    cairn.torch.save_state(path, model, opt)
    loaded = pt_load_file(str(path))
    for name, value in model.state_dict().items():
        assert torch.equal(loaded[f"model.{name}"], value), name
    for pid, per_param in opt.state_dict()["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(loaded[f"optimizer.state.{pid}.{key}"], per_param[key]), (pid, key)
    with safe_open(str(path), framework="pt") as f:
        assert all(isinstance(v, str) for v in f.metadata().values())
