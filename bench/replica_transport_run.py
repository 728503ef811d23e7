#!/usr/bin/env python3
"""Moves a memory-tier replica between two processes over each transport
issue 28 names, in one run, and prints them side by side
(docs/memory-tier.md, "The replica transport, measured").

- MPI point-to-point (bench/replica_transport_bench under mpirun -np 2),
  with Open MPI's shared-memory layer (vader) and with its TCP layer over
  loopback (what two hosts would use without InfiniBand);
- torch.distributed's Gloo backend, the process group the Trainer's
  workers already have, sending the same chunks as uint8 tensors.

Each sends --mib MiB in --chunk-mib chunks, a few at a time, and times the
steady-state rounds (the first is not counted); memcpy of the same buffer,
timed in the MPI runs, is the reference.

    .venv/bin/python3 bench/replica_transport_run.py \\
        --bench build/bench/replica_transport_bench --mib 1024
"""

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time


def mpi(bench, btl, args):
    # As tests/support/mpirun.h starts processes on this machine.
    cmd = [
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
        "--mca",
        "btl",
        btl,
    ]
    if "tcp" in btl:
        cmd += ["--mca", "btl_tcp_if_include", "lo"]
    cmd += [
        bench,
        "--mib",
        str(args.mib),
        "--chunk-mib",
        str(args.chunk_mib),
        "--in-flight",
        str(args.in_flight),
        "--rounds",
        str(args.rounds),
    ]
    out = subprocess.run(
        cmd, check=True, stdout=subprocess.PIPE, text=True, timeout=args.timeout
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def gloo_worker(rank, port, args):
    import torch.distributed as dist

    import torch

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    nbytes = args.mib << 20
    chunk = min(nbytes, args.chunk_mib << 20)
    buf = torch.ones(nbytes, dtype=torch.uint8)  # touched before the first round
    times = []
    for r in range(args.rounds):
        dist.barrier()
        start = time.monotonic()
        window = []
        for at in range(0, nbytes, chunk):
            piece = buf[at : at + chunk]
            window.append(dist.isend(piece, 1) if rank == 0 else dist.irecv(piece, 0))
            while len(window) >= args.in_flight:
                window.pop(0).wait()
        for w in window:
            w.wait()
        ack = torch.zeros(1, dtype=torch.int32)
        if rank == 1:
            dist.send(ack, 0)
        else:
            dist.recv(ack, 1)
            if r > 0:
                times.append(time.monotonic() - start)
    dist.destroy_process_group()
    if rank == 0:
        s = statistics.median(times)
        print(json.dumps({"send_s": s, "send_gib_per_s": args.mib / 1024 / s}))


def gloo(args):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--gloo-rank",
                str(rank),
                "--gloo-port",
                str(port),
                "--mib",
                str(args.mib),
                "--chunk-mib",
                str(args.chunk_mib),
                "--in-flight",
                str(args.in_flight),
                "--rounds",
                str(args.rounds),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outs = [p.communicate(timeout=args.timeout)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("replica_transport_run: the Gloo processes failed")
    return json.loads(outs[0].strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--bench", default="build/bench/replica_transport_bench")
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--chunk-mib", type=int, default=64)
    ap.add_argument("--in-flight", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--gloo-rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--gloo-port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.gloo_rank is not None:
        gloo_worker(args.gloo_rank, args.gloo_port, args)
        return
    rows = []
    for name, btl in (
        ("MPI, shared memory (vader)", "self,vader"),
        ("MPI, TCP over loopback", "self,tcp"),
    ):
        r = mpi(args.bench, btl, args)
        rows.append(
            (name, r["send_gib_per_s"], r["memcpy_gib_per_s"], r["replica_s"], r["check_s"])
        )
    memcpy = statistics.median(r[2] for r in rows)
    g = gloo(args)
    rows.append(("torch.distributed Gloo (TCP, loopback)", g["send_gib_per_s"], None, None, None))
    print(
        f"{args.mib} MiB in {args.chunk_mib} MiB messages, {args.in_flight} in flight, "
        f"median of {args.rounds - 1} rounds; memcpy in the same run: {memcpy:.2f} GiB/s"
    )
    print(
        f"{'transport':42} {'send GiB/s':>10} {'vs memcpy':>9} {'replica s':>9} "
        f"{'of it XXH3 s':>12}"
    )
    for name, send, _, replica, check in rows:
        print(
            f"{name:42} {send:10.2f} {memcpy / send:8.1f}x "
            f"{'' if replica is None else f'{replica:9.3f}'} "
            f"{'' if check is None else f'{check:12.3f}'}"
        )


if __name__ == "__main__":
    main()
