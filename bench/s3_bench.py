#!/usr/bin/env python3
"""Upload and download of one checkpoint to and from an S3 server: aws-cli,
rclone and Cairn (`cairn cp`) side by side, next to the server's own ceiling.

Usage:
  s3_bench.py [--cairn PATH] [--size-gib 2] [--runs 3] [--stat median|best]
              [--dir DIR] [--json FILE] [--aws /usr/bin/aws] [--rclone rclone]
              [--ceiling-threads 16] [--ceiling-piece-mib 16] [--tools LIST] [--smoke]

One moto S3 server (tests/support/moto_s3.py, from the project's venv) is
started on 127.0.0.1; it keeps objects in its memory and its temporary
files. The checkpoint is a committed Cairn checkpoint written here: random
bytes in one large file (half the size) and four medium ones under a subfolder,
plus `.cairn/manifest.json` with the XXH3-64 of each
file (the format of src/checkpoint/manifest.cc). Every tool moves the same
files, manifest included:

  ceiling  python http.client threads straight at the server, no signing: the
           same bytes as independent PUTs / GETs of --ceiling-piece-mib pieces
           on --ceiling-threads connections, written back into files; the
           fastest any client can go against this server (it skips
           multipart bookkeeping, which the server pays on completion)
  aws-cli  aws s3 cp --recursive, default transfer settings
  rclone   rclone copy, default settings, remote from RCLONE_CONFIG_* variables
  rclone-parts
           the same with --s3-upload-cutoff and --s3-chunk-size at Cairn's
           16 MiB: every file above 16 MiB sent as a multipart upload of
           16 MiB parts, as `cairn cp` sends it (at its defaults rclone sends
           files below 200 MiB in one PUT, which the server stores without the
           copy it makes of a multipart upload's parts on completion)
  cairn    cairn cp --no-progress LOCAL s3://bench/P and back, with the
           endpoint in AWS_ENDPOINT_URL_S3; if the given binary has no working
           `cp`, its row says why, and no figure is printed for it

Each run times every tool once, in turn (upload, then download, then the
upload is deleted), so drift over the run hits all of them alike. Before
every timed step the file systems are synced and the page cache of the
bytes to be read is dropped (posix_fadvise DONTNEED on the local files
before an upload, on the server's files before a download; the tools' own
programs stay cached); a step ends when the tool exits (downloads are not fsync'ed). Every download
is checked against the manifest after timing. Figures are MiB/s of the
checkpoint's bytes; the table gives the median (or best, --stat best) of
--runs runs and the ratio to aws-cli's figure of the same statistic.
Everything written (local files, the server's data) is deleted at the end.

--smoke: 16 MiB, 1 run: checks that every row is produced (a Cairn without
`cp` is allowed to say so). Used by the CTest test s3_bench_smoke.
"""

import argparse
import concurrent.futures
import datetime
import http.client
import json
import os
import platform
import queue
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import xml.etree.ElementTree as ET

import xxhash  # python3-xxhash (scripts/install-deps.sh)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "support"))
from cache import evict_files
from s3_servers import ACCESS_KEY, SECRET_KEY, MotoS3

MiB = 1 << 20
# `cairn cp`'s part and ranged-GET size (TransferOptions::chunk_size's default).
CAIRN_CHUNK = 16 * MiB
BUCKET = "bench"
REGION = "us-east-1"
MANIFEST = os.path.join(".cairn", "manifest.json")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# --- the checkpoint -----------------------------------------------------------


def layout(total):
    """(path, size) of the checkpoint's files: one large file of half the
    bytes and four medium ones sharing the rest."""
    large = total // 2
    medium = (total - large) // 4
    files = [("model.safetensors", large)]
    files += [("optimizer/shard-{}-of-4.bin".format(i), medium) for i in range(4)]
    return files


