#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) in build-fuzz and runs
# each on its seed corpus for a bounded time. Exits non-zero on a crash, a
# leak or undefined behaviour; the failing input is left in
# build-fuzz/<target>-crash-* (or leak-*, timeout-*) to reproduce with
#   build-fuzz/fuzz/<target> <that file>
# The committed corpus in fuzz/corpus/ is never modified (new inputs go to a
# temporary directory).
# Usage: scripts/fuzz.sh [seconds per target]   (default FUZZ_SECONDS or 30)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-${FUZZ_SECONDS:-30}}
jobs=${JOBS:-2}
targets=(safetensors_header_fuzz manifest_fuzz)

# The libraries get coverage instrumentation (fuzzer-no-link) and the
# sanitizers (CAIRN_SANITIZE); the fuzz targets link libFuzzer itself.
# Warnings are enforced by the g++ build; clang's extra ones do not fail this.
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCAIRN_FUZZ=ON -DCAIRN_SANITIZE=ON -DCAIRN_TORCH=OFF -DCAIRN_WERROR=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link" >/dev/null
ninja -C build-fuzz -j "$jobs" "${targets[@]}"

status=0
for t in "${targets[@]}"; do
  work=$(mktemp -d)
  dict=()
  [ -f "fuzz/$t.dict" ] && dict=(-dict="fuzz/$t.dict")
  echo "== fuzzing $t for ${seconds}s"
  if ! ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
       UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
       "build-fuzz/fuzz/$t" -max_total_time="$seconds" -max_len=16384 -rss_limit_mb=2048 \
         -timeout=10 -print_final_stats=1 -artifact_prefix="build-fuzz/$t-" \
         "${dict[@]}" "$work" "fuzz/corpus/$t"; then
    echo "fuzz: $t failed (input saved under build-fuzz/$t-*)"
    status=1
  fi
  rm -rf "$work"
done
exit $status
