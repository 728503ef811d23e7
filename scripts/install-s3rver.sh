#!/usr/bin/env bash
# Installs the S3-compatible server the tests and benchmarks start on
# 127.0.0.1: s3rver from npm, pinned with tests/support/s3rver/package-lock.json,
# into $CAIRN_S3RVER_DIR (default ~/.cache/cairn/s3rver-<lock hash>).
# Prints the path of s3rver's entry script. Idempotent and quick when done.
set -euo pipefail
src="$(cd "$(dirname "$0")/../tests/support/s3rver" && pwd)"
# The lock and this script (its patch below) name the installation.
hash=$(cat "$src/package-lock.json" "$0" | sha256sum | cut -c1-12)
dir=${CAIRN_S3RVER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cairn/s3rver-$hash}
entry="$dir/node_modules/s3rver/bin/s3rver.js"
if [ ! -f "$dir/.installed" ]; then
  mkdir -p "$dir"
  cp "$src/package.json" "$src/package-lock.json" "$dir/"
  (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >&2)
  # s3rver 3.7 creates an object's folder, then opens the object's file
  # without an error handler and answers before the file is written. A
  # DELETE that empties that folder in between removes it (s3rver removes
  # empty folders): the open fails with ENOENT, and the unhandled 'error'
  # event kills the server. Seen with keys spread over prefixes (a folder per
  # prefix holding one object). Patched: the PUT answers once the file is
  # written, and fails with 500 (which clients retry) when it cannot be.
  python3 - "$dir/node_modules/s3rver/lib/stores/filesystem.js" <<'PATCH'
import sys
path = sys.argv[1]
text = open(path).read()
edits = [
    ("      const writeStream = fs.createWriteStream(objectPath);\n",
     "      const writeStream = fs.createWriteStream(objectPath);\n"
     "      writeStream.on('error', reject);\n"),
    ("        writeStream.end(object.content);\n"
     "        md5Context.update(object.content);\n"
     "        resolve([object.content.length, md5Context.digest('hex')]);\n",
     "        md5Context.update(object.content);\n"
     "        const digest = md5Context.digest('hex');\n"
     "        writeStream.on('finish', () => resolve([object.content.length, digest]));\n"
     "        writeStream.end(object.content);\n"),
    ("          .on('error', reject)\n"
     "          .on('finish', () => resolve([totalLength, md5Context.digest('hex')]))\n"
     "          .pipe(writeStream);\n",
     "          .on('error', reject)\n"
     "          .pipe(writeStream)\n"
     "          .on('finish', () => resolve([totalLength, md5Context.digest('hex')]));\n"),
]
for old, new in edits:
    if text.count(old) != 1:
        sys.exit("install-s3rver.sh: cannot patch " + path + ": the code changed")
    text = text.replace(old, new)
open(path, "w").write(text)
PATCH
  touch "$dir/.installed"
fi
echo "$entry"
