#!/usr/bin/env python3
"""Holds the source tree to its architecture (docs/ARCHITECTURE.md).

Checks, over the #include lines and the text of src/ and python/:
  1. Layers: a folder of src/ includes only its own headers and those of the
     folders below it in LAYERS, and public headers (include/cairn/) whose
     part is at or below it. An include upward is a cycle waiting to happen.
  2. The Python binding (python/*.cc, *.h) includes public headers only.
  3. Backends stay behind their URIs: storage/backends.h is included only by
     src/storage/ itself and by tests.
  4. The environment is read in one place: getenv only in src/util/settings.cc.
  5. The experiment folder's file names are string literals in one file
     each, their home (EXPERIMENT_NAMES), and nowhere else in src/.
  6. No source file of src/ or python/ above MAX_LINES lines.

Prints every violation as "file:line: what" and exits 1 if there is one.
Pure text checks: no build needed. Run from anywhere:
    python3 scripts/check_layers.py [--root DIR]
"""

import argparse
import pathlib
import re
import sys

# Lowest first. A part may depend on the parts before it.
LAYERS = [
    "util",
    "storage",
    "checkpoint",
    "manager",
    "experiment",
    "engine",
    "cuda",
    "workers",
    "train",
    "tune",
    "torch",
    "cli",
]

# The part that implements each public header (include/cairn/<name>.h).
PUBLIC_HEADERS = {
    "error": "util",
    "version": "util",
    "storage": "storage",
    "checkpoint": "checkpoint",
    "commit": "checkpoint",
    "manager": "manager",
    "transfer": "experiment",
    "device": "engine",
    "safetensors": "engine",
    "state": "engine",
    "sharded": "engine",
    "async_save": "engine",
    "state_manager": "engine",
    "cuda": "cuda",
    "run_config": "train",
    "train": "train",
    "tune": "tune",
    "tuner": "tune",
    "tune_schedulers": "tune",
    "torch": "torch",
    "torch_distributed": "torch",
}

# Names of files in an experiment's folder and the one file that defines
# each (docs/ARCHITECTURE.md, "Experiment layout"): the manager's own files
# in manager/, which lies below the experiment layer; the rest in
# experiment/. Everyone else uses the constants.
EXPERIMENT_NAMES = {
    '".cairn.lock"': "src/manager/layout.h",
    '"checkpoint_manager.json"': "src/manager/layout.h",
    '"trainer_state.json"': "src/experiment/layout.h",
    '"tuner_state.json"': "src/experiment/layout.h",
}

MAX_LINES = 800

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
# A call of the C library's getenv (not a member named so, e.g. AwsEnvironment's).
GETENV = re.compile(r"(?<![\w.>])(?:std::|::)?(?:secure_)?getenv\s*\(")
SOURCE_SUFFIXES = {".cc", ".h", ".cu", ".cuh"}


def sources(folder: pathlib.Path):
    return sorted(p for p in folder.rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file())


def part_of_include(target: str):
    """The part an #include "target" belongs to, or None if not Cairn's."""
    first, _, rest = target.partition("/")
    if not rest:
        return None
    if first == "cairn":
        return PUBLIC_HEADERS.get(pathlib.PurePath(rest).stem, "?" + rest)
    # src/train/workers/... and the like belong to their top folder.
    return first if first in LAYERS else None


