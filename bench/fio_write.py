"""fio's sequential write: the disk ceiling the Python benchmarks print beside
their figures (bench/tf_compare.py, bench/dcp_compare.py)."""

from __future__ import annotations

import json
import subprocess


def fio_write(path: str, nbytes: int) -> tuple[float, int]:
    """Writes ``nbytes`` (rounded to whole MiB, at least one) to ``path`` with
    O_DIRECT in 1 MiB blocks and an fsync at the end; returns (seconds,
    bytes written). The caller removes ``path``."""
    out = subprocess.run(
        [
            "fio",
            "--name=seqwrite",
            "--filename=" + path,
            f"--size={max(nbytes >> 20, 1)}M",
            "--bs=1M",
            "--rw=write",
            "--direct=1",
            "--ioengine=libaio",
            "--iodepth=8",
            "--end_fsync=1",
            "--output-format=json",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    job = json.loads(out)["jobs"][0]["write"]
    return job["runtime"] / 1000.0, int(job["io_bytes"])
