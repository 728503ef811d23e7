// GPU-resident state (docs/benchmarks.md, "GPU state"): Cairn's save and
// load of the transformer workload living in CUDA memory, next to the
// physical floor measured in the same run. Needs a GPU, CAIRN_CUDA and a
// CUDA LibTorch; scripts/gpu-check.sh runs it beside bench/gpu_baseline.py
// (torch.distributed.checkpoint and torch.save on the same tensors) and
// bench/gpu_report.py prints the ratios.
//
//   gpu_bench --size-mib N --workload        (prints the workload as JSON)
//   gpu_bench --size-mib N --runs R --dir DIR [--out FILE]
//
// Figures, each run R times (medians in the report):
//   d2h_pinned        copy of every tensor into pinned host tensors (the
//                     floor of any snapshot)
//   cairn_async_stall AsyncSaver::save() of the CUDA state (reserved first),
//                     call to return; the write runs on after it
//   cairn_save_gpu    save_file() of the CUDA state, durable (its pinned
//                     staging reserved first: reserve_device_staging)
//   cairn_save_cpu    save_file() of a CPU copy of the same tensors, durable
//   cairn_load_gpu    load_into() the CUDA tensors, page cache dropped first
//   disk_read_direct  O_DIRECT read of the same file into aligned memory on
//                     4 threads in 16 MiB blocks, page cache dropped first
//   fio_read_direct   with --fio PATH: fio's O_DIRECT read of the same file
//                     (libaio, 8 x 1 MiB in flight, as cairn_bench
//                     --disk-rounds), page cache dropped first, scaled to the
//                     state's bytes (fio reads whole MiB)
//
//   gpu_bench ... --fio PATH   (scripts/gpu-check.sh passes a static fio
//                               built by scripts/gpu-deps.sh)
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <thread>

#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include "bench_util.h"
#include "cairn/async_save.h"
#include "cairn/cuda.h"
#include "cairn/state.h"

namespace cb = cairn::bench;
namespace fs = std::filesystem;

namespace {

// Reads `path` with O_DIRECT on `threads` threads in `block`-byte requests.
void read_direct(const fs::path& path, unsigned threads, size_t block) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("O_DIRECT open failed: " + path.string());
  const uint64_t size = fs::file_size(path);
  std::atomic<uint64_t> next{0};
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      void* buf = nullptr;
      if (::posix_memalign(&buf, 4096, block) != 0) std::abort();
      for (;;) {
        const uint64_t off = next.fetch_add(block);
        if (off >= size) break;
        if (::pread(fd, buf, block, static_cast<off_t>(off)) < 0) std::abort();
      }
      std::free(buf);
    });
  }
  for (auto& t : pool) t.join();
  ::close(fd);
}

}  // namespace

int run(int argc, char** argv);

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "gpu_bench: " << e.what() << "\n";
    return 1;
  }
}

