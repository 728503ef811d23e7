#!/usr/bin/env bash
# The main demo, end to end: installs dependencies, builds `cairn` and
# `cairn_demo`, trains a logistic regression that checkpoints every epoch and
# fails on purpose after epoch 5, runs it again so that it resumes from the
# latest checkpoint and finishes, then lists and verifies the experiment with
# the `cairn` CLI.
#
# Usage: scripts/demo.sh            (from anywhere in the checkout)
# Environment: JOBS (default 2); BUILD_DIR (default build); CAIRN_DEMO_STORAGE
# to keep the experiment in a directory of your choice (default: a temporary
# directory removed at exit).
# Exits non-zero if the build, the resumed run, or the verification fails.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${JOBS:-2}
build=${BUILD_DIR:-build}

bash scripts/install-deps.sh

echo "== build (cairn, cairn_demo)"
# Same options as scripts/test.sh, so the two share the build directory.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCAIRN_WERROR=ON \
  -DCAIRN_TORCH=ON >/dev/null
ninja -C "$build" -j "$jobs" cairn cairn_demo

if [ -n "${CAIRN_DEMO_STORAGE:-}" ]; then
  storage=$CAIRN_DEMO_STORAGE
  mkdir -p "$storage"
else
  storage=$(mktemp -d "${TMPDIR:-/tmp}/cairn-demo-XXXXXX")
  trap 'rm -rf "$storage"' EXIT
fi

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

if [ -f scripts/demo-train.sh ]; then
  echo
  echo "== distributed training demo (scripts/demo-train.sh)"
  bash scripts/demo-train.sh
fi
