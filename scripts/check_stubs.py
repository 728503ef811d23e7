"""Checks the package's .pyi stubs against the built extension modules with
mypy's stubtest: every name a stub declares exists in the module with a
compatible kind (class, function, property, attribute), and every public
name of the module is declared. Exits non-zero with stubtest's report on
any difference.

Usage: .venv/bin/python3 scripts/check_stubs.py BUILD_PYTHON_DIR
(scripts/test.sh passes build/python, where the CMake build lays out the
package.)

pybind11 gives its functions no introspectable signatures, so stubtest
checks their names and kinds there, not their parameters. Two of its
reports say only that a class is pybind11's and are left out: "metaclass
differs" (pybind11's classes have a metaclass of their own, which stubs do
not spell) and an "__init__" without "*args" where the class has no
constructor bound (pybind11 gives it `(self, /, *args, **kwargs)`). Names
stubtest must not check are in scripts/stubtest-allowlist.txt, each with its
reason.
"""

import os
import re
import subprocess
import sys

# The extension modules with stubs; cairn._cairn_torch only where it was built.
MODULES = ["cairn._cairn", "cairn._cairn_torch"]

# stubtest's reports (--concise: one line each) that say only that a class
# is pybind11's.
PYBIND11 = [
    re.compile(r"^\S+ is inconsistent, metaclass differs$"),
    re.compile(r'^\S+\.__init__ is inconsistent, stub does not have \*args parameter "args"$'),
]


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    build = os.path.abspath(sys.argv[1])
    modules = [
        m
        for m in MODULES
        if any(
            f.startswith(m.split(".")[-1] + ".") and f.endswith(".so")
            for f in os.listdir(os.path.join(build, "cairn"))
        )
    ]
    if "cairn._cairn" not in modules:
        print(f"check_stubs: no cairn._cairn extension under {build}", file=sys.stderr)
        return 1
    env = dict(os.environ, PYTHONPATH=build, MYPYPATH=build)
    cmd = [sys.executable, "-m", "mypy.stubtest", "--concise", *modules]
    allowlist = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stubtest-allowlist.txt")
    if os.path.exists(allowlist):
        cmd += ["--allowlist", allowlist]
    proc = subprocess.run(cmd, env=env, cwd=build, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    errors = [e for e in lines if not any(p.match(e) for p in PYBIND11)]
    errors = [e for e in errors if not re.match(r"^Found \d+ errors?", e)]
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and not lines):
        print(proc.stdout + proc.stderr, file=sys.stderr)
        print(f"check_stubs: stubtest failed to run (exit {proc.returncode})", file=sys.stderr)
        return 1
    if errors:
        print("\n".join(errors), file=sys.stderr)
        print(
            f"check_stubs: {len(errors)} differences between the stubs and the modules",
            file=sys.stderr,
        )
        return 1
    print(f"stubtest: the stubs of {', '.join(modules)} agree with the modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
