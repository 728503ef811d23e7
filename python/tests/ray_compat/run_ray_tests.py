"""Run Ray's own public-API checkpoint tests against Cairn (docs/ray.md, "Ray's own tests").

Usage: ``run_ray_tests.py RAY_CHECKOUT [--keep DIR] [-k EXPR]`` (scripts/ray-tests.sh).

RAY_CHECKOUT is a checkout of Ray's public repository (tag ray-2.58.0) that
the user brings: nothing of Ray's is committed here nor downloaded by this
script. Each file of :data:`CHOSEN_FILES` is copied into a temporary folder
with its imports rewritten (:func:`rewrite`): Ray's public modules become
Cairn's (``ray.train`` -> ``cairn.train``, ``ray.tune`` -> ``cairn.tune``),
Ray's internals become placeholders that make a test that touches them
*not applicable*, and ``import ray`` stays as it is. pytest runs the copies
with a conftest written here (:data:`CONFTEST`) that supplies no-op
equivalents of Ray's cluster fixtures and applies :data:`NOT_APPLICABLE`.
The table printed at the end gives each test: passed, failed (with the first
line of the reason) or n/a (with the rule that made it so).

Exit status: 0 when every applicable test passed, 1 when one failed, 2 for
bad arguments (RAY_CHECKOUT missing or not a Ray checkout).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any, Optional

# The test files run, as paths in Ray's repository, with what each checks.
# Chosen for testing Ray's public checkpoint behaviour, not its cluster
# internals (actors, object store, placement groups, pyarrow filesystems).
CHOSEN_FILES: list[tuple[str, str]] = [
    (
        "python/ray/train/tests/test_checkpoint.py",
        "Checkpoint: from_directory, to_directory, as_directory",
    ),
    (
        "python/ray/train/tests/test_result.py",
        "Result.from_path after a failed Trainer run and a Tuner run; "
        "best_checkpoints under CheckpointConfig retention; Result.error",
    ),
    (
        "python/ray/train/v2/tests/test_result.py",
        "Ray Train V2's Result: repr, get_best_checkpoint, from_path, "
        "retention by score, a worker's failure",
    ),
]

# Ray's public modules and the Cairn module offering the same names. A name
# Cairn lacks stays a visible failure (ImportError when the test uses it).
PUBLIC_MODULES: dict[str, str] = {
    "ray.train": "cairn.train",
    "ray.train.torch": "cairn.train.torch",
    "ray.tune": "cairn.tune",
    # Ray's Checkpoint is defined here and re-exported by ray.train.
    "ray.train.checkpoint": "cairn.train",
    # Ray Train V1's TrainingFailedError, re-exported by ray.train.
    "ray.train.base_trainer": "cairn.train",
    # Ray Train V2's Result and errors, re-exported by ray.train.
    "ray.train.v2.api.result": "cairn.train",
    "ray.train.v2.api.exceptions": "cairn.train",
    # Ray Tune's public classes, re-exported by ray.tune.
    "ray.tune.tune_config": "cairn.tune",
    "ray.tune.tuner": "cairn.tune",
    "ray.tune.result_grid": "cairn.tune",
}

# Ray's test utilities (not product code) that the tests lean on, and the
# name of this runner's own equivalent in the generated helper module
# (:data:`HELPERS`). Each is a few lines of plain Python, written here.
TEST_UTILITIES: dict[tuple[str, str], str] = {
    # A context manager yielding a checkpoint of a small dict.
    ("ray.train.tests.util", "create_dict_checkpoint"): "create_dict_checkpoint",
    # Reads that dict back.
    ("ray.train.tests.util", "load_dict_checkpoint"): "load_dict_checkpoint",
    # A path-or-URI joiner (``URI(a) / b``, ``.path``).
    ("ray.air._internal.uri_utils", "URI"): "URI",
    # The name of a trial's metrics history, "result.json"; Cairn writes the same file.
    ("ray.air.constants", "EXPR_RESULT_FILE"): "EXPR_RESULT_FILE",
}

# Ray's cluster fixtures that a test requests only to have "Ray running".
# Cairn needs no cluster, so the conftest gives each as a no-op; a test
# file's own definition of one (calling ray.init) is renamed away.
NOOP_FIXTURES = ("ray_start_2_cpus", "ray_start_4_cpus", "ray_start_4_cpus_2_gpus", "ray_shutdown")

# Rules that make a test not applicable, checked in this order; each is
# (name, reason). The checks are in :func:`not_applicable` (before the test
# runs) and in the conftest (when a Ray internal is touched while it runs).
NOT_APPLICABLE: list[tuple[str, str]] = [
    # Ray's test body is empty (``pass``): it checks nothing in Ray either.
    ("empty", "empty in Ray (the body is `pass`)"),
    # Ray's core API (ray.init, ray.remote, ray.get, ...): a cluster, not checkpoints.
    ("ray-core", "uses Ray's core API (ray.{name})"),
    # Ray's mock S3 (moto, the mock_s3_bucket_uri fixture); Cairn's S3 is
    # tested against the S3 servers of its own suite (docs/s3.md).
    ("mock-s3", "Ray's mock S3 storage (mock_s3_bucket_uri, moto)"),
    # pyarrow's mock filesystem ("mock://") or a custom pyarrow filesystem
    # given to Checkpoint: Ray's storage layer is pyarrow.fs, Cairn's is its
    # own (a path, file://, s3://, memory://).
    ("pyarrow-fs", "a pyarrow mock or custom filesystem (Ray's storage layer)"),
    # A private name or an ``_internal`` module of Ray (its storage
    # context, file-system helpers, temp-folder prefix, constants): Ray's
    # implementation, not its API. Decided when the test touches it.
    ("internal", "uses Ray internal {name}"),
]

HELPERS = '''"""Equivalents of Ray's test utilities, written by run_ray_tests.py."""
import contextlib
import json
import os
import tempfile

