#!/usr/bin/env python3
"""Cairn from Python against the C++ engine, torch and fio, in one run.

Usage (docs/benchmarks.md, "Python")::

    PYTHONPATH=build/python .venv/bin/python3 bench/python_bench.py \\
        --cairn-bench build/bench/cairn_bench [--size-mib 1024] [--runs 5] \\
        [--tiny-tensors 100000] [--dir DIR] [--json FILE] [--smoke]

Every figure is the median of ``--runs`` rounds; within each round the
operations run back to back, so each pair compared shares the disk's state
of the moment. The state is ``cairn_bench --workload``'s (261 float32
tensors of a transformer and its Adam state) as torch tensors. Reads start
from a cold page cache (bench/cache.py: ``drop_caches`` as root, else fsync
+ ``posix_fadvise(DONTNEED)`` of the file), writes after a ``sync``.

Pairs (ratios: reference time / Cairn time, so > 1 means Cairn from Python
is faster, except the binding's overhead, which is Python time / C++ time):

- ``cairn.save`` and ``cairn.load`` (``mmap=False``; ``mmap=True`` and
  reading every byte) against ``cairn_bench --save-load`` on the same
  tensors (``save_file``, ``load_into`` fresh buffers, ``MappedState`` +
  reading every byte): the binding's overhead.
- ``cairn.save`` against ``torch.save`` + flush + fsync; ``cairn.load``
  against ``torch.load``.
- cold ``cairn.load`` against fio's O_DIRECT sequential read (libaio, queue
  depth 8, 1 MiB) of a file of the same size.
- ``cairn.torch.AsyncSaver.save`` into a ``CheckpointManager`` until it
  returns (the training loop's stall; one saver for every round, so round 1
  allocates its staging) against the engine's ``AsyncSaver::save`` (second
  run) and against a memcpy of the state (``cairn_bench``, second run).
- ``--tiny-tensors`` N tensors of 4 KiB against the same bytes in 10
  tensors: the per-tensor cost of save and load through the binding, next to
  the C++ engine's own (``cairn_bench --many-tensors``).

Every process runs with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` (as
bench/run.py; PERF-NOTES) unless ``--no-hugetlb``. Files go to a fresh
folder (``--dir`` or a temporary one) that is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cache import drop_caches

HUGETLB = "glibc.malloc.hugetlb=1"


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, result) of one call of ``fn``."""
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def touch_plan(tensors: dict[str, Any]) -> list[Any]:
    """What :func:`touch` reads to read every byte of ``tensors``: uint8 arrays.

    Found outside the timed part: when the tensors' bytes lie back to back in
    one span of memory (every load of one file), that span, read in one
    pass; otherwise each tensor's bytes. Reading 100,000 tiny tensors then
    does not time a Python loop of this benchmark.
    """
    import ctypes

    import numpy as np

    spans = []
    for t in tensors.values():
        if hasattr(t, "data_ptr"):
            spans.append((t.data_ptr(), t.numel() * t.element_size(), t))
        else:
            spans.append((t.__array_interface__["data"][0], t.nbytes, t))
    spans.sort(key=lambda s: s[0])
    total = sum(n for _, n, _ in spans)
    if spans and spans[-1][0] + spans[-1][1] - spans[0][0] < total + 64 * len(spans):
        # Back to back, up to alignment padding: the whole span at once.
        begin, end = spans[0][0], spans[-1][0] + spans[-1][1]
        return [np.ctypeslib.as_array((ctypes.c_uint8 * (end - begin)).from_address(begin))]
    return [
        (t.numpy() if hasattr(t, "numpy") else t).reshape(-1).view(np.uint8) for _, _, t in spans
    ]


