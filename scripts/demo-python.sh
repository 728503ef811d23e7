#!/usr/bin/env bash
# The Python demo, end to end: builds the Python package (build/python/cairn)
# and runs examples/python/demo.py with the project venv's Python and torch: a small
# MLP trained with Adam, saved every epoch with cairn.save and registered
# with cairn.CheckpointManager (3 best by validation loss). The first run
# stops after epoch 3, as a preempted job would; the same command then
# resumes from the latest checkpoint, finishes, and checks its final weights
# against an uninterrupted run. Last, the `cairn` CLI lists and verifies what
# Python wrote.
#
# Usage: scripts/demo-python.sh     (from anywhere in the checkout)
# Environment: JOBS (default 2); BUILD_DIR (default build); CAIRN_DEMO_STORAGE
# to keep the experiment (default: a temporary directory removed at exit).
# Exits non-zero if the build, the resumed run or the verification fails.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/demo-common.sh
demo_build cairn cairn_python
demo_storage cairn-demo-python

demo=(.venv/bin/python3 examples/python/demo.py --storage "$storage" --experiment mlp --epochs 8)
export PYTHONPATH=$build/python PYTHONDONTWRITEBYTECODE=1

echo
echo "== Python run 1: train; the run stops after epoch 3"
echo "\$ PYTHONPATH=$build/python ${demo[*]} --stop-after-epoch 3"
"${demo[@]}" --stop-after-epoch 3

echo
echo "== Python run 2: the same command resumes from the latest checkpoint and finishes"
echo "\$ PYTHONPATH=$build/python ${demo[*]} --compare"
"${demo[@]}" --compare

echo
echo "== what Python wrote, as the cairn CLI sees it"
"$build/src/cli/cairn" ls "$storage/mlp"
"$build/src/cli/cairn" verify "$storage/mlp"