import cairn.train

EXPR_RESULT_FILE = "result.json"
_FILE = "dict_checkpoint.json"


@contextlib.contextmanager
def create_dict_checkpoint(data):
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, _FILE), "w") as f:
            json.dump(data, f)
        yield cairn.train.Checkpoint.from_directory(folder)


def load_dict_checkpoint(checkpoint):
    with checkpoint.as_directory() as folder:
        with open(os.path.join(folder, _FILE)) as f:
            return json.load(f)


class URI:
    def __init__(self, uri):
        self._uri = str(uri).rstrip("/")

    def __truediv__(self, name):
        return URI(self._uri + "/" + str(name).strip("/"))

    @property
    def path(self):
        return self._uri.split("://", 1)[1] if "://" in self._uri else self._uri

    def __str__(self):
        return self._uri
'''

CONFTEST = '''"""Written by run_ray_tests.py: Ray's fixtures as no-ops, and the n/a rules."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.environ["RAY_TESTS_RUNNER_DIR"])
import run_ray_tests as runner  # noqa: E402
from _ray_internal import RayInternalUsed  # noqa: E402

for _name in runner.NOOP_FIXTURES:
    globals()[_name] = pytest.fixture(lambda: None, name=_name)


@pytest.fixture
def mock_s3_bucket_uri():
    from _ray_internal import RayInternal

    return RayInternal("mock_s3_bucket_uri")


def pytest_collection_modifyitems(items):
    for item in items:
        reason = runner.not_applicable(item)
        if reason:
            item.add_marker(pytest.mark.skip(reason="n/a: " + reason))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    reason = runner.internal_use(call.excinfo.value if call.excinfo else None)
    if reason and report.failed:
        report.outcome = "skipped"
        report.longrepr = (str(item.path), 0, "n/a: " + reason)


def pytest_collectreport(report):
    if report.failed:  # a file that cannot even be imported: one row for all its tests
        lines = [line for line in str(report.longrepr).splitlines() if line.startswith("E ")]
        reason = lines[-1][1:].strip() if lines else str(report.longrepr).splitlines()[0]
        with open(os.environ["RAY_TESTS_REPORT"], "a") as f:
            row = {"test": report.nodeid + " (all)", "state": "failed", "reason": reason}
            f.write(json.dumps(row) + "\\n")


def pytest_runtest_logreport(report):
    if report.when != "call" and not (report.failed or report.skipped):
        return
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
        state = "n/a"
        reason = reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason
        reason = reason[len("n/a: "):] if reason.startswith("n/a: ") else reason
    elif report.failed:
        state = "failed"
        crash = getattr(report.longrepr, "reprcrash", None)
        reason = crash.message if crash else str(report.longrepr)
        reason = reason.strip().splitlines()[0] if reason.strip() else ""
        if report.when == "setup":
            reason = "setup: " + reason
    else:
        state, reason = "passed", ""
    with open(os.environ["RAY_TESTS_REPORT"], "a") as f:
        f.write(json.dumps({"test": report.nodeid, "state": state, "reason": reason}) + "\\n")
'''

INTERNAL = '''"""Placeholders for Ray internals, written by run_ray_tests.py."""


class RayInternalUsed(Exception):
    pass


class _Placeholder:
    """Stands for a name of Ray's internals; any use raises RayInternalUsed."""

    def __init__(self, name):
        object.__setattr__(self, "_name", name)

    def _used(self, *args, **kwargs):
        raise RayInternalUsed(object.__getattribute__(self, "_name"))

    def __getattr__(self, attr):
        self._used()

    __call__ = __str__ = __repr__ = __fspath__ = __bool__ = __iter__ = _used
    __eq__ = __hash__ = __truediv__ = __getitem__ = __contains__ = __format__ = _used


