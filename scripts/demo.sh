#!/usr/bin/env bash
# The main demo, end to end: installs dependencies, builds `cairn` and
# `cairn_demo`, trains a logistic regression that checkpoints every epoch and
# fails on purpose after epoch 5, runs it again so that it resumes from the
# latest checkpoint and finishes, then lists and verifies the experiment with
# the `cairn` CLI. Then the Python demo (scripts/demo-python.sh), the
# training-runtime demo and the tuning demo.
#
# Usage: scripts/demo.sh            (from anywhere in the checkout)
# Environment: JOBS (default 2); BUILD_DIR (default build); CAIRN_DEMO_STORAGE
# to keep the experiment in a directory of your choice (default: a temporary
# directory removed at exit).
# Exits non-zero if the build, the resumed run, or the verification fails.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/demo-common.sh
demo_build cairn cairn_demo
demo_storage cairn-demo

demo=("$build/examples/cairn_demo" --storage "$storage" --experiment logreg --epochs 8
  --num-to-keep 3 --score-attribute loss --score-order min --fail-at-epoch 5)
cairn=$build/src/cli/cairn

echo
echo "== run 1: train; the run fails on purpose after epoch 5"
echo "\$ ${demo[*]}"
set +e
"${demo[@]}"
rc=$?
set -e
if [ "$rc" -ne 3 ]; then
  echo "demo: expected the injected failure (exit 3), got exit $rc" >&2
  exit 1
fi
echo "(exit $rc: the injected failure; checkpoints up to epoch 5 are committed)"

echo
echo "== run 2: the same command resumes from the latest checkpoint and finishes"
echo "\$ ${demo[*]}"
"${demo[@]}"

echo
echo "== the experiment, as the cairn CLI sees it"
echo "\$ cairn ls $storage"
"$cairn" ls "$storage"
echo
echo "\$ cairn verify $storage"
"$cairn" verify "$storage"

echo
echo "== Python demo: a PyTorch model checkpointed with cairn.save and cairn.CheckpointManager (scripts/demo-python.sh)"
CAIRN_DEPS_READY=1 bash scripts/demo-python.sh

if [ -f scripts/demo-train.sh ]; then
  echo
  echo "== distributed training demo (scripts/demo-train.sh)"
  CAIRN_DEPS_READY=1 bash scripts/demo-train.sh
fi

if [ -f scripts/demo-tune.sh ]; then
  echo
  echo "== tuning demo: PBT over a LibTorch model, a driver crash and Tuner::restore (scripts/demo-tune.sh)"
  CAIRN_DEPS_READY=1 bash scripts/demo-tune.sh
fi
