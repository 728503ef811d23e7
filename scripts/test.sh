#!/usr/bin/env bash
# Builds and runs every test: the normal build (warnings as errors, LibTorch
# adapter and Python package included, on the project venv's torch) and the
# Python package's pytest suite, then the package test (Cairn installed and
# used as a dependency, and the Python package pip-installed offline into a
# venv: tests/package/run.sh, counted as one test), then the CUDA
# configuration compiled and linked (scripts/check-cuda-build.sh; nothing runs
# without a GPU), then the fuzzers on their seed corpus, then the formatting,
# lint and stub checks; first of all, the architecture check
# (scripts/check_layers.py). Exits non-zero on the first failure.
#
# With --sanitize it runs the sanitizer pass instead: the ASan+UBSan build of
# the tests (without LibTorch, Python, the benchmarks and the radosgw
# repeats) and its ctest. That pass compiles everything a second time and
# runs the tests at a sanitizer's speed, which the test command's time budget
# does not hold (README); it is the pre-submit check a change to the C++ code
# runs as well (README, under the test command).
# Usage: scripts/test.sh [--sanitize]      (from anywhere in the checkout)
# Environment: JOBS (default 2), CAIRN_CRASH_ITERATIONS (default 200),
# SANITIZER_KILLS (the kills of each SIGKILL loop in the sanitizer pass,
# default 100: the normal build runs the full loops, the sanitizer build the
# same paths on a sample, which is what finds a memory error there).
set -euo pipefail
cd "$(dirname "$0")/.."
sanitize=0
case "${1:-}" in
  "") ;;
  --sanitize) sanitize=1 ;;
  *)
    echo "usage: scripts/test.sh [--sanitize]" >&2
    exit 2
    ;;
esac
jobs=${JOBS:-2}
started=$SECONDS
phase() {  # phase TITLE: a phase's heading, with the minutes spent so far
  echo "== $1 [at $(((SECONDS - started) / 60)) min $(((SECONDS - started) % 60)) s]"
}

phase "installing dependencies (scripts/install-deps.sh)"
bash scripts/install-deps.sh

passed=0
failed=0
run_ctest() {  # run_ctest BUILD_DIR LABEL [LABELS_TO_LEAVE_OUT]
  local log
  log=$(mktemp)
  set +e
  # The Python suite runs through run_pytest, which counts its tests one by one.
  ctest --test-dir "$1" -j "$jobs" --output-on-failure --timeout 900 -LE "${3:-python}" 2>&1 |
    tee "$log"
  local rc=${PIPESTATUS[0]}
  set -e
  local total fails
  total=$(grep -oE 'tests failed out of [0-9]+' "$log" | grep -oE '[0-9]+$' || echo 0)
  fails=$(grep -oE '[0-9]+ tests failed' "$log" | grep -oE '^[0-9]+' || echo 0)
  rm -f "$log"
  passed=$((passed + total - fails))
  failed=$((failed + fails))
  if [ "$rc" -ne 0 ]; then
    echo "test: $2 failed"
    echo "$passed passed, $failed failed"
    exit 1
  fi
}

run_pytest() {  # run_pytest BUILD_DIR: the Python package's tests, each counted
  local log
  log=$(mktemp)
  set +e
  PYTHONPATH="$1/python" PYTHONDONTWRITEBYTECODE=1 .venv/bin/python3 -m pytest -q -p no:cacheprovider --durations=25 \
    python/tests 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  set -e
  local ok bad
  ok=$(grep -oE '[0-9]+ passed' "$log" | tail -1 | grep -oE '^[0-9]+' || echo 0)
  bad=$({ grep -oE '[0-9]+ (failed|errors?)' "$log" || true; } | awk '{n += $1} END {print n + 0}')
  rm -f "$log"
  passed=$((passed + ok))
  failed=$((failed + ${bad:-0}))
  if [ "$rc" -ne 0 ]; then
    [ "${bad:-0}" -eq 0 ] && failed=$((failed + 1))  # no test ran, or pytest itself failed
    echo "test: Python tests failed"
    echo "$passed passed, $failed failed"
    exit 1
  fi
}

# ccache (installed by install-deps.sh) serves a rebuild on a machine that
# built before; on a fresh one it costs next to nothing. Paths under the
# checkout are made relative and the build folder is left out of the hash,
# so that the package test's builds (tests/package/run.sh) are served the
# normal build's objects.
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi

# The sanitizer pass (--sanitize).
sanitizer_pass() {
  phase "build (ASan + UBSan)"
  # LibTorch is left out of the sanitizer build: Debian's libtorch is not built
  # with ASan and its tests would be dominated by its own allocations.
  # The Python package too: an ASan extension would need the runtime preloaded
  # into the interpreter. The benchmarks' smoke runs and the radosgw repeats of
  # the S3 tests (what a production server checks, not Cairn's memory) run in
  # the normal build only.
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCAIRN_SANITIZE=ON -DCAIRN_TORCH=OFF \
    -DCAIRN_PYTHON=OFF -DCAIRN_BUILD_BENCH=OFF "${launcher[@]}" >/dev/null
  ninja -C build-asan -j "$jobs"
  phase "tests of the sanitizer build (ctest)"
  kills=${SANITIZER_KILLS:-100}
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    CAIRN_CRASH_ITERATIONS=$kills CAIRN_S3_KILL_ITERATIONS=$kills \
    run_ctest build-asan "sanitizer build" "python|radosgw"
}
if [ "$sanitize" -eq 1 ]; then
  sanitizer_pass
  phase "done"
  echo "$passed passed, $failed failed"
  exit 0
fi

phase "architecture (scripts/check_layers.py: layers, settings, experiment names, file sizes; scripts/check_docs.py: the files the docs name)"
if python3 scripts/check_layers.py --self-test && python3 scripts/check_layers.py &&
  python3 scripts/check_docs.py --self-test && python3 scripts/check_docs.py; then
  passed=$((passed + 1))
else
  echo "test: architecture check failed"
  echo "$passed passed, $((failed + 1)) failed"
  exit 1
fi

phase "build (RelWithDebInfo, -Werror, LibTorch adapter on, Python package)"
# shellcheck source=scripts/build-flags.sh
source scripts/build-flags.sh
cmake -S . -B build -G Ninja "${normal_build_flags[@]}" -DCAIRN_TORCH=ON "${launcher[@]}" >/dev/null
ninja -C build -j "$jobs"
phase "tests of the normal build (ctest)"
run_ctest build "normal build"
phase "Python package tests (pytest)"
run_pytest build

phase "package test (install, find_package, pkg-config, shared libraries, add_subdirectory, .deb, pip install .)"
if JOBS=$jobs bash tests/package/run.sh; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  echo "test: package test failed"
  echo "$passed passed, $failed failed"
  exit 1
fi

phase "CUDA configuration, compiled and linked (scripts/check-cuda-build.sh)"
if JOBS=$jobs bash scripts/check-cuda-build.sh; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  echo "test: the CUDA build failed"
  echo "$passed passed, $failed failed"
  exit 1
fi

if [ -x scripts/fuzz.sh ] || [ -f scripts/fuzz.sh ]; then
  phase "fuzzing (seed corpus, bounded time)"
  bash scripts/fuzz.sh
fi

phase "formatting, lint and stubs (clang-format, ruff, stubtest)"
bash scripts/check-format.sh
if .venv/bin/python3 scripts/check_stubs.py build/python; then
  passed=$((passed + 1))
else
  echo "test: the .pyi stubs disagree with the module"
  echo "$passed passed, $((failed + 1)) failed"
  exit 1
fi

phase "done"
echo "$passed passed, $failed failed"
