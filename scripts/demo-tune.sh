#!/usr/bin/env bash
# The tuning-runtime demo, end to end: builds the PBT example (Population
# Based Training over a small LibTorch MLP, 8 trials, 2 at a time, the
# learning rate searched and perturbed, model and optimizer checkpointed
# every iteration with the LibTorch adapter), runs it until the driver kills
# itself with SIGKILL at the 30th result (an intentional crash: exit 137),
# lists the half-done experiment with `cairn ls`, continues it with
# Tuner::restore until every trial is TERMINATED, and verifies every
# checkpoint with `cairn verify`.
#
# Usage: scripts/demo-tune.sh       (from anywhere in the checkout)
# Environment: JOBS (default 2); BUILD_DIR (default build); CAIRN_DEMO_STORAGE
# to keep the experiment (default: a temporary directory removed at exit).
# Exits non-zero if the build, the crash, the restored run or the
# verification does not go as described.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/demo-common.sh
demo_build cairn cairn_tune_pbt_torch_example
demo_storage cairn-demo-tune

example=$build/examples/tune/cairn_tune_pbt_torch_example
cairn=$build/src/cli/cairn
name=pbt_torch
if [ -e "$storage/$name" ]; then
  echo "demo-tune: $storage/$name exists; remove it or set CAIRN_DEMO_STORAGE elsewhere" >&2
  exit 1
fi

echo
echo "== run 1: PBT, 8 trials; the driver kills itself with SIGKILL at the 30th result"
echo "\$ cairn_tune_pbt_torch_example --storage $storage --name $name --crash-after-results 30"
set +e
"$example" --storage "$storage" --name "$name" --crash-after-results 30
rc=$?
set -e
if [ "$rc" -ne 137 ]; then
  echo "demo-tune: expected the driver's death by SIGKILL (exit 137), got exit $rc" >&2
  exit 1
fi
echo "(exit $rc: killed by SIGKILL; its trial processes died with it)"

echo
echo "== the interrupted experiment, as the cairn CLI sees it"
echo "\$ cairn ls $storage/$name"
"$cairn" ls "$storage/$name"

echo
echo "== run 2: Tuner::restore continues the experiment (the same PBT scheduler, its state restored)"
echo "\$ cairn_tune_pbt_torch_example --storage $storage --name $name --restore"
"$example" --storage "$storage" --name "$name" --restore

echo
echo "\$ cairn ls $storage/$name"
"$cairn" ls "$storage/$name"
echo
echo "== verify every checkpoint"
echo "\$ cairn verify $storage/$name"
"$cairn" verify "$storage/$name"
echo
echo "demo-tune: OK"
