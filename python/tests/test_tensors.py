"""cairn.save / cairn.load: round trips, files shared with the C++ side, and
bad input that must be a clear cairn error, never a crash."""

from __future__ import annotations

import os
import pathlib
import subprocess

import cairn
import cairn._tensors
import numpy as np
import pytest

import torch

TORCH_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
]
TORCH_DTYPES += [
    getattr(torch, n)
    for n in ("uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2")
    if hasattr(torch, n)
]
NUMPY_DTYPES = [
    np.bool_,
    np.uint8,
    np.int8,
    np.int16,
    np.uint16,
    np.float16,
    np.int32,
    np.uint32,
    np.float32,
    np.float64,
    np.int64,
    np.uint64,
]


def torch_values(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Every bit pattern matters: random bytes viewed as `dtype` (NaNs too)."""
    g = torch.Generator().manual_seed(seed)
    n = int(np.prod(shape)) if shape else 1
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        return (raw % 2).to(torch.bool).reshape(shape)
    return raw.view(dtype).reshape(shape)


def bits(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.fixture(params=["cpp", "python"])
def torch_code(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test through both ways torch tensors are described and made.

    "cpp": cairn._cairn_torch (built for the interpreter's torch); "python":
    the pure-Python path every other torch takes.
    """
    if request.param == "python":
        monkeypatch.setattr(cairn._tensors, "_helpers", None)
    elif cairn._tensors._torch_helpers() is None:
        pytest.skip("cairn._cairn_torch is not built for this torch")
    return request.param


def test_the_cpp_torch_helpers_are_built_for_the_interpreters_torch() -> None:
    # The CMake build makes cairn._cairn_torch for the torch of the Python it
    # builds for (the project venv's, whose LibTorch the adapter uses too).
    helpers = cairn._tensors._torch_helpers()
    assert helpers is not None, f"cairn._cairn_torch was not built for torch {torch.__version__}"
    assert torch.__version__.startswith(helpers.torch_version)


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (0, 3), (7,), (3, 5, 2)], ids=str)
@pytest.mark.parametrize("mmap", [True, False], ids=["mapped", "copied"])
def test_torch_tensors_round_trip_bit_for_bit(
    tmp_path: pathlib.Path, dtype: torch.dtype, shape: tuple[int, ...], mmap: bool, torch_code: str
) -> None:
    t = torch_values(dtype, shape, seed=len(shape))
    cairn.save({"t": t}, tmp_path / "s.safetensors")
    got = cairn.load(tmp_path / "s.safetensors", mmap=mmap)["t"]
    assert got.dtype == dtype and tuple(got.shape) == shape
    assert bits(got) == bits(t)


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("mmap", [True, False], ids=["mapped", "copied"])
def test_numpy_arrays_round_trip_bit_for_bit(
    tmp_path: pathlib.Path, dtype: type, mmap: bool
) -> None:
    rng = np.random.default_rng(3)
    state = {}
    for i, shape in enumerate([(), (0,), (4, 0), (9,), (2, 3, 4)]):
        raw = rng.integers(
            0, 256, size=int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8
        )
        a = raw.view(np.uint8 if dtype is np.bool_ else dtype).reshape(shape)
        state[f"a{i}"] = (a % 2).astype(np.bool_) if dtype is np.bool_ else a
    cairn.save(state, tmp_path / "s.safetensors")
    got = cairn.load(tmp_path / "s.safetensors", mmap=mmap, framework="np")
    assert sorted(got) == sorted(state)
    for name, a in state.items():
        assert got[name].dtype == a.dtype and got[name].shape == a.shape
        assert got[name].tobytes() == a.tobytes()


def test_a_file_says_pt_when_it_holds_a_torch_tensor_and_np_otherwise(
    tmp_path: pathlib.Path, torch_code: str
) -> None:
    cases = [
        ({"t": torch.ones(2)}, "pt"),
        ({"a": np.ones(2)}, "np"),
        ({"a": np.ones(2), "t": torch.ones(2)}, "pt"),
        ({}, "pt"),
    ]
    for state, fmt in cases:
        cairn.save(state, tmp_path / "s.safetensors")
        header = cairn._cairn.read_tensor_header(str(tmp_path / "s.safetensors"))
        assert header[2].get("format") == fmt, sorted(state)


