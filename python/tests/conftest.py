"""Shared fixtures: a fresh folder per test, removed afterwards."""

from __future__ import annotations

import pathlib

import pytest


@pytest.fixture
def state_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    """A folder with two files and a subfolder, as a training step would write."""
    d = tmp_path / "state"
    (d / "opt").mkdir(parents=True)
    (d / "model.bin").write_bytes(bytes(range(256)) * 64)
    (d / "opt" / "adam.json").write_text('{"lr": 0.001}')
    return d
