#!/usr/bin/env python3
"""safetensors interop in both directions, with only numpy and json.

A tiny independent reader and writer of the format (below) exchange files
with Cairn's C++ implementation (interop_tool):
  1. C++ writes the reference state; Python reads and checks it, including
     the header padding and the contiguity of the data offsets.
  2. Python writes the reference state in its own tensor order (so some
     tensors are misaligned in the file); C++ reads and checks it, mapped and
     copied.
  3. Python writes a file with overlapping offsets; C++ refuses it, naming
     the tensor.
Usage: interop_test.py PATH_TO_INTEROP_TOOL
"""

import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

DTYPES = {
    "BOOL": np.bool_,
    "U8": np.uint8,
    "I8": np.int8,
    "I16": np.int16,
    "U16": np.uint16,
    "F16": np.float16,
    "BF16": np.uint16,
    "I32": np.int32,
    "U32": np.uint32,
    "F32": np.float32,
    "F64": np.float64,
    "I64": np.int64,
    "U64": np.uint64,
    "F8_E4M3": np.uint8,
    "F8_E5M2": np.uint8,
}


def reference():
    """name -> (dtype name, numpy array); must match interop_tool.cc."""
    return {
        "f32": (
            "F32",
            (np.arange(6, dtype=np.float32) * np.float32(0.5) - np.float32(1.0)).reshape(2, 3),
        ),
        "f64": ("F64", np.arange(4, dtype=np.float64) / 3.0),
        "f16": ("F16", np.array([1.0, -2.0, 65504.0], dtype=np.float16)),
        "bf16": ("BF16", np.array([0x3F80, 0x4049], dtype=np.uint16)),
        "i8": ("I8", np.arange(-3, 3, dtype=np.int8).reshape(2, 3)),
        "u8": ("U8", np.arange(250, 255, dtype=np.uint8)),
        "i16": ("I16", np.array([-300, 300], dtype=np.int16)),
        "u16": ("U16", np.array([65535, 1], dtype=np.uint16)),
        "i32": ("I32", np.array([-70000, 70000], dtype=np.int32)),
        "u32": ("U32", np.array([4000000000], dtype=np.uint32)),
        "i64": ("I64", np.array([-(1 << 40), 5], dtype=np.int64)),
        "u64": ("U64", np.array([1 << 63], dtype=np.uint64)),
        "bool": ("BOOL", np.array([True, False, True])),
        "f8_e4m3": ("F8_E4M3", np.array([0x38, 0xB8], dtype=np.uint8)),
        "f8_e5m2": ("F8_E5M2", np.array([0x3C], dtype=np.uint8)),
        "scalar": ("F32", np.array(7.5, dtype=np.float32)),
        "empty": ("F32", np.zeros((0, 4), dtype=np.float32)),
    }


METADATA = {"format": "np", "cairn.metadata": json.dumps({"epoch": 3, "step": 100})}


def write(path, tensors, metadata, order):
    header = {"__metadata__": metadata}
    data = bytearray()
    for name in order:
        dtype, arr = tensors[name]
        raw = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(arr.shape),
            "data_offsets": [len(data), len(data) + len(raw)],
        }
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + bytes(data))


def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    assert (8 + n) % 8 == 0, f"header not padded to 8 bytes: 8 + {n}"
    text = blob[8 : 8 + n]
    assert text.startswith(b"{") and text.rstrip(b" ").endswith(b"}"), (
        "header padding is not spaces"
    )
    header = json.loads(text)
    metadata = header.pop("__metadata__", {})
    data = blob[8 + n :]
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items())
    pos = 0
    for b, e, k in spans:
        assert b == pos, f"{k}: offsets not contiguous ({b} != {pos})"
        pos = e
    assert pos == len(data), f"data buffer has {len(data)} bytes, tensors cover {pos}"
    out = {}
    for k, v in header.items():
        b, e = v["data_offsets"]
        dt = np.dtype(DTYPES[v["dtype"]]).newbyteorder("<")
        arr = np.frombuffer(data[b:e], dtype=dt).reshape(v["shape"])
        out[k] = (v["dtype"], arr)
    return out, metadata


def check_same(got, want):
    assert sorted(got) == sorted(want), f"names differ: {sorted(got)} vs {sorted(want)}"
    for k, (dtype, arr) in want.items():
        gdtype, garr = got[k]
        assert gdtype == dtype, f"{k}: dtype {gdtype}, want {dtype}"
        assert garr.shape == arr.shape, f"{k}: shape {garr.shape}, want {arr.shape}"
        assert garr.tobytes() == arr.astype(garr.dtype).tobytes(), f"{k}: bytes differ"


def main():
    tool = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="cairn-interop-") as tmp:
        # 1. C++ -> Python
        cpp_file = os.path.join(tmp, "from_cpp.safetensors")
        subprocess.run([tool, "write", cpp_file], check=True)
        got, metadata = read(cpp_file)
        check_same(got, reference())
        assert metadata["format"] == "np", metadata
        assert json.loads(metadata["cairn.metadata"]) == {"epoch": 3, "step": 100}, metadata
        print("C++ -> Python: ok")

        # 2. Python -> C++, in an order that leaves wide tensors misaligned.
        py_file = os.path.join(tmp, "from_py.safetensors")
        order = ["u8", "f64", "bool", "f32", "f16", "i64"] + [
            k for k in reference() if k not in ("u8", "f64", "bool", "f32", "f16", "i64")
        ]
        write(py_file, reference(), METADATA, order)
        subprocess.run([tool, "check", py_file], check=True)
        print("Python -> C++: ok")

        # 3. A malformed file written by Python is refused, naming the tensor.
        bad = os.path.join(tmp, "bad.safetensors")
        header = {
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
        }
        text = json.dumps(header).encode()
        text += b" " * ((8 - (8 + len(text)) % 8) % 8)
        with open(bad, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + bytes(12))
        r = subprocess.run([tool, "check", bad], capture_output=True, text=True)
        assert r.returncode != 0, "a file with overlapping offsets was accepted"
        assert 'tensor "b"' in r.stderr and "overlaps" in r.stderr, r.stderr
        print("malformed Python file refused: ok")


if __name__ == "__main__":
    main()
