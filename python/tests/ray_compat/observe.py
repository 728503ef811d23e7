"""Runs one Ray example under Ray or under Cairn and writes what a user observes.

Usage: ``observe.py {ray,cairn} EXAMPLE.py OUT.json STORAGE_DIR``

The example is a Ray guide's example as published with ``ray`` replaced by
``cairn`` (python/tests/examples/); under ``ray`` the replacement is undone.
Every ``fit()`` of a Trainer or Tuner is recorded, and each result it
returned is described as data that both frameworks' objects yield through
their common API (``Result``/``ResultGrid``): the metrics, the metrics
dataframe's columns and rows, the kept checkpoints' files and order, the
config, the error, and the trial folder's files (``result.json``,
``progress.csv``, ``params.json``). test_differential.py compares the two.
"""

from __future__ import annotations

import csv
import json
import os
import pathlib
import re
import runpy
import sys
import tempfile
from typing import Any

# A checkpoint's folder: Tune's and Cairn's checkpoint_000000, or Ray
# Train's checkpoint_<date and time>.
CHECKPOINT_FOLDER = re.compile(r"checkpoint_(\d{6}|\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d\.\d+)")


def _files(folder: pathlib.Path) -> list[str]:
    """The files under ``folder``, relative, without Cairn's own ``.cairn``."""
    out = []
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if p.is_file() and rel.parts[0] != ".cairn":
            out.append(str(rel))
    return out


def _checkpoint(ckpt: Any, trial: pathlib.Path) -> dict[str, Any]:
    path = pathlib.Path(ckpt.path)
    return {"name": os.path.relpath(path, trial), "files": _files(path)}


def _plain(value: Any) -> Any:
    """JSON-able, with numpy and pandas scalars as Python ones."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        try:
            return value.item()
        except (ValueError, TypeError):
            pass
    if isinstance(value, float) and value != value:
        return None  # NaN: an empty cell
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def _trial_folder(trial: pathlib.Path) -> dict[str, Any]:
    names = sorted(
        re.sub(r"^events\.out\.tfevents\..*", "events.out.tfevents.*", p.name)
        for p in trial.iterdir()
        if not CHECKPOINT_FOLDER.fullmatch(p.name)
    )
    out: dict[str, Any] = {"files": names}
    progress = trial / "progress.csv"
    if progress.exists():
        with open(progress, newline="") as f:
            rows = list(csv.reader(f))
        out["progress.csv columns"] = rows[0] if rows else []
        out["progress.csv rows"] = max(len(rows) - 1, 0)
    results = trial / "result.json"
    if results.exists():
        lines = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
        out["result.json rows"] = len(lines)
        out["result.json keys"] = sorted(lines[-1]) if lines else []
    params = trial / "params.json"
    if params.exists():
        out["params.json"] = json.loads(params.read_text())
    return out


def _config(result: Any) -> Any:
    try:
        return _plain(dict(result.config or {}))
    except DeprecationWarning as e:  # Ray Train's Result (V2) has no config
        return f"raises {type(e).__name__}"


def describe(result: Any, storage: pathlib.Path) -> dict[str, Any]:
    """What a user observes of one ``Result``."""
    trial = pathlib.Path(result.path)
    frame = result.metrics_dataframe
    columns = [] if frame is None else [str(c) for c in frame.columns]
    rows = [] if frame is None else [_plain(dict(r)) for _, r in frame.iterrows()]
    return {
        "error": None if result.error is None else type(result.error).__name__,
        "path depth": len(trial.relative_to(storage).parts),
        "metrics": _plain(dict(result.metrics or {})),
        "config": _config(result),
        "dataframe columns": columns,
        "dataframe rows": rows,
        "checkpoint": None if result.checkpoint is None else _checkpoint(result.checkpoint, trial),
        "best_checkpoints": [
            dict(_checkpoint(c, trial), iteration=m.get("training_iteration"))
            for c, m in result.best_checkpoints
        ],
        "trial folder": _trial_folder(trial),
    }


def main() -> None:
    framework, example, out, storage_dir = sys.argv[1:5]
    storage = pathlib.Path(storage_dir)
    source = pathlib.Path(example).read_text()
    if framework == "ray":
        source = re.sub(r"\bcairn\b", "ray", source)
        import ray.train.torch
        import ray.tune

        classes: list[Any] = [ray.tune.Tuner, ray.train.torch.TorchTrainer]
    else:
        import cairn.train.torch
        import cairn.tune

        classes = [cairn.tune.Tuner, cairn.train.torch.TorchTrainer]
    fits: list[Any] = []
    for cls in classes:
        original = cls.fit

        def fit(self: Any, _original: Any = original) -> Any:
            outcome = _original(self)
            fits.append(outcome)
            return outcome

        cls.fit = fit
    with tempfile.NamedTemporaryFile(
        "w", suffix=".py", dir=pathlib.Path(out).parent, delete=False
    ) as f:
        f.write(source)
    runpy.run_path(f.name, run_name="__main__")
    described = []
    for outcome in fits:
        results = list(outcome) if hasattr(outcome, "get_best_result") else [outcome]
        described.append(
            {"results": [describe(r, storage) for r in results], "errors": outcome_errors(outcome)}
        )
    pathlib.Path(out).write_text(json.dumps(described, indent=1, sort_keys=True))


def outcome_errors(outcome: Any) -> Any:
    errors = getattr(outcome, "errors", None)
    return None if errors is None else [type(e).__name__ for e in errors]


if __name__ == "__main__":
    main()
