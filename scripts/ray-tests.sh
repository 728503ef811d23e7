#!/usr/bin/env bash
# Ray's own public-API checkpoint tests run against Cairn, imports rewritten
# (docs/ray.md, "Ray's own tests"). By hand only: it needs a checkout of
# Ray's public repository (tag ray-2.58.0), which the user brings; nothing of
# Ray's is committed here or downloaded by this script. Needs the project
# venv and the build.
#   scripts/ray-tests.sh PATH_TO_RAY_CHECKOUT [--keep DIR] [-k EXPR]
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 PATH_TO_RAY_CHECKOUT [--keep DIR] [-k EXPR]" >&2
  exit 2
fi
ray_checkout=$(cd "$1" && pwd)
shift
cd "$(dirname "$0")/.."
build=${CAIRN_BUILD_DIR:-build}
PYTHONPATH="$PWD/$build/python" PYTHONDONTWRITEBYTECODE=1 exec .venv/bin/python3 \
  python/tests/ray_compat/run_ray_tests.py "$ray_checkout" "$@"
