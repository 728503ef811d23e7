#!/usr/bin/env bash
# Compiles and links Cairn's CUDA configuration (CAIRN_CUDA=ON) with the
# machine's nvcc and CUDA toolkit, so that a change that breaks the GPU path
# fails CI on a machine without a GPU. Nothing built here runs: the GPU tests
# run through scripts/gpu-check.sh on a machine with one.
#
# What it builds, in build-cuda:
#   - cairn_cuda (include/cairn/cuda.h) and the device tests (cuda_device_test),
#     linked against the toolkit's CUDA runtime;
#   - the Python package's extension with CUDA (cairn._cairn, CAIRN_PYTHON_CUDA).
# Not the LibTorch adapter's CUDA tensors (CAIRN_TORCH_CUDA) and their GPU
# tests: c10/cuda's headers need a header that only a CUDA build of torch
# generates (c10/cuda/impl/cuda_cmake_macros.h), and the project venv's
# torch is the CPU build; scripts/gpu-check.sh builds them against a CUDA
# torch on the GPU machine.
# The compile lines of the code shared with the normal build are the same,
# so ccache serves those objects (scripts/test.sh).
# Usage: scripts/check-cuda-build.sh      Environment: JOBS (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${JOBS:-2}
if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "check-cuda-build: no nvcc (a CUDA toolkit) on this machine" >&2
  exit 1
fi
# shellcheck source=scripts/build-flags.sh
source scripts/build-flags.sh
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B build-cuda -G Ninja "${normal_build_flags[@]}" -DCAIRN_CUDA=ON -DCAIRN_TORCH=OFF \
  -DCAIRN_BUILD_BENCH=OFF -DCAIRN_BUILD_EXAMPLES=OFF "${launcher[@]}" >/dev/null
targets=(cairn_cuda cuda_device_test _cairn)
ninja -C build-cuda -j "$jobs" "${targets[@]}"
# The extension really was built for CUDA, and the test binary links the runtime.
grep -q CAIRN_PYTHON_CUDA=1 build-cuda/compile_commands.json
ldd build-cuda/tests/cuda/cuda_device_test | grep -q libcudart
echo "check-cuda-build: the CUDA configuration compiles and links (${#targets[@]} targets)"
