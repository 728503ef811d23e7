#!/usr/bin/env bash
# Runs every benchmark of docs/benchmarks.md in one go: fio's disk bandwidth,
# memcpy, Cairn's save / async-save stall / loads, LibTorch torch::save/load
# and Python's torch.save/load on the same ~2 GiB transformer + Adam state,
# then prints one table with the targets (PASS/MISS and the ratio) and writes
# the full report to build-bench/bench-results.json. Then the Trainer's step
# time with asynchronous, synchronous and no checkpoints every step
# (bench/train_step_bench.cc; build-bench/train-step-results.json). Then the
# Tuner's overhead: experiment-state saving against the wall time with 1,000
# short trials and with 10,000 results, trial start latency and one state
# save as trials grow (bench/tune_bench.cc; build-bench/tune-results.json).
#
# Usage: scripts/bench.sh [--size-mib N] [--runs N] [--no-hugetlb] [--dir DIR] [--s3]
#   --size-mib 64 --runs 1   a quick run (the default is 2048 MiB, 3 runs)
#   --s3                     then also the S3 benchmark (bench/s3_bench.py:
#                            aws-cli, rclone, `cairn cp` and the server's
#                            ceiling against one local moto S3 server), with the same
#                            size and runs; its report goes to
#                            build-bench/s3-bench-results.json
# Benchmark files go to a new directory under build-bench (or DIR) and are
# removed after.
# Run as root to drop the page cache between runs (otherwise the benchmarks
# fall back to posix_fadvise(DONTNEED) on their own files and say so).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release -DCAIRN_TORCH=ON >/dev/null
ninja -C build-bench -j "${JOBS:-2}" cairn_bench torch_bench cairn train_step_bench tune_bench

base=build-bench
args=()
s3=0
s3args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) base="$2"; shift 2 ;;
    --s3) s3=1; shift ;;
    --size-mib) args+=("$1" "$2")
                s3args+=(--size-gib "$(awk -v m="$2" 'BEGIN { print m / 1024 }')"); shift 2 ;;
    --runs) args+=("$1" "$2"); s3args+=("$1" "$2"); shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
mkdir -p "$base"
# A fresh directory of our own inside BASE, so cleaning up never touches
# anything else there.
dir=$(mktemp -d "$base/bench-data.XXXXXX")
trap 'rm -rf "$dir"' EXIT

.venv/bin/python3 bench/run.py --cairn build-bench/bench/cairn_bench \
  --libtorch build-bench/bench/torch_bench --dir "$dir" \
  --json build-bench/bench-results.json "${args[@]}"

# The Trainer's step time: asynchronous vs synchronous report vs none.
build-bench/bench/train_step_bench --dir "$dir/train-step" \
  --json build-bench/train-step-results.json

# The Tuner's overhead (about half a minute on 2 cores).
build-bench/bench/tune_bench --dir "$dir/tune" --json build-bench/tune-results.json

if [ "$s3" = 1 ]; then
  .venv/bin/python3 bench/s3_bench.py --cairn build-bench/src/cli/cairn --dir "$dir" \
    --json build-bench/s3-bench-results.json "${s3args[@]}"
fi