def write_checkpoint(root, total):
    """Writes random files and a Cairn manifest; returns the manifest's
    entries (path, size, xxh3 hex) and the total bytes on disk."""
    entries = []
    block = 16 * MiB
    for path, size in layout(total):
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        h = xxhash.xxh3_64()
        with open(full, "wb") as f:
            left = size
            while left:
                data = os.urandom(min(block, left))
                h.update(data)
                f.write(data)
                left -= len(data)
            f.flush()
            os.fsync(f.fileno())
        entries.append({"path": path, "size": size, "xxh3": h.hexdigest()})
    entries.sort(key=lambda e: e["path"])
    manifest = {
        "format": "cairn-checkpoint",
        "version": 1,
        "created_at": time.time(),
        "metrics": {},
        "files": entries,
    }
    os.makedirs(os.path.join(root, ".cairn"), exist_ok=True)
    with open(os.path.join(root, MANIFEST), "w") as f:
        f.write(json.dumps(manifest, indent=1))
        f.flush()
        os.fsync(f.fileno())
    return entries, tree_bytes(root)


def tree_files(root):
    out = []
    for d, _, names in os.walk(root):
        for n in names:
            full = os.path.join(d, n)
            out.append((os.path.relpath(full, root), full))
    return sorted(out)


def tree_bytes(root):
    return sum(os.path.getsize(full) for _, full in tree_files(root))


def check_download(root, entries):
    """Raises if a file of the manifest is missing or differs."""
    for e in entries:
        full = os.path.join(root, e["path"])
        if not os.path.isfile(full) or os.path.getsize(full) != e["size"]:
            raise RuntimeError("{}: missing or wrong size after download".format(e["path"]))
        h = xxhash.xxh3_64()
        with open(full, "rb") as f:
            while True:
                data = f.read(16 * MiB)
                if not data:
                    break
                h.update(data)
        if h.hexdigest() != e["xxh3"]:
            raise RuntimeError("{}: checksum differs after download".format(e["path"]))
    if not os.path.isfile(os.path.join(root, MANIFEST)):
        raise RuntimeError(MANIFEST + ": missing after download")


# --- the server ---------------------------------------------------------------


def raw(port, method, path, body=None, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def delete_prefix(port, prefix):
    """Deletes every object under prefix (unsigned requests; the bench bucket allows
    them), and any multipart upload a failed tool left behind."""
    ns = "{http://doc.s3.amazonaws.com/2006-03-01/}"
    while True:
        status, body = raw(
            port,
            "GET",
            "/{}?list-type=2&prefix={}".format(BUCKET, urllib.parse.quote(prefix, safe="")),
        )
        if status != 200:
            raise RuntimeError("listing {}: HTTP {}".format(prefix, status))
        keys = [k.text for k in ET.fromstring(body).iter(ns + "Key")]
        if not keys:
            break
        for k in keys:
            raw(port, "DELETE", "/{}/{}".format(BUCKET, urllib.parse.quote(k)))
    status, body = raw(
        port, "GET", "/{}?uploads&prefix={}".format(BUCKET, urllib.parse.quote(prefix, safe=""))
    )
    if status == 200:
        root = ET.fromstring(body)
        for up in root.iter(ns + "Upload"):
            raw(
                port,
                "DELETE",
                "/{}/{}?uploadId={}".format(
                    BUCKET,
                    urllib.parse.quote(up.findtext(ns + "Key")),
                    urllib.parse.quote(up.findtext(ns + "UploadId")),
                ),
            )


# --- the tools ----------------------------------------------------------------


class Unavailable(Exception):
    """The tool cannot be measured here; the message says why."""


def child_env(**extra):
    """The environment of a tool: the server is plain http on 127.0.0.1, so
    no proxy, no CA bundle (rclone refuses AWS_CA_BUNDLE outright) and no
    instance metadata service apply."""
    env = dict(
        os.environ,
        NO_PROXY="127.0.0.1",
        no_proxy="127.0.0.1",
        AWS_EC2_METADATA_DISABLED="true",
        **extra,
    )
    for k in (
        "AWS_PROFILE",
        "AWS_CA_BUNDLE",
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
    ):
        env.pop(k, None)
    return env


def run_tool(cmd, env):
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError(
            "{} exited with {}: {}".format(
                os.path.basename(cmd[0]), proc.returncode, " | ".join(tail)
            )
        )


class AwsCli:
    name = "aws-cli"

    def __init__(self, binary, endpoint, scratch):
        self.binary = binary
        self.endpoint = endpoint
        self.env = child_env(
            AWS_ACCESS_KEY_ID=ACCESS_KEY,
            AWS_SECRET_ACCESS_KEY=SECRET_KEY,
            AWS_REGION=REGION,
            AWS_DEFAULT_REGION=REGION,
            # No user configuration: default transfer settings.
            AWS_CONFIG_FILE=os.path.join(scratch, "aws-config-none"),
            AWS_SHARED_CREDENTIALS_FILE=os.path.join(scratch, "aws-cred-none"),
            AWS_PAGER="",
        )

    def version(self):
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True)
        if out.returncode != 0:
            raise Unavailable("{} --version failed".format(self.binary))
        return out.stdout.strip().split()[0]

    def cmd(self, src, dst):
        return [
            self.binary,
            "--endpoint-url",
            self.endpoint,
            "s3",
            "cp",
            "--recursive",
            "--only-show-errors",
            "--no-progress",
            src,
            dst,
        ]

    def upload(self, local, prefix):
        run_tool(self.cmd(local, "s3://{}/{}/".format(BUCKET, prefix)), self.env)

    def download(self, prefix, local):
        run_tool(self.cmd("s3://{}/{}/".format(BUCKET, prefix), local), self.env)