def RayInternal(name):
    # A class per name, so that Python's own TypeError (placeholder in "text")
    # names the internal too.
    return type("RayInternal[" + name + "]", (_Placeholder,), {})(name)
'''


def not_applicable(item: Any) -> Optional[str]:
    """The reason a collected pytest item is not applicable, or None.

    Applies the rules of :data:`NOT_APPLICABLE` that can be decided before
    the test runs: an empty body, Ray's core API in the body, Ray's mock S3.
    """
    reasons = dict(NOT_APPLICABLE)
    function = getattr(item, "function", None)
    tree = _function_tree(function)
    if tree is not None:
        body = [s for s in tree.body if not _is_docstring(s)]
        if all(isinstance(s, ast.Pass) for s in body):
            return reasons["empty"]
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "ray"
            ):
                return reasons["ray-core"].format(name=node.attr)
    params = getattr(getattr(item, "callspec", None), "params", {})
    if params.get("storage") == "remote":
        return reasons["mock-s3"]
    if any(value in ("mock", "custom_fs") for value in params.values()):
        return reasons["pyarrow-fs"]
    return None


def internal_use(error: Optional[BaseException]) -> Optional[str]:
    """The n/a reason when ``error`` comes from touching a Ray internal, else None.

    ``RayInternalUsed`` is raised by the placeholders; Python's own
    TypeError naming the placeholder's class covers uses it cannot
    intercept (``placeholder in "text"``).
    """
    if error is None:
        return None
    if type(error).__name__ == "RayInternalUsed":
        return dict(NOT_APPLICABLE)["internal"].format(name=error.args[0])
    found = re.search(r"RayInternal\[([^\]]+)\]", str(error))
    if isinstance(error, TypeError) and found:
        return dict(NOT_APPLICABLE)["internal"].format(name=found.group(1))
    return None


def _function_tree(function: Any) -> Optional[ast.FunctionDef]:
    import inspect
    import textwrap

    try:
        source = textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError):
        return None
    node = ast.parse(source).body[0]
    return node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def _is_docstring(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


def rewrite(source: str) -> str:
    """Ray's test file ``source`` with its imports pointed at Cairn.

    - ``from ray.X import a`` for a public module of :data:`PUBLIC_MODULES`
      imports ``a`` from Cairn's module; a private name (``_a``) becomes a
      placeholder.
    - Ray's test utilities (:data:`TEST_UTILITIES`) come from the helper
      module this runner writes.
    - Any other ``from ray...`` import (an internal module) binds each name
      to a placeholder: the test that touches it is not applicable.
    - ``from ray import train/tune`` -> ``from cairn import train/tune``;
      ``ray.train.`` / ``ray.tune.`` in code -> ``cairn.train.`` / ``cairn.tune.``.
    - ``import ray`` stays: what Cairn does not offer fails visibly.
    - A test file's own Ray cluster fixtures (:data:`NOOP_FIXTURES`) are
      renamed so the conftest's no-op ones are used.
    """
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    replacements: list[tuple[int, int, str]] = []
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        module = node.module
        if module != "ray" and not module.startswith("ray."):
            continue
        out = []
        for alias in node.names:
            bound = alias.asname or alias.name
            utility = TEST_UTILITIES.get((module, alias.name))
            if module == "ray" and alias.name in ("train", "tune"):
                out.append(f"from cairn import {alias.name} as {bound}")
            elif utility:
                out.append(f"from _ray_test_helpers import {utility} as {bound}")
            elif module in PUBLIC_MODULES and not alias.name.startswith("_"):
                target = PUBLIC_MODULES[module]
                out.append(
                    f"try:\n    from {target} import {alias.name} as {bound}\n"
                    f"except ImportError:\n    {bound} = _Missing({target!r}, {alias.name!r})"
                )
            else:
                out.append(f"{bound} = _RayInternal({module + '.' + alias.name!r})")
        replacements.append((node.lineno, node.end_lineno or node.lineno, "\n".join(out) + "\n"))
    replaced = {line for start, end, _ in replacements for line in range(start - 1, end)}
    for index, line in enumerate(lines):
        if index not in replaced:
            lines[index] = re.sub(r"\bray\.(train|tune)\b", r"cairn.\1", line)
    for start, end, text in sorted(replacements, reverse=True):
        lines[start - 1 : end] = [text]
    body = "".join(lines)
    for name in NOOP_FIXTURES:
        body = re.sub(rf"\bdef {name}\(", f"def _ray_own_{name}(", body)
    prelude = (
        "import cairn\nimport cairn.train\nimport cairn.train.torch\nimport cairn.tune\n"
        "from _ray_internal import RayInternal as _RayInternal\n"
        "from _ray_missing import Missing as _Missing\n"
    )
    return prelude + body


MISSING = '''"""A public name of Ray that Cairn lacks, written by run_ray_tests.py."""


