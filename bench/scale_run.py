#!/usr/bin/env python3
"""Runs bench/scale_bench on each storage and prints one table (docs/scale.md).

Storages: "tmpfs" (a folder in /dev/shm: the driver's own costs, no disk;
Cairn's memory:// store lives inside one process and cannot serve worker
processes), "disk" (a folder under --dir) and "s3" (one moto S3 server on 127.0.0.1,
tests/support/moto_s3.py, started here). Each runs every --ranks count, with
each launcher of --launchers: "local" (the driver forks the N workers) and
"env" (N processes started as torchrun or a shell loop starts them, with
RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; rank 0 drives, the others
are agents that fork their rank's worker) and "mpi" (the same N processes
started by `mpirun -np N --oversubscribe`).

    .venv/bin/python3 bench/scale_run.py --bench build/bench/scale_bench \\
        --dir /var/tmp/scale --ranks 8,64,256,1024 --s3-ranks 8,64,256 \\
        --launchers local,env,mpi
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))

from s3_servers import ACCESS_KEY, SECRET_KEY, MotoS3

COLUMNS = [
    ("ranks", "{:d}"),
    ("commit_s", "{:.4f}"),
    ("release_s", "{:.4f}"),
    ("round_s", "{:.3f}"),
    ("gather_s", "{:.3f}"),
    ("upload_s", "{:.3f}"),
    ("driver_cpu_s", "{:.4f}"),
    ("driver_rss_mib", "{:.1f}"),
    ("manifest_kib", "{:.1f}"),
    ("history_kib", "{:.1f}"),
    ("requests_per_checkpoint", "{:.1f}"),
    ("restart_s", "{:.2f}"),
    ("wall_s", "{:.1f}"),
]
# The env and mpi launchers' own: the largest agent's peak memory, what the machine's
# available memory fell by, and the first process's start to the last's end.
ENV_COLUMNS = [("agent_rss_mib", "{:.1f}"), ("mem_used_mib", "{:.0f}"), ("launch_wall_s", "{:.1f}")]


def run(bench, storage, ranks, args, launcher, env=None):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [
            bench,
            "--storage",
            storage,
            "--ranks",
            ranks,
            "--rounds",
            str(args.rounds),
            "--fail-round",
            str(args.fail_round),
            "--file-kib",
            str(args.file_kib),
            "--launcher",
            launcher,
            "--json",
            out.name,
        ]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-4000:])
            raise SystemExit("scale_run: {} failed on {}".format(bench, storage))
        with open(out.name) as f:
            return json.load(f)


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--bench", required=True, help="build/bench/scale_bench")
    ap.add_argument("--dir", required=True, help="a folder on the disk to measure")
    ap.add_argument("--ranks", default="8,64,256,1024")
    ap.add_argument(
        "--s3-ranks",
        default="8,64,256",
        help="rank counts on moto (one Python process serves every request)",
    )
    ap.add_argument(
        "--s3-prefixes",
        default="1",
        help='comma separated CAIRN_S3_PREFIXES values to run s3 with (docs/s3.md, "Many ranks")',
    )
    ap.add_argument("--storages", default="tmpfs,disk,s3")
    ap.add_argument(
        "--launchers",
        default="local",
        help="comma separated: local, env (torchrun-style: one process per "
        "rank), mpi (the same processes started by mpirun)",
    )
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--fail-round", type=int, default=3)
    ap.add_argument("--file-kib", type=int, default=64)
    ap.add_argument("--json", help="write every figure here")
    args = ap.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(
        "open files: soft limit {}, hard limit {} (the driver raises the soft one as it "
        "needs)".format(soft, hard)
    )
    results = {}
    storages = args.storages.split(",")
    launchers = args.launchers.split(",")

    def each_launcher(storage, ranks, env=None):
        for launcher in launchers:
            key = storage if launcher == "local" else "{}/{}".format(storage, launcher)
            results[key] = run(args.bench, storage_uri, ranks, args, launcher, env)

    if "tmpfs" in storages:
        storage_uri = tempfile.mkdtemp(prefix="cairn-scale-", dir="/dev/shm")
        try:
            each_launcher("tmpfs", args.ranks)
        finally:
            shutil.rmtree(storage_uri, ignore_errors=True)
    if "disk" in storages:
        os.makedirs(args.dir, exist_ok=True)
        storage_uri = tempfile.mkdtemp(prefix="cairn-scale-", dir=args.dir)
        try:
            each_launcher("disk", args.ranks)
        finally:
            shutil.rmtree(storage_uri, ignore_errors=True)
    if "s3" in storages:
        with MotoS3(bucket="scale") as s3:
            env = dict(
                os.environ,
                AWS_ENDPOINT_URL_S3=s3.endpoint,
                AWS_ACCESS_KEY_ID=ACCESS_KEY,
                AWS_SECRET_ACCESS_KEY=SECRET_KEY,
                AWS_REGION="us-east-1",
            )
            for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
                env.pop(k, None)
            for prefixes in args.s3_prefixes.split(","):
                storage_uri = "s3://scale/runs{}".format(prefixes)
                env["CAIRN_S3_PREFIXES"] = prefixes
                each_launcher("s3" if prefixes == "1" else "s3/p" + prefixes, args.s3_ranks, env)

    print(
        "{} rounds with a checkpoint each, one file of {} KiB per rank, one rank killed in "
        "round {}; medians of the rounds after the restart".format(
            args.rounds, args.file_kib, args.fail_round
        )
    )
    columns = COLUMNS + (ENV_COLUMNS if set(launchers) & {"env", "mpi"} else [])
    header = ["storage"] + [c for c, _ in columns]
    print(" ".join("{:>12}".format(h[:12]) for h in header))
    for storage, rows in results.items():
        for row in rows:
            cells = [storage] + [fmt.format(row[c]) if c in row else "-" for c, fmt in columns]
            print(" ".join("{:>12}".format(c) for c in cells))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
