"""Starting the S3 test server (s3rver) and the fault proxy from Python tests
and benchmarks, on 127.0.0.1, with nothing left behind.

  with S3rver(bucket="test") as s3, FaultProxy(s3.endpoint) as proxy:
      proxy.configure(rate=1.0, faults=["slowdown"])
      ... requests to proxy.endpoint ...
      proxy.stats()

Both are context managers: leaving the block stops the process (and removes
s3rver's data directory when it made one). On Linux both children also get
SIGKILL if the process that started them dies (PR_SET_PDEATHSIG), and the
proxy exits when its stdin, a pipe held here, closes.
"""
import ctypes
import http.client
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PROXY = os.path.join(HERE, "s3_fault_proxy.py")

# s3rver's only accepted access key; it does not check the secret.
ACCESS_KEY = "S3RVER"
SECRET_KEY = "S3RVER"


def _die_with_parent():
    """preexec_fn: SIGKILL this child when the thread that started it exits."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


# s3rver makes ListObjectsV2 continuation tokens with DES, which OpenSSL 3
# keeps in its legacy provider: without it, a listing of more than one page
# fails with 500 InternalError.

def install_s3rver():
    """Path of s3rver's entry script (installs the pinned version once)."""
    out = subprocess.run(["bash", os.path.join(ROOT, "scripts", "install-s3rver.sh")],
                         check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def _stop(proc, timeout=5.0):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class S3rver:
    """s3rver on 127.0.0.1 with one bucket; its port is picked by the system.

    data_dir: where objects are kept (default: a new temp dir, removed on
    exit; a given one is left in place)."""

    def __init__(self, bucket="test", data_dir=None, node="node", start_timeout=30.0):
        self.bucket = bucket
        self.node = node
        self.start_timeout = start_timeout
        self.given_dir = data_dir
        self.proc = None
        self.port = None
        self.tmp = None

    @property
    def endpoint(self):
        return "http://127.0.0.1:{}".format(self.port)

    def __enter__(self):
        entry = install_s3rver()
        self.tmp = tempfile.mkdtemp(prefix="cairn-s3rver-")
        data = self.given_dir or os.path.join(self.tmp, "data")
        os.makedirs(data, exist_ok=True)
        log_path = os.path.join(self.tmp, "s3rver.log")
        try:
            with open(log_path, "wb") as log:
                self.proc = subprocess.Popen(
                    [self.node, "--openssl-legacy-provider", entry, "-d", data, "-a", "127.0.0.1", "-p", "0",
                     "--configure-bucket", self.bucket, "--silent"],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    preexec_fn=_die_with_parent)
            deadline = time.monotonic() + self.start_timeout
            while self.port is None:
                with open(log_path, "rb") as f:
                    m = re.search(rb"listening on 127\.0\.0\.1:(\d+)", f.read())
                if m:
                    self.port = int(m.group(1))
                elif self.proc.poll() is not None or time.monotonic() > deadline:
                    with open(log_path, "rb") as f:
                        raise RuntimeError("s3rver did not start: " +
                                           f.read().decode(errors="replace"))
                else:
                    time.sleep(0.05)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        if self.proc is not None:
            _stop(self.proc)
            self.proc = None
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None
        return False


class FaultProxy:
    """tests/support/s3_fault_proxy.py in front of `upstream`; extra_args are
    its flags (e.g. ["--fault-rate", "0.1"])."""

    def __init__(self, upstream, extra_args=(), python=None, start_timeout=30.0):
        self.upstream = upstream
        self.args = list(extra_args)
        self.python = python or sys.executable
        self.start_timeout = start_timeout
        self.proc = None
        self.port = None

    @property
    def endpoint(self):
        return "http://127.0.0.1:{}".format(self.port)

    def __enter__(self):
        self.proc = subprocess.Popen(
            [self.python, PROXY, "--upstream", self.upstream] + self.args,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, preexec_fn=_die_with_parent)
        try:
            # The first line is port=<n>; it comes within the start timeout or
            # the proxy is stopped (it exits as soon as its stdin closes).
            ready, _, _ = select.select([self.proc.stdout], [], [], self.start_timeout)
            line = self.proc.stdout.readline().decode() if ready else ""
            m = re.fullmatch(r"port=(\d+)\s*", line)
            if not m:
                raise RuntimeError("fault proxy did not start (first line {!r})".format(line))
            self.port = int(m.group(1))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def close_stdin_and_wait(self, timeout=5.0):
        """The documented way to stop it; returns its exit status."""
        self.proc.stdin.close()
        return self.proc.wait(timeout)

    def __exit__(self, *exc):
        if self.proc is not None:
            try:
                self.close_stdin_and_wait()
            except (subprocess.TimeoutExpired, OSError, ValueError):
                _stop(self.proc)
            self.proc.stdout.close()
            self.proc = None
        return False

    def _control(self, method, what, body=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {} if data is None else {"Content-Type": "application/json"}
            conn.request(method, "/__fault__/" + what, body=data, headers=headers)
            resp = conn.getresponse()
            payload = json.loads(resp.read().decode())
            if resp.status != 200:
                raise ValueError("{} /__fault__/{}: {} {}".format(method, what, resp.status,
                                                                 payload.get("error")))
            return payload
        finally:
            conn.close()

    def configure(self, **changes):
        """POST /__fault__/config; returns the new configuration."""
        return self._control("POST", "config", changes)

    def config(self):
        return self._control("GET", "config")

    def stats(self):
        return self._control("GET", "stats")

    def reset_stats(self):
        return self._control("POST", "stats/reset")
