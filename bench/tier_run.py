#!/usr/bin/env python3
"""Recovery after a worker failure, by the tier that serves the restore.

Runs bench/tier_bench (built in build/bench) three ways in one run and prints
the medians side by side with their ratios to the memory tier:

  memory  the memory tier on /dev/shm (--tier-root), the experiment on --dir
  disk    the experiment on --dir, the page cache evicted before the kill
  s3      the experiment on moto's S3 server (tests/support/moto_s3.py, started here on
          127.0.0.1), its files' page cache evicted too

Recovery is the SIGKILL of rank 0 to the last rank's first step after
loading its state back (docs/memory-tier.md; docs/benchmarks.md).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))

from s3_servers import ACCESS_KEY, SECRET_KEY, MotoS3


def run(args, storage, dir_, tier_root=None, env=None):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [
            args.bench,
            "--storage",
            storage,
            "--dir",
            dir_,
            "--state-mib",
            str(args.state_mib),
            "--workers",
            str(args.workers),
            "--rounds",
            str(args.rounds),
            "--json",
            out.name,
        ]
        if tier_root:
            cmd += ["--tier-root", tier_root]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-4000:])
            raise SystemExit("tier_run: {} failed on {}".format(args.bench, storage))
        with open(out.name) as f:
            return json.load(f)


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--bench", required=True, help="build/bench/tier_bench")
    ap.add_argument("--dir", required=True, help="a folder on the disk to measure")
    ap.add_argument("--tier-root", default="/dev/shm")
    ap.add_argument("--state-mib", type=int, default=1024, help="state per rank")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--storages", default="memory,disk,s3")
    ap.add_argument("--json", help="write every figure here")
    args = ap.parse_args()

    os.makedirs(args.dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="cairn-tier-bench-", dir=args.dir)
    results = {}
    try:
        storages = args.storages.split(",")
        if "memory" in storages:
            results["memory"] = run(args, work, work, tier_root=args.tier_root)
        if "disk" in storages:
            results["disk"] = run(args, work, work)
        if "s3" in storages:
            with MotoS3(bucket="tier") as s3:
                env = dict(
                    os.environ,
                    AWS_ENDPOINT_URL_S3=s3.endpoint,
                    AWS_ACCESS_KEY_ID=ACCESS_KEY,
                    AWS_SECRET_ACCESS_KEY=SECRET_KEY,
                    AWS_REGION="us-east-1",
                )
                for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
                    env.pop(k, None)
                results["s3"] = run(args, "s3://tier/runs", work, env=env)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(
        "recovery after SIGKILL of rank 0: {} rank(s), {} MiB of state each, median of {} "
        "rounds".format(args.workers, args.state_mib, args.rounds)
    )
    base = results.get("memory", {}).get("recovery_s")
    base_load = results.get("memory", {}).get("load_s")
    print(
        "{:>8} {:>12} {:>8} {:>8} {:>18} {:>14}".format(
            "tier", "recovery_s", "init_s", "load_s", "recovery vs mem", "load vs mem"
        )
    )
    for name, r in results.items():
        ratio = "{:.2f}x".format(r["recovery_s"] / base) if base else "-"
        load_ratio = "{:.2f}x".format(r["load_s"] / base_load) if base_load else "-"
        print(
            "{:>8} {:>12.3f} {:>8.3f} {:>8.3f} {:>18} {:>14}".format(
                name, r["recovery_s"], r["init_s"], r["load_s"], ratio, load_ratio
            )
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
