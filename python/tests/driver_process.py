"""A training or tuning driver run as its own process, for the kill tests.

test_train.py and test_tune.py start a driver program (train_driver.py,
tune_driver.py), wait until the files that say it got far enough exist,
then signal it. The waits are bounded: they stop a hang, they judge no
speed.
"""

from __future__ import annotations

import contextlib
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

WAIT_S = 180.0


@contextlib.contextmanager
def started(program: str, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """``python3 program args...``; killed (its runtime's processes with it) at exit."""
    driver = subprocess.Popen(
        [sys.executable, program, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        yield driver
    finally:
        if driver.poll() is None:
            driver.send_signal(signal.SIGKILL)
        driver.wait()
        assert driver.stderr is not None
        driver.stderr.close()


def _wait_until(
    driver: subprocess.Popen[bytes], done: Callable[[], bool], missing: Callable[[], str]
) -> None:
    """Returns once ``done()``; fails, saying ``missing()``, if the driver ends
    first or WAIT_S pass."""
    deadline = time.monotonic() + WAIT_S
    while not done():
        if driver.poll() is not None:
            assert driver.stderr is not None
            raise AssertionError(
                f"the driver ended (status {driver.returncode}) before {missing()} existed: "
                f"{driver.stderr.read().decode(errors='replace')}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"{missing()} did not appear within {WAIT_S} s")
        time.sleep(0.05)


def wait_for(driver: subprocess.Popen[bytes], *paths: pathlib.Path) -> None:
    """Returns once every path exists; fails if the driver ends first or WAIT_S pass."""
    _wait_until(
        driver,
        lambda: all(p.exists() for p in paths),
        lambda: str([str(p) for p in paths if not p.exists()]),
    )


def wait_for_matches(
    driver: subprocess.Popen[bytes], folder: pathlib.Path, pattern: str, count: int
) -> None:
    """Returns once ``folder.glob(pattern)`` finds ``count`` paths; fails as wait_for."""
    _wait_until(
        driver,
        lambda: len(list(folder.glob(pattern))) >= count,
        lambda: f"{count} of {folder / pattern}",
    )
