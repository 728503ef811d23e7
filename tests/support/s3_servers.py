"""Starting the S3 test server (moto's, tests/support/moto_s3.py) and the
fault proxy from Python tests and benchmarks, on 127.0.0.1, with nothing left
behind.

  with MotoS3(bucket="test") as s3, FaultProxy(s3.endpoint) as proxy:
      proxy.configure(rate=1.0, faults=["slowdown"])
      ... requests to proxy.endpoint ...
      proxy.stats()

Both are context managers: leaving the block stops the process. On Linux
both children also get SIGKILL if the process that started them dies
(PR_SET_PDEATHSIG), and both exit when their stdin, a pipe held here, closes.
"""

import ctypes
import http.client
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PROXY = os.path.join(HERE, "s3_fault_proxy.py")

MOTO = os.path.join(HERE, "moto_s3.py")

# moto accepts any credentials; these are what the tests and benchmarks sign with.
ACCESS_KEY = "cairn-test"
SECRET_KEY = "cairn-test-secret"


def _die_with_parent():
    """preexec_fn: SIGKILL this child when the thread that started it exits."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _stop(proc, timeout=5.0):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _first_line(proc, timeout, what):
    """The child's first line on stdout, within `timeout` seconds."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline().decode() if ready else ""
    m = re.fullmatch(r"port=(\d+)\s*", line)
    if not m:
        raise RuntimeError("{} did not start (first line {!r})".format(what, line))
    return int(m.group(1))


class MotoS3:
    """moto's S3 server (tests/support/moto_s3.py) on 127.0.0.1 with one
    bucket; its port is picked by the system. Objects live in the server's
    memory and go with it. Its own output goes to a log whose tail a failure
    to start shows."""

    def __init__(self, bucket="test", python=None, start_timeout=60.0):
        self.bucket = bucket
        self.python = python or sys.executable
        self.start_timeout = start_timeout
        self.proc = None
        self.port = None
        self.log = None

    @property
    def endpoint(self):
        return "http://127.0.0.1:{}".format(self.port)

    def __enter__(self):
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [self.python, MOTO, "--bucket", self.bucket],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            preexec_fn=_die_with_parent,
        )
        try:
            self.port = _first_line(self.proc, self.start_timeout, "moto's S3 server")
        except RuntimeError as e:
            self.__exit__(None, None, None)
            raise RuntimeError("{}; its output: {}".format(e, self._output())) from None
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _output(self):
        if self.log is None:
            return ""
        self.log.seek(0)
        return self.log.read()[-4000:].decode(errors="replace")

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.stdin.close()
            try:
                self.proc.wait(5.0)
            except subprocess.TimeoutExpired:
                _stop(self.proc)
            self.proc.stdout.close()
            self.proc = None
        if self.log is not None:
            self.log.close()
            self.log = None
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
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            preexec_fn=_die_with_parent,
        )
        try:
            # The first line is port=<n>; it comes within the start timeout or
            # the proxy is stopped (it exits as soon as its stdin closes).
            self.port = _first_line(self.proc, self.start_timeout, "fault proxy")
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
                raise ValueError(
                    "{} /__fault__/{}: {} {}".format(
                        method, what, resp.status, payload.get("error")
                    )
                )
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
