"""Ctrl-C during a save, from Python.

A child (interrupt_worker.py, on the same interpreter and PYTHONPATH) saves
a 200 MiB state in a loop with ``cairn.save`` and registers each save with a
``cairn.CheckpointManager`` (``num_to_keep=1``). The test sends it SIGINT
while it is inside ``cairn.save`` or inside ``register_checkpoint``. The C++
call runs to its end with the GIL released (Python only flags the signal);
Python raises KeyboardInterrupt when the call returns. So:

- the child ends with KeyboardInterrupt (a traceback, killed by SIGINT: exit
  status 130 in a shell), without starting another save;
- on disk is the previous complete checkpoint or the new complete one,
  nothing partial: every committed checkpoint verifies and holds its step's
  tensors, a new manager finds no leftovers, and the interrupted
  ``cairn.save``'s file is absent or whole.

CAIRN_PY_INTERRUPT_MIB sets the state's size (default 200).
"""

from __future__ import annotations

import os
import pathlib
import select
import signal
import subprocess
import sys
import tempfile
import time

import cairn
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import interrupt_worker

SIZE_MIB = int(os.environ.get("CAIRN_PY_INTERRUPT_MIB", "200"))
# Bounds on waits for the child, generous for a loaded machine; they bound a
# hang, they do not judge speed.
LINE_TIMEOUT_S = 120.0


class Child:
    """The worker process, its stdout read line by line with bounded waits."""

    def __init__(self, experiment: pathlib.Path, scratch: pathlib.Path) -> None:
        env = dict(os.environ)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                interrupt_worker.__file__,
                str(experiment),
                str(scratch),
                str(SIZE_MIB),
            ],
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=env,
        )
        assert self.proc.stdout is not None
        self.fd = self.proc.stdout.fileno()
        self.buffer = b""

    def line(self) -> str | None:
        """The next line, or None at end of output; fails after LINE_TIMEOUT_S."""
        deadline = time.monotonic() + LINE_TIMEOUT_S
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.fd], [], [], max(left, 0))
            if not ready:
                raise AssertionError(
                    f"no output from the child in {LINE_TIMEOUT_S} s; stderr: {self.error_text()}"
                )
            chunk = os.read(self.fd, 4096)
            if not chunk:
                return None
            self.buffer += chunk
        text, self.buffer = self.buffer.split(b"\n", 1)
        return text.decode()

    def until(self, prefix: str) -> int:
        """Reads lines up to the next one starting with ``prefix``; returns its step."""
        while True:
            text = self.line()
            assert text is not None, f"the child ended early: {self.error_text()}"
            if text.startswith(prefix + " "):
                return int(text.split()[1])

    def rest(self) -> list[str]:
        """Every line up to the end of output."""
        out = []
        while (text := self.line()) is not None:
            out.append(text)
        return out

    def error_text(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        self.stderr.close()


def _check_state(file: pathlib.Path, step: int) -> None:
    """Asserts ``file`` holds exactly step ``step``'s state."""
    want = interrupt_worker.stamp(interrupt_worker.base_tensors(SIZE_MIB), step)
    got = cairn.load(file, framework="np")
    assert sorted(got) == sorted(want), file
    for name, tensor in want.items():
        assert np.array_equal(got[name], tensor), f"{file}: {name} is not step {step}'s"
    assert cairn.load_metadata(file) == {"step": step}, file


@pytest.mark.parametrize("target,delay_s", [("save", 0.0), ("save", 0.02), ("register", 0.02)])
def test_ctrl_c_mid_save_ends_with_keyboard_interrupt_and_leaves_no_partial_checkpoint(
    target: str, delay_s: float
) -> None:
    with tempfile.TemporaryDirectory(prefix="cairn-interrupt-") as tmp:
        experiment = pathlib.Path(tmp) / "exp"
        scratch = pathlib.Path(tmp) / "scratch"
        child = Child(experiment, scratch)
        try:
            child.until("committed")  # a previous complete checkpoint exists
            step = child.until(target)
            time.sleep(delay_s)
            child.proc.send_signal(signal.SIGINT)
            after = child.rest()
            child.proc.wait(timeout=LINE_TIMEOUT_S)
            errors = child.error_text()
        finally:
            child.close()

        # KeyboardInterrupt, as Python ends on an uncaught one: killed by SIGINT.
        assert child.proc.returncode in (-signal.SIGINT, 130), (child.proc.returncode, errors)
        assert "KeyboardInterrupt" in errors, errors
        # Raised when the interrupted call returned: no later save started.
        assert f"save {step + 1}" not in after, after

        # On disk: the previous checkpoint, or the new one, each whole.
        committed = {}
        for entry in sorted(experiment.glob("checkpoint_[0-9]*")):
            checkpoint = cairn.Checkpoint.from_directory(entry)
            if checkpoint.is_committed():
                assert checkpoint.verify() == [], entry.name
                with checkpoint.as_directory() as path:
                    step_of = cairn.load_metadata(pathlib.Path(path) / "model.safetensors")["step"]
                    _check_state(pathlib.Path(path) / "model.safetensors", step_of)
                committed[entry.name] = step_of
        assert max(committed.values()) in (step - 1, step), (step, committed)
        if target == "register" and f"committed {step}" in after:
            assert max(committed.values()) == step
        # The interrupted cairn.save ran to its end (or never began to write):
        # its file is absent or whole, and no temporary file is left beside it.
        folder = scratch / f"step_{step}"
        if folder.exists():
            assert {p.name for p in folder.iterdir()} <= {"model.safetensors"}, list(
                folder.iterdir()
            )
            if (folder / "model.safetensors").exists():
                _check_state(folder / "model.safetensors", step)

        # A new manager finds exactly the committed checkpoints and loads the latest.
        with cairn.CheckpointManager(experiment, "", cairn.CheckpointConfig(num_to_keep=1)) as m:
            latest = m.latest()
            assert latest is not None and latest.name == max(committed)
            assert [r.name for r in m.history()] == [latest.name]
            assert latest.metrics["step"] == committed[latest.name]
            with latest.checkpoint.as_directory() as path:
                _check_state(pathlib.Path(path) / "model.safetensors", latest.metrics["step"])
