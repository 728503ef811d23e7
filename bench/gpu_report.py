#!/usr/bin/env python3
"""Prints the GPU-state table (docs/benchmarks.md, "GPU state") from one run
of bench/gpu_bench (Cairn) and bench/gpu_baseline.py (PyTorch), with the
issue's goals as verdicts. Medians of each figure's runs; ratios of medians
measured on the same machine in the same run.

  gpu_report.py CAIRN.json BASELINE.json [--markdown]
"""

import json
import statistics
import sys


def medians(report):
    return {r["name"]: statistics.median(r["runs_s"]) for r in report["results"]}


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    markdown = "--markdown" in sys.argv
    with open(args[0]) as f:
        cairn = json.load(f)
    with open(args[1]) as f:
        base = json.load(f)
    c, b = medians(cairn), medians(base)
    gb = cairn["bytes"] / 1e9
    if base["bytes"] != cairn["bytes"]:
        sys.exit(
            f"gpu_report: the two runs moved different states ({cairn['bytes']} vs "
            f"{base['bytes']} bytes)"
        )

    rows = [
        ("pinned D2H copy (floor)", c["d2h_pinned"], "s", ""),
        ("Cairn async save stall", c["cairn_async_stall"], "s", ""),
        ("DCP async_save stall, defaults", b["dcp_async_stall"], "s", ""),
        ("Cairn save of GPU state", gb / c["cairn_save_gpu"], "GB/s", ""),
        ("Cairn save of the CPU copy", gb / c["cairn_save_cpu"], "GB/s", ""),
        ("dcp.save", gb / b["dcp_save"], "GB/s", ""),
        ("torch.save", gb / b["torch_save"], "GB/s", ""),
        ("Cairn cold load into GPU", gb / c["cairn_load_gpu"], "GB/s", ""),
        ("disk O_DIRECT read (4 threads x 16 MiB)", gb / c["disk_read_direct"], "GB/s", ""),
        ("dcp.load into GPU, cold", gb / b["dcp_load_gpu"], "GB/s", ""),
    ]
    # DCP's stall in its best configuration measured (the cached writer where
    # the baseline has it): the goal is judged against that one.
    dcp_stalls = {"defaults": b["dcp_async_stall"]}
    if "dcp_async_cached_stall" in b:
        dcp_stalls["cache_staged_state_dict=True"] = b["dcp_async_cached_stall"]
        rows.insert(
            3, ("DCP async_save stall, cached staging", b["dcp_async_cached_stall"], "s", "")
        )
    best_config = min(dcp_stalls, key=dcp_stalls.get)
    if "fio_read_direct" in c:
        rows.insert(
            len(rows) - 1,
            ("fio O_DIRECT read (libaio, 8 x 1 MiB)", gb / c["fio_read_direct"], "GB/s", ""),
        )
    checks = [
        ("async stall / pinned D2H copy", c["cairn_async_stall"] / c["d2h_pinned"], "<=", 2.0),
        (
            f"DCP async stall ({best_config}, DCP's best here) / Cairn async stall",
            dcp_stalls[best_config] / c["cairn_async_stall"],
            ">=",
            4.0,
        ),
        ("GPU save / CPU save (throughput)", c["cairn_save_cpu"] / c["cairn_save_gpu"], ">=", 0.9),
        (
            "GPU load / disk O_DIRECT read (throughput)",
            c["disk_read_direct"] / c["cairn_load_gpu"],
            ">=",
            0.9,
        ),
    ]
    if "fio_read_direct" in c:
        checks.append(
            (
                "GPU load / fio O_DIRECT read (throughput)",
                c["fio_read_direct"] / c["cairn_load_gpu"],
                ">=",
                0.9,
            )
        )
    checks += [
        ("GPU load / dcp.load (throughput)", b["dcp_load_gpu"] / c["cairn_load_gpu"], ">=", 1.0),
    ]
    first = {r["name"]: r["first_s"] for r in base["results"] if "first_s" in r}
    if first:
        print(
            "DCP first calls, not in the medians: "
            + ", ".join(f"{k} {v:.3f} s" for k, v in first.items())
        )
    print(
        f"state: {cairn['tensors']} float32 tensors, {cairn['bytes'] / 2**30:.3f} GiB; "
        f"GPU: {base.get('gpu', '?')}; torch {base.get('torch', '?')}; "
        f"cache drop: {cairn.get('cache_drop')}; load path: {cairn.get('load_io')}"
    )
    print(
        f"staging: {cairn.get('staging_pinned_bytes', 0) / 2**30:.3f} GiB pinned, "
        f"AsyncSaver::reserve() took {cairn.get('reserve_s', 0):.3f} s, "
        f"reserve_device_staging() {cairn.get('reserve_sync_s', float('nan')):.3f} s"
    )
    gpu_saves = next(r["runs_s"] for r in cairn["results"] if r["name"] == "cairn_save_gpu")
    print("GPU state saves, run by run: " + ", ".join(f"{t:.3f} s" for t in gpu_saves))
    if markdown:
        print("\n| figure | median |\n| --- | --- |")
        for name, v, unit, _ in rows:
            print(f"| {name} | {v:.3f} {unit} |")
        print("\n| ratio (same run) | value | goal | verdict |\n| --- | --- | --- | --- |")
    else:
        for name, v, unit, _ in rows:
            print(f"  {name:<34} {v:9.3f} {unit}")
    failed = 0
    for name, v, op, goal in checks:
        ok = v <= goal if op == "<=" else v >= goal
        failed += not ok
        verdict = "PASS" if ok else "FAIL"
        if markdown:
            print(f"| {name} | {v:.2f} | {op} {goal} | {verdict} |")
        else:
            print(f"  {name:<44} {v:7.2f}  goal {op} {goal}  {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