class Rclone:
    name = "rclone"

    def __init__(self, binary, endpoint, scratch):
        self.binary = binary
        self.env = child_env(
            RCLONE_CONFIG=os.path.join(scratch, "rclone-none.conf"),
            RCLONE_CONFIG_BENCHS3_TYPE="s3",
            RCLONE_CONFIG_BENCHS3_PROVIDER="Other",
            RCLONE_CONFIG_BENCHS3_ENDPOINT=endpoint,
            RCLONE_CONFIG_BENCHS3_ACCESS_KEY_ID=ACCESS_KEY,
            RCLONE_CONFIG_BENCHS3_SECRET_ACCESS_KEY=SECRET_KEY,
            RCLONE_CONFIG_BENCHS3_REGION=REGION,
            RCLONE_CONFIG_BENCHS3_FORCE_PATH_STYLE="true",
            RCLONE_CONFIG_BENCHS3_ENV_AUTH="false",
        )

    def version(self):
        out = subprocess.run([self.binary, "version"], capture_output=True, text=True)
        if out.returncode != 0:
            raise Unavailable("{} version failed".format(self.binary))
        return out.stdout.splitlines()[0].strip()

    extra = []

    def upload(self, local, prefix):
        run_tool(
            [self.binary, "copy", local, "benchs3:{}/{}".format(BUCKET, prefix)] + self.extra,
            self.env,
        )

    def download(self, prefix, local):
        run_tool(
            [self.binary, "copy", "benchs3:{}/{}".format(BUCKET, prefix), local] + self.extra,
            self.env,
        )


