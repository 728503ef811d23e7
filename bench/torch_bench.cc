// LibTorch baseline: torch::serialize::OutputArchive / InputArchive (what
// torch::save and torch::load use) on the bench workload, by tensor name.
//
//   torch_bench --size-mib N --runs N --dir DIR [--out FILE]
//
// libtorch.save: build the archive, save_to(file), then fsync the file (LibTorch
//   has no durable save; the fsync is part of the timed step, as for every
//   system in the benchmark).
// libtorch.load: cold cache, InputArchive::load_from(file) and read every
//   tensor; LibTorch allocates the tensors it returns (there is no load into
//   caller buffers).
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <iostream>
#include <stdexcept>

#include <torch/serialize.h>
#include <torch/torch.h>

#include "bench_util.h"

namespace cb = cairn::bench;

namespace {

void fsync_path(const std::filesystem::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) throw std::runtime_error("fsync " + p.string());
  ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage = "usage: torch_bench --size-mib N --runs N --dir DIR [--out FILE]\n";
  cb::Options opts = cb::parse_options(argc, argv, usage);
  try {
    torch::set_num_threads(1);
    const auto specs = cb::transformer_workload(opts.size_mib);
    const uint64_t bytes = cb::total_bytes(specs);
    auto state = cb::make_state(specs, 1);
    std::vector<torch::Tensor> tensors;
    for (size_t i = 0; i < specs.size(); ++i) {
      tensors.push_back(torch::from_blob(state[i].data(), specs[i].shape, torch::kFloat32));
    }
    std::filesystem::create_directories(opts.dir);
    const auto path = opts.dir / "libtorch.pt";
    std::string cache_drop = "none";
    std::vector<cb::Measurement> results;

    results.push_back(cb::measure(
        "libtorch.save", "torch::serialize::OutputArchive::save_to + fsync", bytes, opts.runs,
        [&](int) {
          std::filesystem::remove(path);
          cb::sync_all();
        },
        [&](int) {
          torch::serialize::OutputArchive archive;
          for (size_t i = 0; i < specs.size(); ++i) archive.write(specs[i].name, tensors[i]);
          archive.save_to(path.string());
          fsync_path(path);
        }));

    std::vector<torch::Tensor> last;  // the last run's tensors, verified after timing
    results.push_back(cb::measure(
        "libtorch.load", "torch::serialize::InputArchive::load_from + read, cold cache", bytes,
        opts.runs, [&](int) { cache_drop = cb::drop_caches({path}); },
        [&](int run) {
          torch::serialize::InputArchive archive;
          archive.load_from(path.string());
          std::vector<torch::Tensor> loaded(specs.size());
          for (size_t i = 0; i < specs.size(); ++i) archive.read(specs[i].name, loaded[i]);
          if (run == opts.runs - 1) last = std::move(loaded);
        }));
    for (size_t i = 0; i < specs.size(); ++i) {
      if (!last[i].is_contiguous() ||
          last[i].numel() * 4 != static_cast<int64_t>(specs[i].bytes()) ||
          std::memcmp(last[i].data_ptr(), state[i].data(), specs[i].bytes()) != 0) {
        throw std::runtime_error("libtorch.load returned different bytes for " + specs[i].name);
      }
    }
    std::filesystem::remove(path);
    cb::write_report(opts, "libtorch " TORCH_VERSION, specs, cache_drop, results);
  } catch (const std::exception& e) {
    std::cerr << "torch_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
