// Cairn's side of the benchmark, plus the plain memcpy reference.
//
//   cairn_bench --size-mib N --runs N --dir DIR [--out FILE]
//   cairn_bench --size-mib N --workload      (prints the workload as JSON)
//
// Run 0 of each measurement is the first run in this process (fresh memory
// where the operation allocates); later runs are steady state. See
// docs/benchmarks.md for what each figure means.
#include <cstring>
#include <filesystem>
#include <iostream>
#include <stdexcept>

#include "bench_util.h"

namespace cb = cairn::bench;

namespace {

// memcpy of the whole state into destination buffers allocated once: run 0
// also pays the first touch of the destination, later runs reuse it. This is
// the reference for the async-save stall.
cb::Measurement bench_memcpy(const std::vector<cb::TensorSpec>& specs,
                             const std::vector<cb::FloatBuffer>& state, int runs) {
  std::vector<cb::FloatBuffer> dst;
  for (const auto& s : specs) dst.emplace_back(s.numel());
  return cb::measure(
      "memcpy", "memcpy of every tensor into buffers allocated once (1 thread)",
      cb::total_bytes(specs), runs, [](int) {},
      [&](int) {
        for (size_t i = 0; i < specs.size(); ++i) {
          std::memcpy(dst[i].data(), state[i].data(), specs[i].bytes());
        }
      });
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage =
      "usage: cairn_bench --size-mib N [--runs N] [--dir DIR] [--out FILE] [--workload]\n";
  cb::Options opts = cb::parse_options(argc, argv, usage);
  try {
    const auto specs = cb::transformer_workload(opts.size_mib);
    if (opts.workload_only) {
      std::cout << cb::workload_json(specs).dump() << "\n";
      return 0;
    }
    std::filesystem::create_directories(opts.dir);
    const auto state = cb::make_state(specs, 1);
    std::string cache_drop = "none";
    std::vector<cb::Measurement> results;
    results.push_back(bench_memcpy(specs, state, opts.runs));
    cb::write_report(opts, "cairn", specs, cache_drop, results);
  } catch (const std::exception& e) {
    std::cerr << "cairn_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
