#!/usr/bin/env bash
# Builds Cairn with CUDA on a machine with an NVIDIA GPU, runs the GPU tests
# and the GPU benchmarks (docs/benchmarks.md, "GPU state" and "GPU state from
# Python"). CI never runs it.
#
# The machine needs: an NVIDIA driver and GPU, a CUDA toolkit (nvcc on PATH,
# or CUDAToolkit_ROOT), g++, CMake, Ninja, and a python3 with a CUDA-enabled
# PyTorch (its torch.utils.cmake_prefix_path gives LibTorch's CMake package;
# the benchmarks' baseline uses its torch.distributed.checkpoint), pybind11
# and pytest, and Python's headers. It needs no network and no Debian
# packages: Cairn's other dependencies come as Debian 12 packages fetched
# beforehand by scripts/gpu-deps.sh into $CAIRN_GPU_DEPS (default
# .gpu-deps), unpacked here into the build folder.
#
#   bash scripts/gpu-check.sh                 (tests, then the benchmarks)
#   CAIRN_GPU_BENCH_MIB=512 bash scripts/gpu-check.sh
#   CAIRN_GPU_SKIP_BENCH=1 bash scripts/gpu-check.sh
#   CAIRN_GPU_PARTS=python bash scripts/gpu-check.sh   (the Python package only)
#
# Parts (CAIRN_GPU_PARTS, default "cpp python"): cpp builds the LibTorch
# adapter and runs the C++ GPU tests and bench/gpu_bench; python builds the
# Python package with CUDA and runs python/tests/test_cuda.py and
# bench/python_gpu_bench.py. Both run the device tests (CudaDevice.*).
#
# Environment: CAIRN_GPU_DEPS, CAIRN_GPU_BUILD (default build-gpu),
# CAIRN_GPU_BENCH_MIB (2048), CAIRN_GPU_BENCH_RUNS (3), CAIRN_GPU_BENCH_DIR
# (where the benchmarks write; default $CAIRN_GPU_BUILD/bench-data),
# CAIRN_GPU_RESULTS (a folder for the benchmarks' JSON and tables).
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
parts=" ${CAIRN_GPU_PARTS:-cpp python} "
cpp=0; py=0
[[ $parts == *" cpp "* ]] && cpp=1
[[ $parts == *" python "* ]] && py=1

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
command -v nvcc >/dev/null && nvcc --version | tail -n 2 | head -n 1
g++ --version | head -n 1
cmake --version | head -n 1
nproc
"$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())'
pinned=$(cat "$deps/torch-version" 2>/dev/null || sed -nE 's/^torch==([0-9.]+).*/\1/p' requirements.txt)
have=$("$python" -c 'import torch; print(torch.__version__.split("+")[0])')
if [ "${have%.*}" != "${pinned%.*}" ]; then
  echo "gpu-check: this machine's torch is $have; CI tests $pinned (requirements.txt)." \
    "The figures hold for $have; install a CUDA build of torch $pinned to check what CI checks."
fi

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
cuda_args=()
if command -v nvcc >/dev/null; then
  cuda_args+=("-DCUDAToolkit_ROOT=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")")
fi
prefix_path="$prefix/usr"
targets=(cuda_device_test)
part_args=(-DCAIRN_TORCH=OFF -DCAIRN_PYTHON=OFF)
if [ $cpp = 1 ]; then
  prefix_path+=";$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
  part_args=(-DCAIRN_TORCH=ON -DCAIRN_PYTHON=OFF)
  targets+=(cuda_torch_test cuda_trainer_test gpu_bench)
fi
if [ $py = 1 ]; then
  # The package with CUDA for this python3 (its pybind11's CMake package);
  # the pure-Python torch path, not cairn._cairn_torch (pip's LibTorch).
  part_args=("${part_args[0]}" -DCAIRN_PYTHON=ON -DCAIRN_PYTHON_TORCH=OFF
             "-DPython_EXECUTABLE=$(command -v "$python")"
             "-Dpybind11_DIR=$("$python" -m pybind11 --cmakedir)")
  targets+=(_cairn cairn_python cairn_bench)
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCAIRN_CUDA=ON -DCAIRN_TORCH_DISTRIBUTED=OFF -DCAIRN_S3=OFF -DCAIRN_MPI=OFF \
  -DCAIRN_BUILD_CLI=OFF -DCAIRN_BUILD_EXAMPLES=OFF -DCAIRN_INSTALL=OFF -DCAIRN_WERROR=OFF \
  -DCMAKE_PREFIX_PATH="$prefix_path" "${part_args[@]}" "${cuda_args[@]}"
ninja -C "$build" "${targets[@]}"
# pip's LibTorch exports copies of std::filesystem functions that crash when
# a program calls them (remove_all jumps to address 0), and it comes before
# libstdc++ among the programs' libraries: libstdc++ is loaded first, so
# those calls bind to it (docs/gpu.md). The same holds for the Python
# package in a process that imported torch.
stdcxx=$(ldd "$build/tests/cuda/cuda_device_test" | awk '/libstdc\+\+/ {print $3; exit}')
export LD_PRELOAD=$stdcxx${LD_PRELOAD:+:$LD_PRELOAD}

echo "== GPU tests"
status=0
tests='(^|/)CudaDevice\.'
[ $cpp = 1 ] && tests='(^|/)Cuda(Device|Torch|Trainer)\.'
(cd "$build" && ctest --output-on-failure -R "$tests") || status=$?
if [ $py = 1 ]; then
  PYTHONPATH=$src/$build/python PYTHONDONTWRITEBYTECODE=1 \
    "$python" -m pytest -q -p no:cacheprovider python/tests/test_cuda.py || status=$?
fi

if [ -z "${CAIRN_GPU_SKIP_BENCH:-}" ]; then
  rm -rf "$bench_dir"  # a run that died leaves its checkpoints behind
  mkdir -p "$bench_dir" "$results"
  if [ $cpp = 1 ]; then
    echo "== GPU benchmark ($mib MiB, $runs runs each)"
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
  fi
  if [ $py = 1 ]; then
    echo "== GPU benchmark from Python ($mib MiB, first call + $runs runs each)"
    "$build/bench/cairn_bench" --size-mib "$mib" --workload > "$results/workload.json"
    PYTHONPATH=$src/$build/python PYTHONUNBUFFERED=1 "$python" bench/python_gpu_bench.py \
      --workload "$results/workload.json" --dir "$bench_dir" --runs "$runs" \
      --json "$results/python_gpu.json" | tee "$results/python_gpu.txt" || status=$?
  fi
  rm -rf "$bench_dir"
fi
exit $status