def test_nested_dicts_are_flattened_with_dots_and_metadata_comes_back(
    tmp_path: pathlib.Path,
) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    state = {"model": model.state_dict(), "extra": {"ids": np.arange(3)}}
    cairn.save(state, tmp_path / "s.safetensors", metadata={"epoch": 2, "lr": [0.1, 0.01]})
    got = cairn.load(tmp_path / "s.safetensors")
    assert sorted(got) == sorted(
        ["model.0.weight", "model.0.bias", "model.2.weight", "model.2.bias", "extra.ids"]
    )
    restored = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    restored.load_state_dict(
        {k[len("model.") :]: v for k, v in got.items() if k.startswith("model.")}
    )
    for a, b in zip(model.parameters(), restored.parameters()):
        assert torch.equal(a, b)
    assert cairn.load_metadata(tmp_path / "s.safetensors") == {"epoch": 2, "lr": [0.1, 0.01]}
    assert cairn.flatten_state_dict({"a": {"b": {"c": 1}}}) == {"a.b.c": 1}


def test_ten_thousand_tensors_round_trip(tmp_path: pathlib.Path, torch_code: str) -> None:
    state = {f"layer{i}.w": torch.full((i % 7 + 1,), float(i)) for i in range(10_000)}
    cairn.save(state, tmp_path / "s.safetensors")
    got = cairn.load(tmp_path / "s.safetensors", mmap=False)
    assert len(got) == 10_000
    for name, t in state.items():
        assert torch.equal(got[name], t), name


def test_a_mapped_load_views_the_file_and_writes_stay_in_the_process(
    tmp_path: pathlib.Path, torch_code: str
) -> None:
    path = tmp_path / "s.safetensors"
    cairn.save({"w": torch.arange(6, dtype=torch.float32)}, path)
    before = path.read_bytes()
    w = cairn.load(path)["w"]
    w += 100  # copy-on-write: never a crash on a read-only page, never the file
    assert w[0].item() == 100.0
    assert path.read_bytes() == before
    assert cairn.load(path)["w"][0].item() == 0.0
    # The tensors keep the mapping alive after everything else is gone.
    views = cairn.load(path)
    import gc

    gc.collect()
    assert views["w"].sum().item() == 15.0


def test_files_in_a_store_save_and_load_by_uri(tmp_path: pathlib.Path) -> None:
    uri = "memory://tensors-test/run/model.safetensors"
    cairn.save({"x": np.arange(4, dtype=np.int32)}, uri, metadata={"step": 9})
    assert cairn.load(uri, framework="np")["x"].tolist() == [0, 1, 2, 3]
    assert cairn.load_metadata(uri) == {"step": 9}
    uri = (tmp_path / "f.safetensors").as_uri()
    cairn.save({"y": torch.ones(2)}, uri)
    assert cairn.load(uri)["y"].tolist() == [1.0, 1.0]
    with pytest.raises(cairn.InvalidArgumentError, match="memory://bucket-only"):
        cairn.save({"x": torch.ones(1)}, "memory://bucket-only/")


# ---- the same files as the C++ side ----------------------------------------------------


def interop_tool() -> pathlib.Path:
    """The C++ half (tests/engine/interop_tool.cc) in the build the package came from."""
    build = pathlib.Path(cairn.__file__).resolve().parents[2]
    tool = build / "tests" / "engine" / "safetensors_interop_tool"
    if not tool.exists():
        pytest.skip("the C++ interop tool is built with Cairn's tests, not with this package")
    return tool


