#!/usr/bin/env bash
# The differential suite alone (docs/ray.md): the Ray guides' examples run
# under the real Ray and under Cairn, and every difference checked against
# docs/ray.md's table. Needs the project venv and the build
# (scripts/install-deps.sh, then the build of scripts/test.sh or by hand).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${CAIRN_BUILD_DIR:-build}
PYTHONPATH="$build/python" PYTHONDONTWRITEBYTECODE=1 exec .venv/bin/python3 -m pytest -q \
  -p no:cacheprovider python/tests/ray_compat "$@"
