"""The Ray guides' examples run twice, under the real Ray and under Cairn, and compared.

Each example of python/tests/examples/ (a Ray Train or Ray Tune guide's
example as published, imports changed) runs once with ``ray`` and once with
``cairn`` (observe.py, each in its own process and folder). What a user
observes is compared: the reported metrics row by row, the metrics
dataframe, the kept checkpoints' files and order (``best_checkpoints``), the
config, the error, and the trial folder's files and their columns. Every
difference must be listed in docs/ray.md's table "Where Cairn differs from
Ray", with its reason: an unlisted difference fails the test, and so does a
listed one that no example shows any more.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Optional

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

HERE = pathlib.Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "examples"
DOC = HERE.parents[2] / "docs" / "ray.md"
ALL = sorted(p.name for p in EXAMPLES.glob("*.py"))

# The metrics whose values neither framework fixes: the examples draw their
# data and initial weights without a seed, in worker processes.
UNSEEDED = {"loss"}
# What differs from run to run in either framework.
VOLATILE = {
    "timestamp",
    "time_this_iter_s",
    "time_total_s",
    "time_since_restore",
    "date",
    "pid",
    "hostname",
    "node_ip",
    "trial_id",
}


def _run(framework: str, example: str, work: pathlib.Path) -> Any:
    """Runs ``example`` under ``framework`` in its own folder; returns what
    observe.py wrote."""
    folder = work / framework
    storage = folder / "home" / "ray_results" if framework == "ray" else folder / "results"
    storage.mkdir(parents=True)
    import cairn

    package_root = os.path.dirname(os.path.dirname(os.path.abspath(cairn.__file__)))
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p),
        PYTHONDONTWRITEBYTECODE="1",
        # Ray: its default storage (~/ray_results), its session folders
        # (under the temporary folder) and no usage report.
        HOME=str(folder / "home"),
        TMPDIR=str(folder),
        RAY_USAGE_STATS_ENABLED="0",
        CAIRN_STORAGE_PATH=str(storage),
    )
    out = folder / "observed.json"
    done = subprocess.run(
        [
            sys.executable,
            str(HERE / "observe.py"),
            framework,
            str(EXAMPLES / example),
            str(out),
            str(storage),
        ],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"{example} under {framework}:\n{done.stderr[-4000:]}"
    return json.loads(out.read_text())


def _api(example: str) -> str:
    return "Train" if example.startswith("train_") else "Tune"


def _keys(kind: str, ray: list[str], ours: list[str]) -> set[str]:
    """One difference per name one side has: a config column as config/*."""

    def names(keys: list[str]) -> set[str]:
        return {re.sub(r"^config/.*", "config/*", k) for k in keys}

    found = {f'{kind}: "{k}" only in Ray' for k in names(ray) - names(ours)}
    found |= {f'{kind}: "{k}" only in Cairn' for k in names(ours) - names(ray)}
    return found


def _values(example: str, what: str, ray: Any, ours: Any) -> set[str]:
    return set() if ray == ours else {f"{example}: {what}"}


def _rows(example: str, ray: list[dict[str, Any]], ours: list[dict[str, Any]]) -> set[str]:
    if len(ray) != len(ours):
        return {f"{example}: number of reported rows"}
    found: set[str] = set()
    for a, b in zip(ray, ours):
        for key in set(a) & set(b) - VOLATILE:
            if key in UNSEEDED:
                continue
            found |= _values(example, f"reported `{key}`", a[key], b[key])
    return found


def _checkpoints(
    example: str,
    what: str,
    ray: list[Optional[dict[str, Any]]],
    ours: list[Optional[dict[str, Any]]],
) -> set[str]:
    """Kept checkpoints compared in order: their count, iterations and file
    names; their folder names by the naming scheme."""

    def scheme(c: Optional[dict[str, Any]]) -> Optional[str]:
        if c is None:
            return None
        name = re.sub(r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d\.\d+", "<date and time>", c["name"])
        return name if name.endswith(">") else c["name"]

    found: set[str] = set()
    if any("<" in (scheme(c) or "") for c in ray) != any("<" in (scheme(c) or "") for c in ours):
        found.add("Train layout: Ray names checkpoint folders by date and time")
    elif [scheme(c) for c in ray] != [scheme(c) for c in ours]:
        found.add(f"{example}: {what} folder names")
    if len(ray) != len(ours) or [c is None for c in ray] != [c is None for c in ours]:
        return found | {f"{example}: {what}"}
    for a, b in zip(ray, ours):
        if a is not None and b is not None:
            found |= _values(example, what, a.get("iteration"), b.get("iteration"))
            found |= _keys(f"{_api(example)} checkpoint files", a["files"], b["files"])
    return found


def _result(example: str, ray: dict[str, Any], ours: dict[str, Any]) -> set[str]:
    api = _api(example)
    found = _values(example, "error", ray["error"], ours["error"])
    if ray["path depth"] != ours["path depth"]:
        found.add(f"{api} layout: trial folder depth under the storage path")
    found |= _keys(f"{api} Result.metrics", list(ray["metrics"]), list(ours["metrics"]))
    found |= _rows(example, [ray["metrics"]], [ours["metrics"]])
    if isinstance(ray["config"], str) and ray["config"].startswith("raises "):
        found.add(f"{api} Result.config: Ray {ray['config']}")
    else:
        found |= _values(example, "config", ray["config"], ours["config"])
    found |= _keys(
        f"{api} Result.metrics_dataframe", ray["dataframe columns"], ours["dataframe columns"]
    )
    rows = ours["dataframe rows"]
    if api == "Train" and len(ray["dataframe rows"]) != len(rows):
        # Ray Train (V2) builds the frame from the kept checkpoints' metrics.
        kept = {c["name"] for c in ours["best_checkpoints"]}
        rows = [r for r in rows if r.get("checkpoint_dir_name") in kept]
        found.add("Train Result.metrics_dataframe: Ray's rows are the kept checkpoints' only")
    found |= _rows(example, ray["dataframe rows"], rows)
    found |= _checkpoints(example, "latest checkpoint", [ray["checkpoint"]], [ours["checkpoint"]])
    found |= _checkpoints(
        example, "best_checkpoints", ray["best_checkpoints"], ours["best_checkpoints"]
    )
    a, b = ray["trial folder"], ours["trial folder"]
    found |= _keys(f"{api} trial folder", a["files"], b["files"])
    for what, kind in (
        ("progress.csv columns", "progress.csv"),
        ("result.json keys", "result.json"),
    ):
        if what in a and what in b:  # a file only one side writes is listed above
            found |= _keys(f"{api} {kind}", a[what], b[what])
    for what in ("progress.csv rows", "result.json rows", "params.json"):
        if what in a and what in b:
            found |= _values(example, what, a[what], b[what])
    return found


@functools.cache
def differences(example: str) -> frozenset[str]:
    """Every difference a user of ``example`` observes between Ray and Cairn."""
    work = pathlib.Path(tempfile.mkdtemp(prefix="rc"))  # short: Ray's socket paths
    try:
        ray = _run("ray", example, work)
        ours = _run("cairn", example, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    found: set[str] = set()
    if len(ray) != len(ours):
        return frozenset({f"{example}: number of fit() calls"})
    for fit_ray, fit_ours in zip(ray, ours):
        found |= _values(example, "errors", fit_ray["errors"], fit_ours["errors"])
        if len(fit_ray["results"]) != len(fit_ours["results"]):
            found.add(f"{example}: number of results")
            continue
        for a, b in zip(fit_ray["results"], fit_ours["results"]):
            found |= _result(example, a, b)
    return frozenset(found)


def listed() -> set[str]:
    """The differences docs/ray.md's table lists: its first column, one or
    more per row, each in backticks."""
    text = DOC.read_text()
    section = text.split("## Where Cairn differs from Ray", 1)[1].split("\n## ", 1)[0]
    out: set[str] = set()
    for row in re.finditer(r"^\|([^|]*)\|", section, re.MULTILINE):
        out |= {m.strip() for m in re.findall(r"`([^`]+)`", row.group(1))}
    return out


@pytest.mark.parametrize("example", ALL)
def test_every_difference_from_ray_is_listed_with_its_reason(example: str) -> None:
    unlisted = sorted(differences(example) - listed())
    assert not unlisted, f"not in docs/ray.md: {unlisted}"


def test_every_listed_difference_is_still_observed() -> None:
    seen: set[str] = set()
    for example in ALL:
        seen |= differences(example)
    stale = sorted(listed() - seen)
    assert not stale, f"docs/ray.md lists differences no example shows: {stale}"