def check(root: pathlib.Path):
    problems = []
    src = root / "src"
    rank = {name: i for i, name in enumerate(LAYERS)}
    for folder in sorted(p for p in src.iterdir() if p.is_dir()):
        own = folder.name
        if own not in rank:
            problems.append(
                f"{folder.relative_to(root)}: a folder of src/ not in LAYERS "
                "(scripts/check_layers.py): say where it sits"
            )
            continue
        for path in sources(folder):
            rel = path.relative_to(root)
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
            if len(lines) > MAX_LINES:
                problems.append(f"{rel}: {len(lines)} lines, above {MAX_LINES}: split it")
            for n, line in enumerate(lines, 1):
                m = INCLUDE.match(line)
                if m:
                    target = m.group(1)
                    part = part_of_include(target)
                    if part is None:
                        continue
                    if part.startswith("?"):
                        problems.append(
                            f"{rel}:{n}: public header cairn/{part[1:]} has no part "
                            "in PUBLIC_HEADERS (scripts/check_layers.py)"
                        )
                    elif rank[part] > rank[own]:
                        problems.append(
                            f'{rel}:{n}: {own}/ includes "{target}" of {part}/, a layer above it'
                        )
                    if target == "storage/backends.h" and own != "storage":
                        problems.append(
                            f"{rel}:{n}: storage/backends.h is for tests; open storage by URI"
                        )
                if GETENV.search(line) and str(rel) != "src/util/settings.cc":
                    problems.append(
                        f"{rel}:{n}: getenv outside src/util/settings.cc; "
                        "read settings through util/settings.h"
                    )
                for name, home in EXPERIMENT_NAMES.items():
                    if name in line and rel.as_posix() != home:
                        problems.append(
                            f"{rel}:{n}: experiment file name {name} written out; "
                            f"use the constant of {home}"
                        )

    python = root / "python"
    for path in [p for p in python.glob("*") if p.suffix in SOURCE_SUFFIXES]:
        rel = path.relative_to(root)
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        if len(lines) > MAX_LINES:
            problems.append(f"{rel}: {len(lines)} lines, above {MAX_LINES}: split it")
        for n, line in enumerate(lines, 1):
            m = INCLUDE.match(line)
            if m and "/" in m.group(1) and not m.group(1).startswith("cairn/"):
                problems.append(
                    f'{rel}:{n}: the binding includes "{m.group(1)}"; it uses public headers only'
                )
            if GETENV.search(line):
                problems.append(f"{rel}:{n}: getenv in the binding")
    return problems


def self_test():
    """Each rule catches what it is for, on a small tree made up here."""
    import tempfile

    files = {
        "src/storage/ok.cc": '#include "util/fs.h"\n#include "cairn/storage.h"\n',
        "src/storage/up.cc": '#include "checkpoint/copy.h"\n',
        "src/checkpoint/public_up.cc": '#include "cairn/manager.h"\n',
        "src/train/backend.cc": '#include "storage/backends.h"\n',
        "src/train/env.cc": 'auto v = std::getenv("X");\nauto w = env.getenv("Y");\n',
        "src/tune/name.cc": 'auto n = "tuner_state.json";\n',
        "src/experiment/layout.h": 'auto k = "tuner_state.json";\n',
        "src/nowhere/x.cc": "",
        "src/util/big.cc": "\n" * (MAX_LINES + 1),
        "python/_x.cc": '#include "cairn/state.h"\n#include "engine/io.h"\n',
    }
    expected = [
        "src/storage/up.cc:1: storage/ includes",
        "src/checkpoint/public_up.cc:1: checkpoint/ includes",
        "src/train/backend.cc:1: storage/backends.h is for tests",
        "src/train/env.cc:1: getenv",
        "src/tune/name.cc:1: experiment file name",
        "src/nowhere: a folder of src/ not in LAYERS",
        "src/util/big.cc: 801 lines",
        "python/_x.cc:2: the binding includes",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        for name, text in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
        problems = check(root)
    missed = [e for e in expected if not any(p.startswith(e) for p in problems)]
    extra = [p for p in problems if not any(p.startswith(e) for e in expected)]
    for m in missed:
        print(f"self-test: not caught: {m}")
    for x in extra:
        print(f"self-test: caught wrongly: {x}")
    return 1 if missed or extra else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parent.parent
    )
    parser.add_argument(
        "--self-test",
        action="store_true",
        help="check that each rule catches a made-up violation, then exit",
    )
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    problems = check(args.root)
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print("check_layers: the include graph follows the layers; no other rule broken")
    return 0


if __name__ == "__main__":
    sys.exit(main())