class RcloneParts(Rclone):
    """rclone cutting every file above CHUNK into CHUNK-sized parts, as
    `cairn cp` does. At its defaults rclone sends a file below 200 MiB as one
    PUT, and moto completes a multipart upload by joining every part into a
    new object and hashing it: a second pass over the bytes that S3 itself,
    whose completion only records the parts, does not make. This row moves
    the same requests as Cairn's."""

    name = "rclone-parts"

    def __init__(self, binary, endpoint, scratch, chunk):
        super().__init__(binary, endpoint, scratch)
        self.extra = [
            "--s3-upload-cutoff",
            "{}M".format(chunk // MiB),
            "--s3-chunk-size",
            "{}M".format(chunk // MiB),
        ]


class Cairn:
    name = "cairn"

    def __init__(self, binary, endpoint):
        self.binary = binary
        self.env = child_env(
            AWS_ENDPOINT_URL_S3=endpoint,
            AWS_ACCESS_KEY_ID=ACCESS_KEY,
            AWS_SECRET_ACCESS_KEY=SECRET_KEY,
            AWS_REGION=REGION,
        )

    def version(self):
        if not self.binary:
            raise Unavailable("no --cairn given")
        if not (os.path.isfile(self.binary) and os.access(self.binary, os.X_OK)):
            raise Unavailable("{} is not an executable".format(self.binary))
        # An unknown subcommand's --help prints the top-level help and exits
        # 0, so look for `cp` in the list of subcommands.
        out = subprocess.run([self.binary, "--help"], capture_output=True, text=True)
        if out.returncode != 0:
            raise Unavailable("{} --help exited with {}".format(self.binary, out.returncode))
        if not re.search(r"^\s+cp\s", out.stdout, re.M):
            raise Unavailable("this build of cairn has no `cp` command")
        v = subprocess.run([self.binary, "--version"], capture_output=True, text=True)
        return v.stdout.strip() or "cairn"

    def check_source(self, local):
        """`cairn verify` on the checkpoint this script wrote: a manifest
        Cairn would reject would make its figures meaningless."""
        run_tool([self.binary, "verify", local], self.env)

    def upload(self, local, prefix):
        run_tool(
            [self.binary, "cp", "--no-progress", local, "s3://{}/{}".format(BUCKET, prefix)],
            self.env,
        )

    def download(self, prefix, local):
        run_tool(
            [self.binary, "cp", "--no-progress", "s3://{}/{}".format(BUCKET, prefix), local],
            self.env,
        )


class Ceiling:
    """Unsigned parallel PUT / GET of the checkpoint's bytes cut into pieces:
    the server's data path and nothing else. Each connection has one piece
    buffer, allocated and touched once before any timing (first touch of
    fresh memory is slow here, PERF-NOTES), so a piece is read into it and
    sent, or received into it and written, without new memory."""

    name = "ceiling"

    def __init__(self, port, threads, piece):
        self.port = port
        self.threads = threads
        self.piece = piece
        self.free = queue.SimpleQueue()
        for _ in range(threads):
            buf = bytearray(piece)
            buf[::4096] = b"\1" * len(range(0, piece, 4096))
            self.free.put((buf, [None]))  # buffer, connection
        self.pieces = {}  # prefix -> [(relpath, offset, size, key)]

    def version(self):
        return "python {} http.client, {} connections, {} MiB pieces".format(
            platform.python_version(), self.threads, self.piece // MiB
        )

    def slot(self):
        buf, conn = self.free.get()
        if conn[0] is None:
            conn[0] = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        return buf, conn

    def close_all(self):
        slots = [self.free.get() for _ in range(self.threads)]
        for buf, conn in slots:
            if conn[0] is not None:
                conn[0].close()
                conn[0] = None
            self.free.put((buf, conn))

    def each(self, fn, plan):
        with concurrent.futures.ThreadPoolExecutor(self.threads) as pool:
            try:
                list(pool.map(fn, plan))
            finally:
                pool.shutdown(wait=True)
                self.close_all()

    def upload(self, local, prefix):
        plan = []
        for rel, full in tree_files(local):
            size = os.path.getsize(full)
            for i, off in enumerate(range(0, max(size, 1), self.piece)):
                plan.append(
                    (
                        rel,
                        off,
                        min(self.piece, size - off),
                        "{}/{}.part{:05d}".format(prefix, rel, i),
                    )
                )
        self.pieces[prefix] = plan

        def put(item):
            rel, off, size, key = item
            buf, conn = self.slot()
            try:
                view = memoryview(buf)[:size]
                fd = os.open(os.path.join(local, rel), os.O_RDONLY)
                try:
                    if os.preadv(fd, [view], off) != size:
                        raise RuntimeError("{}: short read".format(rel))
                finally:
                    os.close(fd)
                conn[0].request("PUT", "/{}/{}".format(BUCKET, urllib.parse.quote(key)), view)
                resp = conn[0].getresponse()
                resp.read()
                if resp.status != 200:
                    raise RuntimeError("PUT {}: HTTP {}".format(key, resp.status))
            finally:
                self.free.put((buf, conn))

        self.each(put, plan)

    def download(self, prefix, local):
        plan = self.pieces[prefix]
        for rel in {p[0] for p in plan}:
            full = os.path.join(local, rel)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "wb"):
                pass

        def get(item):
            rel, off, size, key = item
            buf, conn = self.slot()
            try:
                conn[0].request("GET", "/{}/{}".format(BUCKET, urllib.parse.quote(key)))
                resp = conn[0].getresponse()
                if resp.status != 200:
                    resp.read()
                    raise RuntimeError("GET {}: HTTP {}".format(key, resp.status))
                view = memoryview(buf)[:size]
                got = 0
                while got < size:
                    n = resp.readinto(view[got:])
                    if not n:
                        raise RuntimeError("GET {}: short body".format(key))
                    got += n
                resp.read()
                fd = os.open(os.path.join(local, rel), os.O_WRONLY)
                try:
                    os.pwrite(fd, view, off)
                finally:
                    os.close(fd)
            finally:
                self.free.put((buf, conn))

        self.each(get, plan)


# --- the run ------------------------------------------------------------------


def evict(paths):
    """Writes back and drops the page cache of the benchmark's own files (not
    the whole cache, which would also make each tool's own start-up cold)."""
    return evict_files(paths)


def timed(step, paths):
    method = evict(paths)
    start = time.monotonic()
    step()
    return time.monotonic() - start, method


def mibps(nbytes, seconds):
    return nbytes / MiB / seconds if seconds and seconds > 0 else None


def fmt(x, spec="{:.1f}"):
    return "-" if x is None else spec.format(x)


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--cairn", help="the cairn CLI (e.g. build/src/cli/cairn)")
    ap.add_argument("--size-gib", type=float, default=2.0, help="checkpoint size (default 2)")
    ap.add_argument("--runs", type=int, default=3, help="runs of every tool (default 3)")
    ap.add_argument(
        "--stat",
        choices=("median", "best"),
        default="median",
        help="which run the table reports (default median)",
    )
    ap.add_argument("--dir", help="local scratch directory (default: a new temp dir)")
    ap.add_argument("--json", help="write every run's figures here")
    ap.add_argument("--aws", default="/usr/bin/aws", help="aws-cli v2 (default /usr/bin/aws)")
    ap.add_argument("--rclone", default=shutil.which("rclone") or "rclone")
    ap.add_argument("--ceiling-threads", type=int, default=16)
    ap.add_argument("--ceiling-piece-mib", type=int, default=16)
    ap.add_argument(
        "--tools",
        default="ceiling,aws-cli,rclone,rclone-parts,cairn",
        help="which rows to measure (default all; aws-cli is the reference)",
    )
    ap.add_argument("--smoke", action="store_true", help="16 MiB, 1 run")
    args = ap.parse_args()
    if args.smoke:
        args.size_gib, args.runs = 16 / 1024, 1
    total = int(args.size_gib * (1 << 30))

    base = args.dir or tempfile.gettempdir()
    os.makedirs(base, exist_ok=True)
    if shutil.disk_usage(base).free < 3 * total + (1 << 30):
        raise SystemExit(
            "s3_bench.py: {} has {:.1f} GB free; need {:.1f} GB".format(
                base, shutil.disk_usage(base).free / 1e9, (3 * total + (1 << 30)) / 1e9
            )
        )
    # A fresh directory of our own, so cleaning up never touches anything else.
    work = tempfile.mkdtemp(prefix="cairn-s3-bench-", dir=base)
    results = {}
    try:
        src = os.path.join(work, "checkpoint")
        log("writing a {:.3f} GiB checkpoint to {}".format(total / (1 << 30), src))
        entries, nbytes = write_checkpoint(src, total)
        with MotoS3(bucket=BUCKET) as s3:
            tools = [
                Ceiling(s3.port, args.ceiling_threads, args.ceiling_piece_mib * MiB),
                AwsCli(args.aws, s3.endpoint, work),
                Rclone(args.rclone, s3.endpoint, work),
                RcloneParts(args.rclone, s3.endpoint, work, CAIRN_CHUNK),
                Cairn(args.cairn, s3.endpoint),
            ]
            wanted = set(args.tools.split(","))
            unknown = wanted - {t.name for t in tools}
            if unknown:
                raise SystemExit("s3_bench.py: unknown --tools " + ",".join(sorted(unknown)))
            tools = [t for t in tools if t.name in wanted]
            for t in tools:
                try:
                    results[t.name] = {
                        "version": t.version(),
                        "upload_s": [],
                        "download_s": [],
                        "error": None,
                    }
                except (Unavailable, OSError) as e:
                    results[t.name] = {"version": None, "error": "not available ({})".format(e)}
            if "cairn" in results and not results["cairn"]["error"]:
                tools[-1].check_source(src)
            for run in range(1, args.runs + 1):
                for t in tools:
                    r = results[t.name]
                    if r["error"]:
                        continue
                    prefix = "{}-{}".format(t.name, run)
                    dst = os.path.join(work, "download-" + prefix)
                    log("run {}: {} upload".format(run, t.name))
                    try:
                        up, method = timed(
                            lambda: t.upload(src, prefix), [f for _, f in tree_files(src)]
                        )
                        log("run {}: {} download".format(run, t.name))
                        down, _ = timed(lambda: t.download(prefix, dst), [])
                        check_download(dst, entries)
                        log(
                            "run {}: {} upload {:.2f} s, download {:.2f} s".format(
                                run, t.name, up, down
                            )
                        )
                        r["upload_s"].append(up)
                        r["download_s"].append(down)
                        r["cache_drop"] = method
                    except RuntimeError as e:
                        r["error"] = "failed ({})".format(e)
                        log("{}: {}".format(t.name, r["error"]))
                    finally:
                        shutil.rmtree(dst, ignore_errors=True)
                        delete_prefix(s3.port, prefix + "/")
                        if t.name == "ceiling":
                            t.pieces.pop(prefix, None)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    pick = statistics.median if args.stat == "median" else min
    for r in results.values():
        ok = not r["error"] and r.get("upload_s")
        r["upload_mibps"] = mibps(nbytes, pick(r["upload_s"])) if ok else None
        r["download_mibps"] = mibps(nbytes, pick(r["download_s"])) if ok else None
    ref = results.get("aws-cli", {})
    for r in results.values():
        for d in ("upload", "download"):
            a, b = r[d + "_mibps"], ref.get(d + "_mibps")
            r[d + "_vs_aws"] = a / b if a is not None and b else None

    print()
    print(
        "S3 benchmark: a {:.3f} GiB checkpoint ({} files + manifest) to and from one moto server "
        "on 127.0.0.1, {} of {} run(s), page cache dropped before each step".format(
            nbytes / (1 << 30), len(entries), args.stat, args.runs
        )
    )
    print()
    hdr = "{:<12} {:>12} {:>14} {:>11} {:>13}  {}".format(
        "tool", "upload MiB/s", "download MiB/s", "up vs aws", "down vs aws", "version"
    )
    print(hdr)
    print("-" * len(hdr))
    for name in ("ceiling", "aws-cli", "rclone", "rclone-parts", "cairn"):
        if name not in results:
            continue
        r = results[name]
        if r["error"]:
            print("{:<12} {}".format(name + ":", r["error"]))
            continue
        print(
            "{:<12} {:>12} {:>14} {:>11} {:>13}  {}".format(
                name,
                fmt(r["upload_mibps"]),
                fmt(r["download_mibps"]),
                fmt(r["upload_vs_aws"], "{:.2f}"),
                fmt(r["download_vs_aws"], "{:.2f}"),
                r["version"],
            )
        )
    print()
    print(
        "MiB/s of the checkpoint's {} bytes; ratios are against aws-cli's {} in the same "
        "run. ceiling: unsigned parallel PUT/GET of the same bytes, the server's limit.".format(
            nbytes, args.stat
        )
    )
    # The raw client competes for the same cores as the server; when a tool
    # beats it, the server's limit is at least that tool's figure: say so
    # rather than print a "ceiling" that is not one.
    ceil = results.get("ceiling", {})
    for name, r in results.items():
        for d in ("upload", "download"):
            a, c = r.get(d + "_mibps"), ceil.get(d + "_mibps")
            if name != "ceiling" and a is not None and c is not None and a > c:
                print(
                    "note: {}'s {} ({:.1f} MiB/s) beat the ceiling row ({:.1f} MiB/s): the "
                    "raw client was CPU-bound in this run, and the server's {} limit is at "
                    "least {:.1f} MiB/s.".format(name, d, a, c, d, a)
                )

    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": {
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
        },
        "config": {
            "bytes": nbytes,
            "files": [e["path"] for e in entries],
            "runs": args.runs,
            "stat": args.stat,
            "ceiling_threads": args.ceiling_threads,
            "ceiling_piece_mib": args.ceiling_piece_mib,
            "smoke": args.smoke,
        },
        "results": results,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print("report written to " + args.json)
    if args.smoke:
        missing = [
            n
            for n in ("ceiling", "aws-cli", "rclone")
            if n not in results or results[n]["error"] or results[n]["upload_mibps"] is None
        ]
        cairn = results.get("cairn", {"error": None})
        if cairn["error"] and not cairn["error"].startswith("not available"):
            missing.append("cairn")
        if missing:
            raise SystemExit("s3_bench.py --smoke: no figures for " + ", ".join(missing))


if __name__ == "__main__":
    main()
