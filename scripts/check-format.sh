#!/usr/bin/env bash
# Fails if clang-format would change any tracked C++ file, or ruff (the
# project venv's, configured in pyproject.toml) any Python file, or if ruff's
# lint finds a fault in one.
set -euo pipefail
cd "$(dirname "$0")/.."
bad=$(git ls-files '*.h' '*.cc' '*.cpp' | while read -r f; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || echo "$f"
done)
if [ -n "$bad" ]; then
  echo "clang-format would change:"; echo "$bad"
  echo "run: clang-format -i \$(git ls-files '*.h' '*.cc')"
  exit 1
fi
echo "clang-format: clean"
ruff=.venv/bin/ruff
if ! "$ruff" format --check --quiet .; then
  "$ruff" format --diff . 2>&1 | head -n 60
  echo "run: $ruff format ."
  exit 1
fi
if ! "$ruff" check --quiet .; then
  echo "run: $ruff check --fix ."
  exit 1
fi
echo "ruff: clean"