def touch(plan: list[Any]) -> int:
    """Reads every byte of a :func:`touch_plan` (summed as 32-bit words), as cairn_bench does."""
    import numpy as np

    total = 0
    for a in plan:
        total += int(a[: a.nbytes // 4 * 4].view(np.uint32).sum(dtype=np.uint64))
    return total


def timed_mapped_load(load: Callable[[], dict[str, Any]]) -> float:
    """Seconds of ``load()`` plus reading every byte it returned (touch), not
    the benchmark's own bookkeeping between the two."""
    seconds, loaded = timed(load)
    plan = touch_plan(loaded)
    return seconds + timed(lambda: touch(plan))[0]


def make_state(specs: list[dict[str, Any]]) -> dict[str, Any]:
    """Float32 torch tensors of the given names and shapes, random in [-1, 1)."""
    import torch

    gen = torch.Generator().manual_seed(1)
    return {
        s["name"]: torch.rand(s["shape"], dtype=torch.float32, generator=gen) * 2 - 1 for s in specs
    }


class Rounds:
    """Seconds per operation, one entry per round."""

    def __init__(self) -> None:
        self.runs: dict[str, list[float]] = {}

    def add(self, name: str, seconds: float) -> None:
        self.runs.setdefault(name, []).append(seconds)

    def median(self, name: str) -> float:
        return statistics.median(self.runs[name])


def cairn_round(state: dict[str, Any], path: str, rounds: Rounds, tag: str) -> None:
    """cairn.save, then cold cairn.load with mmap=False and with mmap=True + reading."""
    import cairn

    if os.path.exists(path):
        os.remove(path)
    os.sync()
    rounds.add(f"{tag}.save", timed(lambda: cairn.save(state, path))[0])
    drop_caches([path])
    seconds, loaded = timed(lambda: cairn.load(path, mmap=False))
    rounds.add(f"{tag}.load_copy", seconds)
    if tag == "py" and any(not loaded[k].equal(v) for k, v in state.items()):
        raise SystemExit("python_bench: cairn.load returned different tensors")
    del loaded
    drop_caches([path])
    rounds.add(f"{tag}.load_mmap", timed_mapped_load(lambda: cairn.load(path, mmap=True)))


def torch_round(state: dict[str, Any], path: str, rounds: Rounds) -> None:
    """torch.save + flush + fsync, then cold torch.load."""
    import torch

    if os.path.exists(path):
        os.remove(path)
    os.sync()

    def save() -> None:
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())

    rounds.add("torch.save", timed(save)[0])
    drop_caches([path])
    seconds, loaded = timed(lambda: torch.load(path))
    rounds.add("torch.load", seconds)
    del loaded
    os.remove(path)


def async_round(saver: Any, manager: Any, state: dict[str, Any], rounds: Rounds) -> None:
    """``cairn.torch.AsyncSaver.save`` into a manager until it returns, then waited for."""
    os.sync()
    seconds, handle = timed(lambda: saver.save(state, manager))
    rounds.add("py.async_saver_stall", seconds)
    # The stall the C++ saver itself measured inside that call (snapshot,
    # reserving the checkpoint): the rest is the binding's.
    rounds.add("py.async_saver_stall_in_cpp", saver.stats()["last_stall_seconds"])
    handle.wait()


def fio_read(path: str, nbytes: int) -> float:
    """fio's O_DIRECT sequential read of ``path`` (laid out at ``nbytes``), in seconds."""
    size = f"{max(nbytes >> 20, 1)}M"
    out = subprocess.run(
        [
            "fio",
            "--name=seqread",
            "--filename=" + path,
            "--size=" + size,
            "--bs=1M",
            "--rw=read",
            "--direct=1",
            "--ioengine=libaio",
            "--iodepth=8",
            "--output-format=json",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)["jobs"][0]["read"]["runtime"] / 1000.0


def engine_round(cairn_bench: str, size_mib: int, folder: str, rounds: Rounds) -> None:
    """``cairn_bench --save-load``: the C++ engine on the same tensors.

    Two runs, of which the second counts: the first in a new process pays
    for fresh memory (PERF-NOTES), which this Python process, running every
    round, pays only in its first.
    """
    out = os.path.join(folder, "engine.json")
    subprocess.run(
        [
            cairn_bench,
            "--save-load",
            "--size-mib",
            str(size_mib),
            "--runs",
            "2",
            "--dir",
            folder,
            "--out",
            out,
        ],
        check=True,
    )
    with open(out) as f:
        report = json.load(f)
    os.remove(out)
    for m in report["results"]:
        name = m["name"].partition(".")[2] or m["name"]  # "memcpy" has no prefix
        rounds.add("cpp." + name, m["runs_s"][-1])


def tiny_tensors(count: int, runs: int, folder: str, cairn_bench: str) -> dict[str, Any]:
    """``count`` tensors of 4 KiB against the same bytes in 10, through Python and in C++."""
    import torch

    floats = count * 1024
    layouts = {}
    for tag, n in (("many", count), ("few", 10)):
        sizes = [floats // n + (floats % n if i == n - 1 else 0) for i in range(n)]
        layouts[tag] = {
            f"{tag}.{i:07d}": torch.full((s,), float(i % 97)) for i, s in enumerate(sizes)
        }
    rounds = Rounds()
    for r in range(runs):
        # Alternate which layout goes first: the first large allocation
        # after others were freed can cost more here (fresh memory,
        # PERF-NOTES), and it must not always fall on the same side.
        for tag, state in list(layouts.items()) if r % 2 == 0 else list(reversed(layouts.items())):
            cairn_round(state, os.path.join(folder, f"{tag}.safetensors"), rounds, tag)
            os.remove(os.path.join(folder, f"{tag}.safetensors"))
    out = os.path.join(folder, "count.json")
    subprocess.run(
        [
            cairn_bench,
            "--many-tensors",
            str(count),
            "--runs",
            str(runs),
            "--dir",
            folder,
            "--out",
            out,
        ],
        check=True,
        stderr=subprocess.DEVNULL,
    )
    with open(out) as f:
        engine = json.load(f)["ratios"]
    os.remove(out)
    result: dict[str, Any] = {}
    for op in ("save", "load_copy", "load_mmap"):
        many, few = rounds.median(f"many.{op}"), rounds.median(f"few.{op}")
        per_round = [a / b for a, b in zip(rounds.runs[f"many.{op}"], rounds.runs[f"few.{op}"])]
        result[op] = {
            "many_s": many,
            "few_s": few,
            "python_ratio": many / few,
            "python_ratio_per_round": statistics.median(per_round),
            "engine_ratio": engine.get(op),
        }
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--cairn-bench", required=True, help="the cairn_bench binary")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tiny-tensors", type=int, default=100_000)
    ap.add_argument("--dir", help="folder for the files (default: a temporary one)")
    ap.add_argument("--json", help="write every run's figures here")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="16 MiB, 1 run, 1000 tiny tensors: checks that every figure comes out",
    )
    ap.add_argument(
        "--no-hugetlb", action="store_true", help="glibc's default malloc for every process"
    )
    args = ap.parse_args()
    if args.smoke:
        args.size_mib, args.runs, args.tiny_tensors = 16, 1, 1000
    if not args.no_hugetlb and HUGETLB not in os.environ.get("GLIBC_TUNABLES", ""):
        # The tunable is read at start-up: run again with it (children inherit it).
        env = dict(os.environ, GLIBC_TUNABLES=HUGETLB)
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
    try:
        import torch
    except ImportError:
        print("python_bench: torch is not installed; nothing measured")
        return 77
    import cairn
    import cairn.torch

    workload = json.loads(
        subprocess.run(
            [args.cairn_bench, "--workload", "--size-mib", str(args.size_mib)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    state = make_state(workload["tensors"])
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    own_dir = args.dir is None
    folder = tempfile.mkdtemp(prefix="cairn-pybench-") if own_dir else args.dir
    os.makedirs(folder, exist_ok=True)
    try:
        rounds = Rounds()
        fio_file = os.path.join(folder, "fio.dat")
        # One saver and manager for every round: the saver's first save
        # allocates its staging, later ones reuse it (as in training).
        manager = cairn.CheckpointManager(
            folder, "py-saver-exp", cairn.CheckpointConfig(num_to_keep=1)
        )
        saver = cairn.torch.AsyncSaver()
        for r in range(args.runs):
            engine_round(args.cairn_bench, args.size_mib, folder, rounds)
            cairn_round(state, os.path.join(folder, "py.safetensors"), rounds, "py")
            rounds.add("fio.read_direct", fio_read(fio_file, nbytes))
            torch_round(state, os.path.join(folder, "torch.pt"), rounds)
            os.remove(os.path.join(folder, "py.safetensors"))
            async_round(saver, manager, state, rounds)
            print(
                f"round {r + 1}/{args.runs}: "
                + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in rounds.runs.items()),
                file=sys.stderr,
            )
        saver.close()
        manager.close()
        os.remove(fio_file)
        shutil.rmtree(os.path.join(folder, "py-saver-exp"))
        tiny = tiny_tensors(args.tiny_tensors, args.runs, folder, args.cairn_bench)
    finally:
        if own_dir:
            shutil.rmtree(folder, ignore_errors=True)

    m = rounds.median

    def pair(a: str, b: str) -> tuple[float, float]:
        """(median of a / median of b, median of the rounds' a / b)."""
        per_round = [x / y for x, y in zip(rounds.runs[a], rounds.runs[b])]
        return m(a) / m(b), statistics.median(per_round)

    ratios = [
        # (what, (ratio of medians, median of per-round ratios), target)
        ("binding overhead, save (Python / C++)", pair("py.save", "cpp.save"), "<= 1.05"),
        (
            "binding overhead, load mmap=False (Python / C++ load_fresh)",
            pair("py.load_copy", "cpp.load_fresh"),
            "<= 1.05",
        ),
        (
            "binding overhead, load mmap=True + read (Python / C++)",
            pair("py.load_mmap", "cpp.load_mmap"),
            "<= 1.05",
        ),
        ("save speed-up vs torch.save + fsync", pair("torch.save", "py.save"), ">= 2"),
        ("load mmap=False speed-up vs torch.load", pair("torch.load", "py.load_copy"), ">= 1"),
        (
            "load mmap=True + read speed-up vs torch.load",
            pair("torch.load", "py.load_mmap"),
            ">= 1",
        ),
        (
            "cold load mmap=False vs fio O_DIRECT read",
            pair("fio.read_direct", "py.load_copy"),
            ">= 0.9",
        ),
        (
            "cold load mmap=True + read vs fio O_DIRECT read",
            pair("fio.read_direct", "py.load_mmap"),
            ">= 0.9",
        ),
        (
            "binding overhead, AsyncSaver.save stall (Python / C++)",
            pair("py.async_saver_stall", "cpp.async_saver_stall"),
            "<= 1.05",
        ),
        (
            "binding's share, AsyncSaver.save stall (Python / its C++ call)",
            pair("py.async_saver_stall", "py.async_saver_stall_in_cpp"),
            "<= 1.05",
        ),
        (
            "AsyncSaver.save stall (Python) / memcpy of the state (C++)",
            pair("py.async_saver_stall", "cpp.memcpy"),
            "<= 1.5",
        ),
    ]
    for op, r in tiny.items():
        ratios.append(
            (
                f"{args.tiny_tensors} tensors / 10 tensors, {op} (Python; C++ "
                f"{r['engine_ratio']:.2f})",
                (r["python_ratio"], r["python_ratio_per_round"]),
                "<= 2",
            )
        )

    print(
        f"cairn {cairn.__version__}, torch {torch.__version__}, {len(state)} tensors, "
        f"{nbytes / 1e9:.3f} GB, median of {args.runs} rounds, cache drop: "
        f"{drop_caches([])}, GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')}"
    )
    for name in sorted(rounds.runs):
        print(f"  {name:22} {m(name):8.3f} s  {nbytes / m(name) / 1e9:6.2f} GB/s")
    print("  ratios: of the medians (median of the rounds' own ratios)")
    for what, (ratio, paired), target in ratios:
        print(f"  {what:68} {ratio:6.2f} ({paired:5.2f})  target {target}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "bytes": nbytes,
                    "tensors": len(state),
                    "runs": rounds.runs,
                    "tiny_tensors": tiny,
                    "ratios": [
                        {"what": w, "ratio": r, "per_round_median": p, "target": t}
                        for w, (r, p), t in ratios
                    ],
                },
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
