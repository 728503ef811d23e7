#!/usr/bin/env bash
# Fails if clang-format would change any tracked C++ file.
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
