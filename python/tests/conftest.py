"""Shared fixtures: a fresh folder per test, removed afterwards; an S3 root
reached through Python threads."""

from __future__ import annotations

import os
import pathlib
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _no_ram_staging_left(tmp_path: pathlib.Path) -> Iterator[None]:
    """Removes the RAM staging folders cairn.tensorflow keeps in /dev/shm for
    a directory under this test's folder (named for the directory, and
    swept by the next manager that opens it; a killed save in a directory
    no manager opens again would leave one behind)."""
    yield
    shm = pathlib.Path("/dev/shm")
    if not shm.is_dir() or not any(shm.glob("cairn-tf-staging-*")):
        return
    import hashlib
    import shutil

    for d in [tmp_path, *(p for p in tmp_path.rglob("*") if p.is_dir())]:
        key = hashlib.sha256(os.path.abspath(d).encode()).hexdigest()[:16]
        shutil.rmtree(shm / f"cairn-tf-staging-{key}", ignore_errors=True)


@pytest.fixture
def state_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    """A folder with two files and a subfolder, as a training step would write."""
    d = tmp_path / "state"
    (d / "opt").mkdir(parents=True)
    (d / "model.bin").write_bytes(bytes(range(256)) * 64)
    (d / "opt" / "adam.json").write_text('{"lr": 0.001}')
    return d


class _PythonRelay:
    """A TCP relay on 127.0.0.1 whose every byte is moved by Python threads:
    a client talking through it makes progress only while the interpreter
    lets those threads run, that is, while the client's caller has released
    the GIL."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stopping = False
        self.threads: list[threading.Thread] = []
        self.sockets: list[socket.socket] = []
        self._start(self._accept)

    def _start(self, target: Any, *args: Any) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        self.threads.append(t)

    def _accept(self) -> None:
        while not self.stopping:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(("127.0.0.1", self.target_port), timeout=30)
            server.settimeout(None)
            self.sockets += [client, server]
            self._start(self._pump, client, server)
            self._start(self._pump, server, client)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.stopping = True
        self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (close would not)
        self.listener.close()
        for s in self.sockets:  # kept alive by the client's connection pool
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self.threads:
            t.join(timeout=10)


@pytest.fixture
def s3_through_python(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An s3:// root on moto's server (tests/support/moto_s3.py, its own
    process) reached through a relay run by Python threads of this process:
    a Cairn call that writes there can finish only if it releases the GIL.
    Yields the root URI ("s3://test/<unique>")."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests" / "support"))
    try:
        from s3_servers import ACCESS_KEY, SECRET_KEY, MotoS3
    finally:
        sys.path.pop(0)
    with MotoS3(bucket="test") as server:
        relay = _PythonRelay(server.port)
        try:
            for name, value in {
                "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{relay.port}",
                "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_REGION": "us-east-1",
                "AWS_EC2_METADATA_DISABLED": "true",
                "AWS_CONFIG_FILE": "/dev/null",
                "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
                "CAIRN_S3_MIN_PART_SIZE": "262144",
                "CAIRN_S3_PART_SIZE": "262144",
            }.items():
                monkeypatch.setenv(name, value)
            monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
            monkeypatch.delenv("AWS_PROFILE", raising=False)
            yield "s3://test/run"
        finally:
            relay.close()
