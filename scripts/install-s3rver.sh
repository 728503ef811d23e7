#!/usr/bin/env bash
# Installs the S3-compatible server the tests and benchmarks start on
# 127.0.0.1: s3rver from npm, pinned with tests/support/s3rver/package-lock.json,
# into $CAIRN_S3RVER_DIR (default ~/.cache/cairn/s3rver-<lock hash>).
# Prints the path of s3rver's entry script. Idempotent and quick when done.
set -euo pipefail
src="$(cd "$(dirname "$0")/../tests/support/s3rver" && pwd)"
hash=$(sha256sum "$src/package-lock.json" | cut -c1-12)
dir=${CAIRN_S3RVER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cairn/s3rver-$hash}
entry="$dir/node_modules/s3rver/bin/s3rver.js"
if [ ! -f "$dir/.installed" ]; then
  mkdir -p "$dir"
  cp "$src/package.json" "$src/package-lock.json" "$dir/"
  (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >&2)
  touch "$dir/.installed"
fi
echo "$entry"
