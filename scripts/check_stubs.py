"""Checks the package's .pyi stubs against the built extension modules with
mypy's stubtest: every name a stub declares exists in the module with a
compatible kind (class, function, property, attribute), and every public
name of the module is declared. Exits non-zero with stubtest's report on
any difference.

Usage: .venv/bin/python3 scripts/check_stubs.py BUILD_PYTHON_DIR
(scripts/test.sh passes build/python, where the CMake build lays out the
package.)

pybind11 gives its functions no introspectable signatures, so stubtest
checks their names and kinds there, not their parameters; this script then
compares each stub's parameter names, in order, with the signature pybind11
writes on the first line of the function's docstring (every signature of an
overloaded one: the stub must match one of them). Two of its
reports say only that a class is pybind11's and are left out: "metaclass
differs" (pybind11's classes have a metaclass of their own, which stubs do
not spell) and an "__init__" without "*args" where the class has no
constructor bound (pybind11 gives it `(self, /, *args, **kwargs)`). Names
stubtest must not check are in scripts/stubtest-allowlist.txt, each with its
reason.
"""

import ast
import importlib
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


def _split_params(text: str) -> list[str]:
    """The comma-separated parts of a parameter list, brackets respected."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if text[start:].strip():
        parts.append(text[start:])
    return [p.strip() for p in parts]


def _pybind_signatures(name: str, doc: str) -> list[list[str]]:
    """The parameter names (self left out) of each signature pybind11 wrote
    for `name` in `doc`: one line "name(a: T, b: U = ...) -> R" per overload."""
    out = []
    for line in doc.splitlines():
        m = re.match(r"^\s*(?:\d+\. )?" + re.escape(name) + r"\((.*)\) -> ", line)
        if not m:
            continue
        names = [p.split(":")[0].split("=")[0].strip() for p in _split_params(m.group(1))]
        out.append([n.lstrip("*") for n in names if n and n not in ("self", "*", "/")])
    return out


def _stub_params(fn: ast.FunctionDef) -> list[str] | None:
    """The stub's parameter names in order (self left out), or None for one
    taking *args (a catch-all the docstring cannot be compared with)."""
    a = fn.args
    if a.vararg is not None:
        return None
    names = [x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]]
    if a.kwarg is not None:
        names.append(a.kwarg.arg)
    return names[1:] if names and names[0] in ("self", "cls") else names


def check_parameters(build: str, module_name: str) -> list[str]:
    """Stub functions whose parameter names differ from pybind11's signature."""
    stub = os.path.join(build, *module_name.split(".")) + ".pyi"
    sys.path.insert(0, build)
    try:
        module = importlib.import_module(module_name)
    finally:
        sys.path.pop(0)
    tree = ast.parse(open(stub).read())
    problems = []

    def visit(body: list[ast.stmt], owner: object, prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                cls = getattr(owner, node.name, None)
                if cls is not None:
                    visit(node.body, cls, f"{prefix}{node.name}.")
            elif isinstance(node, ast.FunctionDef):
                params = _stub_params(node)
                target = getattr(owner, node.name, None)
                doc = getattr(target, "__doc__", None) or ""
                signatures = _pybind_signatures(node.name, doc)
                if params is None or not signatures or params in signatures:
                    continue
                problems.append(
                    f"{module_name}.{prefix}{node.name}: the stub's parameters {params} are "
                    f"not the module's {' or '.join(str(s) for s in signatures)}"
                )

    visit(tree.body, module, "")
    return problems


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
    mismatched = [p for m in modules for p in check_parameters(build, m)]
    if mismatched:
        print("\n".join(mismatched), file=sys.stderr)
        print(f"check_stubs: {len(mismatched)} stubs name other parameters", file=sys.stderr)
        return 1
    print(f"stubtest: the stubs of {', '.join(modules)} agree with the modules, parameters too")
    return 0


if __name__ == "__main__":
    sys.exit(main())
