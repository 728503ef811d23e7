#!/usr/bin/env python3
"""Recovery of a job across two hosts, by the tier that serves the restore.

Runs bench/tier_hosts_bench (built in build/bench) under mpirun, one process
per "host": each MPI process gets its own host name (a UTS namespace) and
its own memory (a folder of /dev/shm bind-mounted at the tier's root in a
mount namespace of its own), as the MPI tests do. Needs root. Each round and
mode:

  1. the save phase: the ranks report one checkpoint of --state-mib MiB each;
  2. every process of the job is SIGKILLed (the time noted);
  3. what the mode loses is dropped:
       memory      nothing: both hosts' memory holds the checkpoint
       peer        host 1's memory: its rank's file comes from host 0's replica
                   (every file of the checkpoint is moved there)
       peer_own    the same with MemoryTierConfig::ranks_read_own_files: only
                   host 1's rank's file is moved there
       disk        no memory tier; the page cache evicted
       s3          no memory tier; the experiment on moto's S3 server (started here)
  4. the restore phase (a new mpirun, Trainer::restore), whose ranks note
     their first step after loading their state back, checked.

Recovery is the restore job's start (mpirun) to the last rank's first step:
the same launch in every mode, then the tier's part, with what step 3 does
(the bench's own work) left out. Printed: medians, and the ratio of each
mode to memory (docs/memory-tier.md; docs/benchmarks.md).
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))

from s3_servers import ACCESS_KEY, SECRET_KEY, MotoS3

MPIRUN = [
    "mpirun",
    "--allow-run-as-root",
    "--oversubscribe",
    "-np",
    "2",
    "--bind-to",
    "none",
    "--mca",
    "btl_vader_single_copy_mechanism",
    "none",
]


def wrapper(hosts, tiers):
    """Each process: its own host name, and hosts/<host> mounted at `tiers`."""
    script = (
        "h=bench-node$OMPI_COMM_WORLD_RANK && hostname $h && mkdir -p {0}/$h {1} && "
        'mount --bind {0}/$h {1} && exec "$@"'
    ).format(hosts, tiers)
    return ["unshare", "--uts", "--mount", "sh", "-c", script, "sh"]


def read(path):
    with open(path) as f:
        return f.read().strip()


def wait_for(path, proc, limit_s):
    deadline = time.monotonic() + limit_s
    while not os.path.exists(path):
        if proc.poll() is not None:
            log = os.path.join(os.path.dirname(os.path.dirname(path)), "save.log")
            with open(log) as f:
                sys.stderr.write(f.read()[-6000:])
            raise SystemExit("tier_hosts_run: the job ended before {} appeared".format(path))
        if time.monotonic() > deadline:
            raise SystemExit("tier_hosts_run: {} did not appear within {} s".format(path, limit_s))
        time.sleep(0.01)


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def one_round(args, mode, storage, env_vars):
    work = tempfile.mkdtemp(prefix="cairn-tier-hosts-", dir=args.dir)
    memory = tempfile.mkdtemp(prefix="cairn-tier-hosts-", dir=args.memory)
    try:
        marks = os.path.join(work, "marks")
        tiers = os.path.join(work, "tiers")
        os.makedirs(marks)
        if storage is None:
            storage = os.path.join(work, "storage")
        bench = [
            args.bench,
            "--storage",
            storage,
            "--marks",
            marks,
            "--state-mib",
            str(args.state_mib),
        ]
        if mode in ("memory", "peer", "peer_own"):
            bench += ["--tier-root", tiers]
        if mode == "peer_own":
            bench += ["--own-files"]
        mpirun = MPIRUN + [x for name in env_vars for x in ("-x", name)]
        command = mpirun + wrapper(memory, tiers) + bench
        env = dict(os.environ, **env_vars)
        with open(os.path.join(work, "save.log"), "w") as log:
            save = subprocess.Popen(
                command + ["--phase", "save"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                wait_for(os.path.join(marks, "saved"), save, 600)
                for rank in (0, 1):
                    os.kill(int(read(os.path.join(marks, "pid-{}".format(rank)))), signal.SIGKILL)
                save.wait(timeout=120)
            finally:
                if save.poll() is None:
                    os.killpg(save.pid, signal.SIGKILL)
                    save.wait()
        if mode in ("peer", "peer_own"):
            shutil.rmtree(os.path.join(memory, "bench-node1"))
        if mode in ("disk", "s3"):
            drop_caches()
        started = time.monotonic()
        restore = subprocess.run(
            command + ["--phase", "restore"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        if restore.returncode != 0:
            sys.stderr.write(restore.stdout[-6000:])
            raise SystemExit("tier_hosts_run: the restore failed ({})".format(mode))
        result = json.loads(read(os.path.join(marks, "result.json")))
        staged = [
            line.split("replicas: ", 1)[1]
            for line in restore.stdout.splitlines()
            if "from the replicas: " in line
        ]
        ranks = range(2)
        first = max(float(read(os.path.join(marks, "first_step_{}".format(r)))) for r in ranks)
        return {
            "recovery_s": first - started,
            "init_s": max(float(read(os.path.join(marks, "init_{}".format(r)))) for r in ranks),
            "load_s": max(float(read(os.path.join(marks, "load_{}".format(r)))) for r in ranks),
            "restored": result["restores"][0] if result["restores"] else None,
            "staged": staged[0] if staged else None,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(memory, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--bench", required=True, help="build/bench/tier_hosts_bench")
    ap.add_argument("--dir", required=True, help="a folder on the disk to measure")
    ap.add_argument("--memory", default="/dev/shm", help="RAM for the hosts' memory")
    ap.add_argument("--state-mib", type=int, default=2048, help="state per rank")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="memory,peer,peer_own,disk,s3")
    ap.add_argument("--json", help="write every figure here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("tier_hosts_run: needs root (namespaces and bind mounts make the hosts)")
    os.makedirs(args.dir, exist_ok=True)
    modes = args.modes.split(",")
    local = {"CAIRN_MPI_ADDRESS": "127.0.0.1"}
    rounds = {m: [] for m in modes}
    s3 = None
    try:
        if "s3" in modes:
            s3 = MotoS3(bucket="tierhosts").__enter__()
        for r in range(args.rounds):
            for mode in modes:
                if mode == "s3":
                    env = dict(
                        local,
                        AWS_ENDPOINT_URL_S3=s3.endpoint,
                        AWS_ACCESS_KEY_ID=ACCESS_KEY,
                        AWS_SECRET_ACCESS_KEY=SECRET_KEY,
                        AWS_REGION="us-east-1",
                    )
                    storage = "s3://tierhosts/round-{}".format(r)
                else:
                    env, storage = local, None
                got = one_round(args, mode, storage, env)
                rounds[mode].append(got)
                print(
                    "round {} {:>7}: recovery {:.3f} s, init {:.3f} s, load {:.3f} s, "
                    "restored {}{}".format(
                        r,
                        mode,
                        got["recovery_s"],
                        got["init_s"],
                        got["load_s"],
                        json.dumps(got["restored"]),
                        "; staged " + got["staged"] if got["staged"] else "",
                    ),
                    flush=True,
                )
    finally:
        if s3 is not None:
            s3.__exit__(None, None, None)

    med = {
        m: {
            k: statistics.median(x[k] for x in rounds[m])
            for k in ("recovery_s", "init_s", "load_s")
        }
        for m in modes
    }
    print(
        "recovery of a 2-host job after SIGKILL of every process (the restore job's start to "
        "the last rank's first step): {} MiB of state per rank, median of {} rounds".format(
            args.state_mib, args.rounds
        )
    )
    base = med.get("memory", {}).get("recovery_s")
    print(
        "{:>8} {:>12} {:>8} {:>8} {:>16}".format(
            "from", "recovery_s", "init_s", "load_s", "vs memory"
        )
    )
    for m in modes:
        ratio = "{:.2f}x".format(med[m]["recovery_s"] / base) if base else "-"
        print(
            "{:>8} {:>12.3f} {:>8.3f} {:>8.3f} {:>16}".format(
                m, med[m]["recovery_s"], med[m]["init_s"], med[m]["load_s"], ratio
            )
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"medians": med, "rounds": rounds}, f, indent=2)


if __name__ == "__main__":
    main()
