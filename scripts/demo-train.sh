#!/usr/bin/env bash
# The training-runtime demo, end to end: builds the LibTorch example (the
# reference texts' PyTorch example in C++), trains a linear model with MSE and
# Adam data-parallel on two worker processes (each on half of the data,
# gradients averaged over a Gloo process group), every rank reporting the
# same checkpoint every epoch; an intentional error at epoch 1 stops the
# group, which restarts from the latest checkpoint (max_failures=1) with a new
# process group and finishes every epoch. Then lists and
# verifies the experiment with the `cairn` CLI. Last, the sharded example
# runs under mpirun, one worker per MPI process, as on a multi-node job.
#
# Usage: scripts/demo-train.sh      (from anywhere in the checkout)
# Environment: JOBS (default 2); BUILD_DIR (default build); CAIRN_DEMO_STORAGE
# to keep the experiment (default: a temporary directory removed at exit).
# Exits non-zero if the build, the training or the verification fails.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/demo-common.sh
demo_build cairn cairn_train_torch_example cairn_train_sharded_example
demo_storage cairn-demo-train

echo
echo "== train: 2 workers data-parallel (DDP over Gloo), 5 epochs, an intentional error at epoch 1, max_failures=1"
"$build/examples/train/cairn_train_torch_example" "$storage" 5

echo
echo "== the experiment"
"$build/src/cli/cairn" ls "$storage/torch_linear"
echo
echo "== verify every checkpoint"
"$build/src/cli/cairn" verify "$storage/torch_linear"

echo
echo "== under mpirun: 2 MPI processes, each one rank saving its own shard"
root_flag=()
if [ "$(id -u)" -eq 0 ]; then root_flag=(--allow-run-as-root); fi
mpirun -np 2 --oversubscribe --bind-to none "${root_flag[@]}" \
  --mca btl_vader_single_copy_mechanism none \
  "$build/examples/train/cairn_train_sharded_example" "$storage" 2 4
"$build/src/cli/cairn" verify "$storage/sharded"
echo
echo "demo-train: OK"
