#!/usr/bin/env bash
# Builds Cairn with CUDA on a machine with an NVIDIA GPU, runs the GPU tests
# and the GPU benchmark (docs/benchmarks.md, "GPU state"). CI never runs it.
#
# The machine needs: an NVIDIA driver and GPU, a CUDA toolkit (nvcc on PATH,
# or CUDAToolkit_ROOT), g++, CMake, Ninja, and a python3 with a CUDA-enabled
# PyTorch (its torch.utils.cmake_prefix_path gives LibTorch's CMake package;
# the benchmark's baseline uses its torch.distributed.checkpoint). It needs no
# network and no Debian packages: Cairn's other dependencies come as Debian
# 12 packages fetched beforehand by scripts/gpu-deps.sh into $CAIRN_GPU_DEPS
# (default .gpu-deps), unpacked here into the build folder.
#
#   bash scripts/gpu-check.sh                 (tests, then the benchmark)
#   CAIRN_GPU_BENCH_MIB=512 bash scripts/gpu-check.sh
#   CAIRN_GPU_SKIP_BENCH=1 bash scripts/gpu-check.sh
#
# Environment: CAIRN_GPU_DEPS, CAIRN_GPU_BUILD (default build-gpu),
# CAIRN_GPU_BENCH_MIB (2048), CAIRN_GPU_BENCH_RUNS (3), CAIRN_GPU_BENCH_DIR
# (where the benchmark writes; default $CAIRN_GPU_BUILD/bench-data),
# CAIRN_GPU_RESULTS (a folder for the benchmark's JSON and table).
# Exit status: the tests' (a benchmark verdict below its goal is reported,
# not an error).
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
deps=${CAIRN_GPU_DEPS:-.gpu-deps}
build=${CAIRN_GPU_BUILD:-build-gpu}
mib=${CAIRN_GPU_BENCH_MIB:-2048}
runs=${CAIRN_GPU_BENCH_RUNS:-3}
bench_dir=${CAIRN_GPU_BENCH_DIR:-$build/bench-data}
results=${CAIRN_GPU_RESULTS:-$build/results}
python=${PYTHON:-python3}

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
command -v nvcc >/dev/null && nvcc --version | tail -n 2 | head -n 1
g++ --version | head -n 1
cmake --version | head -n 1
nproc
"$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())'

echo "== dependencies from $deps"
prefix=$src/$build/deps
if ! ls "$deps"/*.deb >/dev/null 2>&1; then
  echo "gpu-check: no Debian packages in $deps; run scripts/gpu-deps.sh on a Debian machine" >&2
  exit 2
fi
mkdir -p "$prefix"
for f in "$deps"/*.deb; do dpkg-deb -x "$f" "$prefix"; done
libdir=$prefix/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

echo "== configure and build"
torch_prefix=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
cuda_args=()
if command -v nvcc >/dev/null; then
  cuda_args+=("-DCUDAToolkit_ROOT=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")")
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCAIRN_CUDA=ON -DCAIRN_TORCH=ON -DCAIRN_TORCH_DISTRIBUTED=OFF -DCAIRN_S3=OFF -DCAIRN_MPI=OFF \
  -DCAIRN_BUILD_CLI=OFF -DCAIRN_BUILD_EXAMPLES=OFF -DCAIRN_INSTALL=OFF -DCAIRN_WERROR=OFF \
  -DCMAKE_PREFIX_PATH="$prefix/usr;$torch_prefix" "${cuda_args[@]}"
ninja -C "$build" cuda_device_test cuda_torch_test cuda_trainer_test gpu_bench
# pip's LibTorch exports copies of std::filesystem functions that crash when
# a program calls them (remove_all jumps to address 0), and it comes before
# libstdc++ among the programs' libraries: libstdc++ is loaded first, so
# those calls bind to it (docs/gpu.md).
stdcxx=$(ldd "$build/tests/cuda/cuda_torch_test" | awk '/libstdc\+\+/ {print $3; exit}')
export LD_PRELOAD=$stdcxx${LD_PRELOAD:+:$LD_PRELOAD}

echo "== GPU tests"
status=0
(cd "$build" && ctest --output-on-failure -R '(^|/)Cuda(Device|Torch|Trainer)\.') || status=$?

if [ -z "${CAIRN_GPU_SKIP_BENCH:-}" ]; then
  echo "== GPU benchmark ($mib MiB, $runs runs each)"
  rm -rf "$bench_dir"  # a run that died leaves its checkpoints behind
  mkdir -p "$bench_dir" "$results"
  "$build/bench/gpu_bench" --size-mib "$mib" --workload > "$results/workload.json"
  fio_args=()
  # The static fio of scripts/gpu-deps.sh: the disk's O_DIRECT read, measured
  # between Cairn's loads.
  if [ -x "$deps/fio" ]; then fio_args=(--fio "$(readlink -f "$deps/fio")"); fi
  "$build/bench/gpu_bench" --size-mib "$mib" --runs "$runs" --dir "$bench_dir" \
    --out "$results/cairn.json" "${fio_args[@]}"
  PYTHONUNBUFFERED=1 "$python" bench/gpu_baseline.py --workload "$results/workload.json" \
    --dir "$bench_dir" --runs "$runs" > "$results/baseline.json"
  "$python" bench/gpu_report.py "$results/cairn.json" "$results/baseline.json" --markdown \
    | tee "$results/report.md"
  rm -rf "$bench_dir"
fi
exit $status