def common_reference() -> dict[str, object]:
    """interop_tool's reference state without float8, as the package writes it."""
    return {
        "f32": np.arange(6, dtype=np.float32).reshape(2, 3) * np.float32(0.5) - np.float32(1),
        "f64": np.arange(4, dtype=np.float64) / 3.0,
        "f16": np.array([0x3C00, 0xC000, 0x7BFF], dtype=np.uint16).view(np.float16),
        "bf16": torch.tensor([0x3F80, 0x4049], dtype=torch.int16).view(torch.bfloat16),
        "i8": np.array([-3, -2, -1, 0, 1, 2], dtype=np.int8).reshape(2, 3),
        "u8": np.array([250, 251, 252, 253, 254], dtype=np.uint8),
        "i16": np.array([-300, 300], dtype=np.int16),
        "u16": np.array([65535, 1], dtype=np.uint16),
        "i32": np.array([-70000, 70000], dtype=np.int32),
        "u32": np.array([4000000000], dtype=np.uint32),
        "i64": np.array([-(1 << 40), 5], dtype=np.int64),
        "u64": np.array([1 << 63], dtype=np.uint64),
        "bool": np.array([True, False, True]),
        "scalar": np.array(7.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }


def test_tensors_at_offsets_their_dtype_cannot_be_read_at_are_copied(
    tmp_path: pathlib.Path, torch_code: str
) -> None:
    # Another writer may place a tensor at any byte offset: a float32 at
    # offset 1, after a one-byte tensor. Such a tensor comes back as a copy;
    # the aligned ones view the data.
    import json
    import struct

    values = np.arange(5, dtype=np.float32)
    header = {
        "a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
        "b": {"dtype": "F32", "shape": [5], "data_offsets": [1, 21]},
        "c": {"dtype": "U8", "shape": [3], "data_offsets": [21, 24]},
    }
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path = tmp_path / "foreign.safetensors"
    path.write_bytes(
        struct.pack("<Q", len(text)) + text + b"\x07" + values.tobytes() + b"\x01\x02\x03"
    )
    for mmap in (True, False):
        got = cairn.load(path, mmap=mmap)
        assert got["a"].tolist() == [7] and got["c"].tolist() == [1, 2, 3]
        assert got["b"].dtype == torch.float32 and got["b"].tolist() == values.tolist()


@pytest.mark.parametrize("mmap", [True, False], ids=["mapped", "copied"])
def test_loaded_tensors_go_through_torch_save_pickle_and_deepcopy(
    tmp_path: pathlib.Path, mmap: bool, torch_code: str
) -> None:
    # Tensors of several dtypes from one file: torch.save refuses tensors
    # that view one storage as different types, and would write all of a
    # shared storage for any one tensor; each loaded tensor has its own.
    import copy
    import io
    import pickle

    state = {
        "w": torch_values(torch.float32, (64, 64), 1),
        "b": torch_values(torch.bfloat16, (64,), 2),
        "step": torch.tensor(7),
        "mask": torch_values(torch.bool, (5,), 3),
    }
    cairn.save(state, tmp_path / "s.safetensors")
    got = cairn.load(tmp_path / "s.safetensors", mmap=mmap)
    buffer = io.BytesIO()
    torch.save(got, buffer)
    buffer.seek(0)
    again = torch.load(buffer)
    for name, t in state.items():
        assert again[name].dtype == t.dtype and bits(again[name]) == bits(t)
        assert bits(pickle.loads(pickle.dumps(got[name]))) == bits(t)
        assert bits(copy.deepcopy(got[name])) == bits(t)
    one = io.BytesIO()
    torch.save(got["step"], one)
    assert len(one.getvalue()) < 4096  # its 8 bytes, not the file's 16 KiB


def test_a_load_or_save_leaves_the_garbage_collector_as_it_found_it(
    tmp_path: pathlib.Path, torch_code: str
) -> None:
    import gc

    path = tmp_path / "s.safetensors"
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            cairn.save({"w": torch.ones(3)}, path)
            assert cairn.load(path)["w"].sum().item() == 3.0
            with pytest.raises(cairn.InvalidArgumentError):
                cairn.save({"w": "text"}, path)
            with pytest.raises(cairn.NotFoundError):
                cairn.load(tmp_path / "missing.safetensors")
            assert gc.isenabled() == enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_python_and_cpp_write_byte_identical_files_and_read_each_others(
    tmp_path: pathlib.Path,
) -> None:
    tool = interop_tool()
    ours, theirs = tmp_path / "python.safetensors", tmp_path / "cpp.safetensors"
    cairn.save(common_reference(), ours, metadata={"epoch": 3, "step": 100})
    subprocess.run([tool, "write-common", theirs], check=True)
    assert ours.read_bytes() == theirs.read_bytes()
    subprocess.run([tool, "check-common", ours], check=True)
    # A framework without one of the file's dtypes refuses the file, naming
    # the tensor (numpy has no bfloat16).
    with pytest.raises(cairn.InvalidArgumentError, match="bf16"):
        cairn.load(theirs, framework="np")
    # The C++ reference with float8 reads back wherever numpy has the dtypes.
    full = tmp_path / "full.safetensors"
    subprocess.run([tool, "write", full], check=True)
    with pytest.raises(cairn.InvalidArgumentError, match="F8_E4M3|BF16"):
        cairn.load(full, framework="np")


# ---- threads ---------------------------------------------------------------------------


def test_other_python_threads_run_while_a_save_and_a_load_are_in_progress(
    s3_through_python: str,
) -> None:
    # Every byte goes through a relay of Python threads (conftest.py): the
    # save and the load can finish only if they let other threads run. One
    # holding the GIL would wait on its requests until they time out.
    state = {f"t{i}": torch.full((1 << 20,), i, dtype=torch.uint8) for i in range(6)}
    uri = s3_through_python + "/state.safetensors"
    cairn.save(state, uri)
    loaded = cairn.load(uri)
    assert sorted(loaded) == sorted(state)
    for name, tensor in state.items():
        assert torch.equal(loaded[name], tensor), name


# ---- bad input: a clear cairn error, nothing lost ---------------------------------------


def test_bad_values_are_invalid_argument_errors_naming_the_tensor(
    tmp_path: pathlib.Path, torch_code: str
) -> None:
    path = tmp_path / "s.safetensors"
    cairn.save({"kept": torch.ones(3)}, path)
    before = path.read_bytes()
    cases = [
        ({"w": [1.0, 2.0]}, "'w'"),
        ({"w": "text"}, "'w'"),
        ({"w": torch.ones(4, 4).t()}, "not contiguous"),
        ({"w": np.ones((4, 4))[:, ::2]}, "not C-contiguous"),
        ({"w": torch.ones(2, dtype=torch.complex64)}, "complex64"),
        ({"w": np.ones(2, dtype=">f4")}, "'w'"),
        ({"w": np.array(["a"])}, "'w'"),
        ({1: torch.ones(1)}, "keys must be str"),
        ({"bad\udcff": torch.ones(1)}, "UTF-8"),
        ({"a": {"b": torch.ones(1)}, "a.b": torch.ones(1)}, "'a.b'"),
    ]
    for state, words in cases:
        with pytest.raises(cairn.InvalidArgumentError, match=words):
            cairn.save(state, path)
        assert path.read_bytes() == before  # nothing lost
    with pytest.raises(TypeError, match="'state_dict' must be"):
        cairn.save([torch.ones(1)], path)  # type: ignore[arg-type]
    with pytest.raises(cairn.InvalidArgumentError):
        cairn.load(path, framework="jax")  # type: ignore[arg-type]
    # InvalidArgumentError is a ValueError too, for code that catches those.
    with pytest.raises(ValueError):
        cairn.save({"w": [1]}, path)


def test_paths_that_are_folders_missing_or_damaged_files_are_clear_errors(
    tmp_path: pathlib.Path,
) -> None:
    with pytest.raises(cairn.NotFoundError, match="missing.safetensors"):
        cairn.load(tmp_path / "missing.safetensors")
    with pytest.raises(cairn.Error, match=str(tmp_path)):
        cairn.save({"w": torch.ones(1)}, tmp_path)  # a folder
    with pytest.raises(cairn.Error):
        cairn.load(tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(cairn.Error, match="file"):
        cairn.save({"w": torch.ones(1)}, tmp_path / "file" / "under.safetensors")

    path = tmp_path / "s.safetensors"
    cairn.save({"w": torch.arange(100, dtype=torch.float32)}, path)
    good = path.read_bytes()
    damaged = [
        good[: len(good) - 7],  # cut short
        b"\xff" * 8 + good[8:],  # header length beyond the file
        good[:8] + b"[" + good[9:],  # header not a JSON object
        b"",
    ]
    for data in damaged:
        path.write_bytes(data)
        for mmap in (True, False):
            with pytest.raises(cairn.CorruptionError, match="s.safetensors"):
                cairn.load(path, mmap=mmap)
    path.write_bytes(good)
    assert torch.equal(cairn.load(path)["w"], torch.arange(100, dtype=torch.float32))


def test_a_save_that_fails_leaves_the_old_file_and_no_temporary(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "s.safetensors"
    cairn.save({"w": torch.ones(2)}, path)
    before = path.read_bytes()
    folder.chmod(0o500)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("running as a user who may write anywhere")
        with pytest.raises(cairn.PermissionDeniedError, match="ro"):
            cairn.save({"w": torch.zeros(2)}, path)
    finally:
        folder.chmod(0o700)
    assert path.read_bytes() == before
    assert sorted(p.name for p in folder.iterdir()) == ["s.safetensors"]
