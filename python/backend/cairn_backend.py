"""The PEP 517 build backend behind ``pip install .`` (pyproject.toml).

It needs nothing but the standard library, CMake and Ninja, so the package
installs offline with what Debian ships::

    python3 -m venv --system-site-packages .venv
    .venv/bin/pip install --no-index --no-build-isolation .

``build_wheel`` works in three steps:

1. configure Cairn with CMake (Release; tests, examples, benchmarks, the CLI,
   the LibTorch adapter, MPI and install rules off; the Python package on,
   for the interpreter that runs this backend, i.e. pip's);
2. build the ``cairn_python`` target with Ninja: the ``_cairn`` extension
   and what it links (Cairn's core and format libraries, static);
3. write the wheel: every ``*.py``, ``*.pyi`` and ``py.typed`` under
   ``python/cairn`` (subpackages included), the extension, and the
   ``.dist-info`` files (METADATA, WHEEL, RECORD with sha256 hashes).

The extension links Debian's shared libraries (fmt, spdlog, xxHash, libcurl,
OpenSSL, pugixml), so the wheel is for the machine, or an identical one,
that built it: its platform tag is ``linux_x86_64``, not ``manylinux``.

Settings, as ``pip install -C KEY=VALUE`` (``--config-settings``) or from
the environment:

- ``build-dir`` / ``CAIRN_WHEEL_BUILD_DIR``: CMake's build folder, kept
  between installs so that a second one only rebuilds what changed; default
  ``build-wheel/<wheel tag>-<interpreter hash>`` in the checkout (ignored by
  git). A folder given here must not be shared by two interpreters.
- ``cmake-args`` / ``CAIRN_CMAKE_ARGS``: more CMake arguments, split as a
  shell would (``-DCAIRN_S3=OFF``).
- ``JOBS`` or ``CMAKE_BUILD_PARALLEL_LEVEL``: Ninja's parallel jobs; default
  the CPUs this process may use.

ccache is used when it is on ``PATH`` (``CCACHE_*`` settings pass through).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Optional

__all__ = [
    "get_requires_for_build_wheel",
    "get_requires_for_build_sdist",
    "prepare_metadata_for_build_wheel",
    "build_wheel",
    "build_sdist",
]

ConfigSettings = Optional[Mapping[str, Any]]

_SOURCE = Path.cwd()  # PEP 517: hooks run in the source tree's root
_PACKAGE_DIR = Path("python") / "cairn"
_PACKAGE_FILES = ("*.py", "*.pyi", "py.typed")
_CMAKE_OPTIONS = {
    "CMAKE_BUILD_TYPE": "Release",
    "CAIRN_PYTHON": "ON",
    "CAIRN_TORCH": "OFF",
    "CAIRN_BUILD_TESTS": "OFF",
    "CAIRN_BUILD_EXAMPLES": "OFF",
    "CAIRN_BUILD_BENCH": "OFF",
    "CAIRN_BUILD_CLI": "OFF",
    "CAIRN_MPI": "OFF",
    "CAIRN_INSTALL": "OFF",
    # An install must not fail on a warning a newer compiler adds;
    # Cairn's own builds keep -Werror.
    "CAIRN_WERROR": "OFF",
}


class BuildError(RuntimeError):
    """The build failed; the message says which step and how to see more."""


# ---- metadata ---------------------------------------------------------------


def _version() -> str:
    """The project's version: ``project(cairn VERSION x.y.z)`` in CMakeLists.txt."""
    text = (_SOURCE / "CMakeLists.txt").read_text(encoding="utf-8")
    m = re.search(r"^project\(cairn\s+VERSION\s+([0-9][0-9.]*)", text, re.MULTILINE)
    if m is None:
        raise BuildError("CMakeLists.txt: no `project(cairn VERSION x.y.z)` line")
    return m.group(1)


def _project() -> dict[str, Any]:
    """pyproject.toml's [project] table."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise BuildError(
                "reading pyproject.toml needs Python 3.11 or newer (tomllib), or tomli"
            ) from None
    with open(_SOURCE / "pyproject.toml", "rb") as f:
        return dict(tomllib.load(f)["project"])


def _metadata() -> str:
    """The Core Metadata (version 2.1) of the distribution: METADATA and PKG-INFO."""
    project = _project()
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {_version()}",
        f"Summary: {project['description']}",
        f"Requires-Python: {project['requires-python']}",
    ]
    for extra, requirements in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {r}; extra == "{extra}"' for r in requirements]
    body = ""
    readme = project.get("readme")
    if readme:
        lines.append("Description-Content-Type: text/markdown")
        body = (_SOURCE / readme).read_text(encoding="utf-8")
    return "\n".join(lines) + "\n\n" + body


def _tag() -> str:
    """The wheel's tag for this interpreter, e.g. ``cp311-cp311-linux_x86_64``."""
    if sys.implementation.name != "cpython":
        raise BuildError(f"the extension is built for CPython, not {sys.implementation.name}")
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    abi = python + sys.abiflags
    platform = re.sub(r"[^A-Za-z0-9_]", "_", sysconfig.get_platform())
    return f"{python}-{abi}-{platform}"


