#!/usr/bin/env python3
"""LibTorch adapter interop with PyTorch in Python, both ways.

The same network is defined here and in interop_tool.cc. Files are read and
written with the independent safetensors reader/writer of
tests/engine/interop_test.py (numpy + json), as a user without the
safetensors package would.
  1. C++ saves (one file, Hugging Face shards + index, and a full training
     state); PyTorch loads each with load_state_dict and gives the same
     output as C++ did.
  2. PyTorch writes its state dict as one file and as shards + index; C++
     loads each strictly and gives the same output as PyTorch.
  3. C++ splits the same network into the same shards, with the same tensor
     names in each file, as huggingface_hub's
     split_torch_state_dict_into_shards (transformers' save_pretrained) does
     for several max_shard_size values; its rule is restated below as the
     oracle, since neither package is in Debian.
Usage: python_interop_test.py PATH_TO_INTEROP_TOOL
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "engine"))
import interop_test as st

TORCH_DTYPES = {"F32": torch.float32, "I64": torch.int64, "F64": torch.float64}
ST_DTYPES = {torch.float32: "F32", torch.int64: "I64", torch.float64: "F64"}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.bn = nn.BatchNorm1d(8)
        self.layers = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))

    def forward(self, x):
        return self.layers(torch.relu(self.bn(self.fc1(x))))


def fixed_input():
    return torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7.0


def output(net):
    net.eval()
    with torch.no_grad():
        return net(fixed_input()).reshape(-1).tolist()


def same(a, b, what):
    assert np.allclose(a, b, rtol=1e-6, atol=1e-7), f"{what}: {a} != {b}"


def load_file(path):
    tensors, metadata = st.read(path)
    assert metadata.get("format") == "pt", f"{path}: __metadata__ has no format=pt: {metadata}"
    return {k: torch.from_numpy(arr.copy()) for k, (dtype, arr) in tensors.items()}


def load_folder(folder):
    index_path = os.path.join(folder, "model.safetensors.index.json")
    if not os.path.exists(index_path):
        return load_file(os.path.join(folder, "model.safetensors"))
    with open(index_path) as f:
        index = json.load(f)
    state = {}
    for shard in sorted(set(index["weight_map"].values())):
        state.update(load_file(os.path.join(folder, shard)))
    assert sorted(state) == sorted(index["weight_map"]), "index and shards disagree"
    total = sum(t.numel() * t.element_size() for t in state.values())
    assert index["metadata"]["total_size"] == total, (index["metadata"], total)
    return state


def cpp_to_python(tool, tmp):
    subprocess.run([tool, "save", tmp], check=True)
    with open(os.path.join(tmp, "expected.json")) as f:
        expected = json.load(f)
    shards = [n for n in os.listdir(os.path.join(tmp, "sharded")) if n.endswith(".safetensors")]
    assert len(shards) > 1, f"expected several shards, got {shards}"
    for folder in ("single", "sharded"):
        net = Net()
        net.load_state_dict(load_folder(os.path.join(tmp, folder)))  # strict
        same(output(net), expected, f"C++ {folder} weights in PyTorch")
    # A full training state: the weights load; the rest is the optimizer's.
    net = Net()
    result = net.load_state_dict(load_file(os.path.join(tmp, "full.safetensors")), strict=False)
    assert not result.missing_keys, result.missing_keys
    assert all(k.startswith(("optim.", "rng.")) for k in result.unexpected_keys), result
    same(output(net), expected, "C++ full state's weights in PyTorch")


def python_to_cpp(tool, tmp):
    torch.manual_seed(3)
    net = Net()
    net.train()
    for _ in range(3):
        net(torch.randn(5, 4))  # moves BatchNorm's running statistics
    expected = output(net)
    state = {k: v.detach().contiguous() for k, v in net.state_dict().items()}
    tensors = {k: (ST_DTYPES[v.dtype], v.numpy()) for k, v in state.items()}

    single = os.path.join(tmp, "py_single")
    os.makedirs(single)
    st.write(os.path.join(single, "model.safetensors"), tensors, {"format": "pt"}, sorted(tensors))

    sharded = os.path.join(tmp, "py_sharded")
    os.makedirs(sharded)
    names = sorted(tensors)
    groups = [names[:4], names[4:8], names[8:]]
    weight_map = {}
    for k, group in enumerate(groups, 1):
        file = f"model-{k:05d}-of-{len(groups):05d}.safetensors"
        st.write(
            os.path.join(sharded, file),
            {n: tensors[n] for n in group},
            {"format": "pt"},
            list(reversed(group)),
        )
        weight_map.update({n: file for n in group})
    total = sum(v.numel() * v.element_size() for v in state.values())
    with open(os.path.join(sharded, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)

    for path in (single, os.path.join(single, "model.safetensors"), sharded):
        out = os.path.join(tmp, "out.json")
        subprocess.run([tool, "load", path, out], check=True)
        with open(out) as f:
            same(json.load(f), expected, f"PyTorch weights from {os.path.basename(path)} in C++")


def storage_key(tensor):
    """huggingface_hub's get_torch_storage_id: tensors with one key share storage."""
    storage = tensor.storage()
    return (tensor.device, storage.data_ptr(), storage.nbytes())