int run(int argc, char** argv) {
  const cb::Options opts = cb::parse_options(
      argc, argv,
      "usage: gpu_bench --size-mib N [--runs N] [--dir DIR] [--out FILE] [--workload]\n");
  const auto specs = cb::transformer_workload(opts.size_mib);
  if (opts.workload_only) {
    std::cout << cb::workload_json(specs).dump() << "\n";
    return 0;
  }
  if (!torch::cuda::is_available()) {
    std::cerr << "gpu_bench: no CUDA device\n";
    return 2;
  }
  const uint64_t bytes = cb::total_bytes(specs);
  fs::create_directories(opts.dir);
  torch::NoGradGuard no_grad;

  // The state on the GPU, a pinned host copy (the floor), and a pageable CPU
  // copy (Cairn's CPU save of the same bytes).
  auto gpu = cairn::cuda::device(
      0, [] { return static_cast<void*>(c10::cuda::getCurrentCUDAStream(0).stream()); });
  std::vector<torch::Tensor> on_gpu, pinned, on_cpu;
  cairn::StateDict gpu_state, cpu_state;
  for (size_t i = 0; i < specs.size(); ++i) {
    torch::manual_seed(static_cast<uint64_t>(i));
    torch::Tensor t = torch::rand(specs[i].shape, torch::TensorOptions().device(torch::kCUDA));
    on_gpu.push_back(t);
    pinned.push_back(torch::empty(specs[i].shape, torch::TensorOptions().pinned_memory(true)));
    on_cpu.push_back(t.cpu());
    const cairn::Shape shape(specs[i].shape.begin(), specs[i].shape.end());
    gpu_state.add_device(specs[i].name, cairn::DType::kF32, shape,
                         {static_cast<std::byte*>(t.data_ptr()), specs[i].bytes()}, gpu, nullptr,
                         true);
    cpu_state.add_mutable(specs[i].name, cairn::DType::kF32, shape,
                          {static_cast<std::byte*>(on_cpu.back().data_ptr()), specs[i].bytes()});
  }
  torch::cuda::synchronize();
  const auto sync_gpu = [](int) { torch::cuda::synchronize(); };

  std::vector<cb::Measurement> results;
  results.push_back(cb::measure("d2h_pinned", "device-to-host copy into pinned tensors", bytes,
                                opts.runs, sync_gpu, [&](int) {
                                  for (size_t i = 0; i < on_gpu.size(); ++i) {
                                    pinned[i].copy_(on_gpu[i], /*non_blocking=*/true);
                                  }
                                  torch::cuda::synchronize();
                                }));

  // Async saves: the caller's stall. reserve() allocates and pins first.
  cairn::AsyncSaver saver;
  const double r0 = cb::now_seconds();
  saver.reserve(gpu_state);
  const double reserve_s = cb::now_seconds() - r0;
  std::vector<cairn::SaveHandle> handles;
  results.push_back(cb::measure(
      "cairn_async_stall", "AsyncSaver::save() of the CUDA state, call to return", bytes, opts.runs,
      [&](int i) {
        if (!handles.empty()) handles.back().wait();
        if (i > 0) fs::remove_all(opts.dir / ("async" + std::to_string(i - 1)));
        torch::cuda::synchronize();
      },
      [&](int i) {
        handles.push_back(
            saver.save(gpu_state, cairn::Checkpoint::from_directory(
                                      (opts.dir / ("async" + std::to_string(i))).string())));
      }));
  saver.wait_all();
  fs::remove_all(opts.dir / ("async" + std::to_string(opts.runs - 1)));

  // Sync saves, GPU and CPU interleaved, each new file next to the last one
  // (as a manager keeps the previous checkpoint until the new one commits).
  // The synchronous saves' pinned staging, allocated ahead as a training
  // program would before its loop (the first save pays for it otherwise).
  const double rs0 = cb::now_seconds();
  cairn::reserve_device_staging(gpu_state);
  const double reserve_sync_s = cb::now_seconds() - rs0;
  std::vector<double> gpu_runs, cpu_runs;
  fs::path last;
  for (int i = 0; i < opts.runs; ++i) {
    for (int which = 0; which < 2; ++which) {
      const fs::path p = opts.dir / ("sync" + std::to_string(i * 2 + which) + ".safetensors");
      cb::sync_all();
      const double t0 = cb::now_seconds();
      cairn::save_file(which == 0 ? gpu_state : cpu_state, p);
      (which == 0 ? gpu_runs : cpu_runs).push_back(cb::now_seconds() - t0);
      if (!last.empty()) fs::remove(last);
      last = p;
    }
  }
  results.push_back({"cairn_save_gpu", "save_file() of the CUDA state, durable", bytes, gpu_runs});
  results.push_back({"cairn_save_cpu", "save_file() of a CPU copy, durable", bytes, cpu_runs});

  // Cold loads into the CUDA tensors against the disk's O_DIRECT read.
  std::string cache_drop;
  std::vector<double> load_runs, read_runs, fio_runs;
  cairn::IoReport report;
  const bool with_fio = !opts.fio.empty();
  for (int i = 0; i < opts.runs; ++i) {
    cache_drop = cb::drop_caches({last});
    double t0 = cb::now_seconds();
    read_direct(last, 4, size_t{16} << 20);
    read_runs.push_back(cb::now_seconds() - t0);
    if (with_fio) {
      cache_drop = cb::drop_caches({last});
      const uint64_t whole_mib = bytes >> 20 << 20;
      std::vector<std::string> args = cb::fio_args(last, bytes, true);
      args.push_back("--rw=read");
      const double s = cb::run_fio(opts.fio, args, "read");
      fio_runs.push_back(s * static_cast<double>(bytes) / static_cast<double>(whole_mib));
    }
    cache_drop = cb::drop_caches({last});
    cairn::LoadOptions o;
    o.report = &report;
    t0 = cb::now_seconds();
    cairn::load_into(last, gpu_state, o);
    torch::cuda::synchronize();
    load_runs.push_back(cb::now_seconds() - t0);
  }
  // The loaded tensors are the saved ones.
  for (size_t i = 0; i < on_gpu.size(); ++i) {
    if (!torch::equal(on_gpu[i].cpu(), on_cpu[i])) {
      std::cerr << "gpu_bench: tensor " << specs[i].name << " differs after the load\n";
      return 1;
    }
  }
  fs::remove(last);
  results.push_back({"cairn_load_gpu", "load_into() the CUDA tensors, cold", bytes, load_runs});
  results.push_back({"disk_read_direct", "O_DIRECT read of the file, 4 threads x 16 MiB, cold",
                     bytes, read_runs});
  if (with_fio) {
    results.push_back({"fio_read_direct", "fio O_DIRECT read of the file (libaio, 8 x 1 MiB), cold",
                       bytes, fio_runs});
  }

  const cairn::AsyncSaver::Stats st = saver.stats();
  nlohmann::json extra = {
      {"device", torch::cuda::device_count() > 0 ? "cuda:0" : ""},
      {"reserve_s", reserve_s},
      {"reserve_sync_s", reserve_sync_s},
      {"staging_pinned_bytes", st.staging_pinned_bytes},
      {"staging_allocations", st.staging_allocations},
      {"load_io", report.reason},
  };
  cb::write_report(opts, "gpu_bench", specs, cache_drop, results, extra);
  return 0;
}