class _Missing:
    def __init__(self, what):
        self._what = what

    def _fail(self, *args, **kwargs):
        raise ImportError("Cairn lacks " + self._what)

    def __getattr__(self, attr):
        self._fail()

    __call__ = _fail


def Missing(module, name):
    # A class per name, so that Python's own TypeError (pytest.raises(name))
    # names what Cairn lacks.
    what = module + "." + name
    return type("CairnLacks[" + what + "]", (_Missing,), {})(what)
'''


def run(ray_checkout: str, work: str, keyword: Optional[str]) -> list[dict[str, str]]:
    """Copies, rewrites and runs the chosen files in ``work``; returns the rows.

    A chosen file missing from the checkout gives one row "not run".
    """
    rows: list[dict[str, str]] = []
    copied = []
    for path, _ in CHOSEN_FILES:
        source_path = os.path.join(ray_checkout, path)
        if not os.path.isfile(source_path):
            rows.append({"test": path, "state": "not run", "reason": "not in the checkout"})
            continue
        with open(source_path, encoding="utf-8") as f:
            text = rewrite(f.read())
        name = path.replace("python/ray/", "").replace("/", "_")
        name = "test_" + name.replace("tests_test_", "")
        with open(os.path.join(work, name), "w", encoding="utf-8") as f:
            f.write(text)
        copied.append(name)
    for filename, text in (
        ("conftest.py", CONFTEST),
        ("_ray_test_helpers.py", HELPERS),
        ("_ray_internal.py", INTERNAL),
        ("_ray_missing.py", MISSING),
    ):
        with open(os.path.join(work, filename), "w", encoding="utf-8") as f:
            f.write(text)
    report = os.path.join(work, "report.jsonl")
    if os.path.exists(report):  # a kept folder's previous run
        os.remove(report)
    env = dict(os.environ)
    env["RAY_TESTS_REPORT"] = report
    env["RAY_TESTS_RUNNER_DIR"] = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join(
        [work] + [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rN"]
    command += ["--rootdir", work, "--basetemp", os.path.join(work, "tmp")]
    if keyword:
        command += ["-k", keyword]
    subprocess.run(command + copied, cwd=work, env=env, check=False)
    if os.path.exists(report):
        with open(report, encoding="utf-8") as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def table(rows: list[dict[str, str]]) -> str:
    """The rows as a Markdown table with counts above it."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    head = ", ".join(f"{state}: {n}" for state, n in sorted(counts.items()))
    out = [head, "", "| test | result | reason |", "|---|---|---|"]
    for row in rows:
        reason = row["reason"].replace("|", "\\|")
        out.append(f"| `{row['test']}` | {row['state']} | {reason} |")
    return "\n".join(out)


@contextlib.contextmanager
def _work_folder(keep: Optional[str]) -> Iterator[str]:
    if keep:
        os.makedirs(keep, exist_ok=True)
        yield keep
        return
    folder = tempfile.mkdtemp(prefix="ray-tests-")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: Optional[list[str]] = None) -> int:
    """Runs the chosen tests against Cairn and prints the table; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ray_checkout", help="a checkout of Ray's repository (tag ray-2.58.0)")
    parser.add_argument("--keep", help="write the rewritten files here and keep them")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression")
    args = parser.parse_args(argv)
    if not os.path.isdir(os.path.join(args.ray_checkout, "python", "ray")):
        print(f"{args.ray_checkout}: not a Ray checkout (no python/ray folder)", file=sys.stderr)
        return 2
    with _work_folder(args.keep) as work:
        rows = run(os.path.abspath(args.ray_checkout), work, args.keyword)
    print(table(rows))
    return 1 if any(row["state"] in ("failed", "not run") for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