def hf_split(state_dict, max_shard_size):
    """huggingface_hub's split_state_dict_into_shards_factory (v0.23+), the
    rule transformers' save_pretrained uses: shard file name -> tensor names."""
    shard_list = []
    current, current_size = {}, 0
    shared = {}
    for key, tensor in state_dict.items():
        sid = storage_key(tensor)
        if sid in shared:
            shared[sid].append(key)  # placed with the first of its storage, below
            continue
        shared[sid] = [key]
        size = tensor.storage().nbytes()
        if size > max_shard_size:
            shard_list.append({key: tensor})  # alone; the open shard stays open
            continue
        if current_size + size > max_shard_size:
            shard_list.append(current)
            current, current_size = {}, 0
        current[key] = tensor
        current_size += size
    if current:
        shard_list.append(current)
    for keys in shared.values():
        for shard in shard_list:
            if keys[0] in shard:
                for key in keys:
                    shard[key] = state_dict[key]
                break
    if len(shard_list) == 1:
        return {"model.safetensors": sorted(shard_list[0])}
    n = len(shard_list)
    return {
        f"model-{k:05d}-of-{n:05d}.safetensors": sorted(shard)
        for k, shard in enumerate(shard_list, 1)
    }


def cpp_shards(folder):
    index_path = os.path.join(folder, "model.safetensors.index.json")
    if not os.path.exists(index_path):
        tensors, _ = st.read(os.path.join(folder, "model.safetensors"))
        return {"model.safetensors": sorted(tensors)}
    with open(index_path) as f:
        weight_map = json.load(f)["weight_map"]
    files = {}
    for name, file in weight_map.items():
        files.setdefault(file, []).append(name)
    for file, names in files.items():
        tensors, _ = st.read(os.path.join(folder, file))
        assert sorted(tensors) == sorted(names), f"{file}: holds {sorted(tensors)}, index {names}"
    on_disk = sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))
    assert on_disk == sorted(files), f"{folder}: {on_disk} on disk, {sorted(files)} indexed"
    return {file: sorted(names) for file, names in files.items()}


def shards_as_huggingface(tool, tmp):
    state = Net().state_dict()
    sizes = [t.numel() * t.element_size() for t in state.values()]
    # From one tensor per shard, through limits smaller than the largest
    # tensor (which then sits alone while its neighbours share a shard), to
    # one file.
    for max_shard_size in (0, 8, 40, 64, 100, 200, 256, 300, 400, sum(sizes)):
        folder = os.path.join(tmp, f"split-{max_shard_size}")
        subprocess.run([tool, "shard", folder, str(max_shard_size)], check=True)
        expected = hf_split(state, max_shard_size)
        got = cpp_shards(folder)
        assert got == expected, (
            f"max_shard_size {max_shard_size}: C++ {got}, huggingface_hub {expected}"
        )


def main():
    tool = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="cairn-torch-interop-") as tmp:
        cpp_to_python(tool, tmp)
        python_to_cpp(tool, tmp)
        shards_as_huggingface(tool, tmp)
    print("torch interop: ok")


if __name__ == "__main__":
    main()