def _dist_info_name() -> str:
    return f"cairn-{_version()}.dist-info"


def _wheel_file(tag: str) -> str:
    return f"Wheel-Version: 1.0\nGenerator: cairn_backend\nRoot-Is-Purelib: false\nTag: {tag}\n"


# ---- building the extension ---------------------------------------------------


def _setting(settings: ConfigSettings, key: str, env: str) -> Optional[str]:
    value = (settings or {}).get(key)
    if isinstance(value, list):  # given more than once: the last one wins
        value = value[-1] if value else None
    return value or os.environ.get(env) or None


def _jobs() -> str:
    for env in ("JOBS", "CMAKE_BUILD_PARALLEL_LEVEL"):
        if os.environ.get(env):
            return os.environ[env]
    try:
        return str(len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return str(os.cpu_count() or 1)


def _run(step: str, command: list[str]) -> None:
    print(f"cairn_backend: {step}: {shlex.join(command)}", file=sys.stderr, flush=True)
    try:
        subprocess.run(command, check=True, stdout=sys.stderr)
    except FileNotFoundError:
        raise BuildError(
            f"{step}: {command[0]} is not installed (scripts/install-deps.sh installs it)"
        ) from None
    except subprocess.CalledProcessError as e:
        raise BuildError(
            f"{step} failed (exit {e.returncode}); run pip with -v to see its output"
        ) from None


def _interpreter_id() -> str:
    """Short hash of the interpreter's installation and version.

    CMake's FindPython caches the headers it found for an executable path;
    a venv recreated at the same path over another Python would reuse them.
    One build folder per interpreter avoids that.
    """
    ident = "\0".join((sys.base_prefix, sys.version, sysconfig.get_path("include") or ""))
    return hashlib.sha256(ident.encode("utf-8")).hexdigest()[:8]


def _build_extension(settings: ConfigSettings, tag: str) -> list[Path]:
    """Configures and builds the extensions; returns their files in the build folder.

    ``_cairn`` always; ``_cairn_torch`` and the ``_torch_target.py`` that
    names its torch when the interpreter has a torch (its wheel carries
    LibTorch's headers and CMake files) and CAIRN_PYTHON_TORCH is on.
    """
    build = Path(
        _setting(settings, "build-dir", "CAIRN_WHEEL_BUILD_DIR")
        or _SOURCE / "build-wheel" / f"{tag}-{_interpreter_id()}"
    ).resolve()
    configure = [
        "cmake",
        "-S",
        str(_SOURCE),
        "-B",
        str(build),
        "-G",
        "Ninja",
        f"-DPython_EXECUTABLE={sys.executable}",
    ]
    configure += [f"-D{k}={v}" for k, v in _CMAKE_OPTIONS.items()]
    if shutil.which("ccache"):
        configure += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache", "-DCMAKE_C_COMPILER_LAUNCHER=ccache"]
    configure += shlex.split(_setting(settings, "cmake-args", "CAIRN_CMAKE_ARGS") or "")
    _run("configure", configure)
    _run("build", ["ninja", "-C", str(build), "-j", _jobs(), "cairn_python"])

    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    extension = build / "python" / "cairn" / f"_cairn{suffix}"
    if not extension.is_file():
        found = sorted(p.name for p in (build / "python" / "cairn").glob("_cairn*"))
        raise BuildError(
            f"the build made no {extension} (found: {', '.join(found) or 'nothing'}); "
            "the Python package is built only when pybind11-dev and python3-dev are installed"
        )
    torch = [
        build / "python" / "cairn" / f"_cairn_torch{suffix}",
        build / "python" / "cairn" / "_torch_target.py",
    ]
    return [extension] + (torch if all(p.is_file() for p in torch) else [])


def _package_files() -> Iterator[tuple[str, Path]]:
    """(name in the wheel, source file) of the pure-Python files, sorted."""
    root = _SOURCE / _PACKAGE_DIR
    files: set[Path] = set()
    for pattern in _PACKAGE_FILES:
        files.update(p for p in root.rglob(pattern) if p.is_file() and "__pycache__" not in p.parts)
    for path in sorted(files):
        yield "cairn/" + path.relative_to(root).as_posix(), path


# ---- writing the wheel --------------------------------------------------------


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode("ascii")


class _WheelWriter:
    """A wheel zip whose RECORD lists every file with its sha256 and size."""

    def __init__(self, path: Path, dist_info: str) -> None:
        self._zip = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED)
        self._dist_info = dist_info
        self._records: list[tuple[str, str, str]] = []

    def add(self, name: str, data: bytes, executable: bool = False) -> None:
        # A fixed timestamp: the same sources give the same wheel.
        info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = (0o755 if executable else 0o644) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self._zip.writestr(info, data)
        self._records.append((name, _record_hash(data), str(len(data))))

    def close(self) -> None:
        record = f"{self._dist_info}/RECORD"
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerows(self._records)
        writer.writerow((record, "", ""))
        info = zipfile.ZipInfo(record, date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        self._zip.writestr(info, out.getvalue(), compress_type=zipfile.ZIP_DEFLATED)
        self._zip.close()


# ---- PEP 517 hooks -------------------------------------------------------------


def get_requires_for_build_wheel(config_settings: ConfigSettings = None) -> list[str]:
    """Nothing from PyPI: CMake, Ninja, pybind11 and a compiler come from the system."""
    return []


def get_requires_for_build_sdist(config_settings: ConfigSettings = None) -> list[str]:
    return []


def prepare_metadata_for_build_wheel(
    metadata_directory: str, config_settings: ConfigSettings = None
) -> str:
    """Writes ``cairn-<version>.dist-info`` (METADATA, WHEEL) without building."""
    dist_info = Path(metadata_directory) / _dist_info_name()
    dist_info.mkdir(parents=True, exist_ok=True)
    (dist_info / "METADATA").write_text(_metadata(), encoding="utf-8")
    (dist_info / "WHEEL").write_text(_wheel_file(_tag()), encoding="utf-8")
    return dist_info.name


def build_wheel(
    wheel_directory: str,
    config_settings: ConfigSettings = None,
    metadata_directory: Optional[str] = None,
) -> str:
    """Builds the extension with CMake and Ninja and writes the wheel; returns its name."""
    tag = _tag()
    extensions = _build_extension(config_settings, tag)
    dist_info = _dist_info_name()
    name = f"cairn-{_version()}-{tag}.whl"
    target = Path(wheel_directory) / name
    partial = target.with_suffix(".whl.part")
    wheel = _WheelWriter(partial, dist_info)
    try:
        for arcname, path in _package_files():
            wheel.add(arcname, path.read_bytes())
        for extension in extensions:
            wheel.add(
                f"cairn/{extension.name}",
                extension.read_bytes(),
                executable=extension.suffix != ".py",
            )
        wheel.add(f"{dist_info}/METADATA", _metadata().encode("utf-8"))
        wheel.add(f"{dist_info}/WHEEL", _wheel_file(tag).encode("utf-8"))
        wheel.close()
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    print(f"cairn_backend: wrote {target}", file=sys.stderr, flush=True)
    return name


def _source_files() -> list[str]:
    """The files git tracks; without git, the tree less build folders and caches."""
    try:
        out = subprocess.run(
            ["git", "-C", str(_SOURCE), "ls-files", "-z"], check=True, capture_output=True
        ).stdout
        return sorted(f for f in out.decode("utf-8").split("\0") if f and (_SOURCE / f).is_file())
    except (FileNotFoundError, subprocess.CalledProcessError):
        skip = re.compile(r"^(build[^/]*|\.git|\.venv|\.cache)(/|$)|(^|/)__pycache__(/|$)")
        return sorted(
            p.relative_to(_SOURCE).as_posix()
            for p in _SOURCE.rglob("*")
            if p.is_file() and not skip.search(p.relative_to(_SOURCE).as_posix())
        )


def build_sdist(sdist_directory: str, config_settings: ConfigSettings = None) -> str:
    """A ``cairn-<version>.tar.gz`` of the tracked sources with PKG-INFO at its top."""
    base = f"cairn-{_version()}"
    name = f"{base}.tar.gz"

    def normalized(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        return info

    with tarfile.open(Path(sdist_directory) / name, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for rel in _source_files():
            tar.add(_SOURCE / rel, arcname=f"{base}/{rel}", recursive=False, filter=normalized)
        pkg_info = _metadata().encode("utf-8")
        info = normalized(tarfile.TarInfo(f"{base}/PKG-INFO"))
        info.size = len(pkg_info)
        info.mode = 0o644
        tar.addfile(info, io.BytesIO(pkg_info))
    return name
