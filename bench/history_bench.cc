// The checkpoint manager's history at scale (docs/benchmarks.md, "history"):
// registers N tiny checkpoints with keep-all into a file:// experiment and
// prints the register cost over the first and the last tenth of them and
// their ratio (flat when a register is O(1) whatever the number kept), then
// the time to open the experiment and to run `cairn ls` and `cairn verify`'s
// code paths at that size.
//
// Usage: history_bench [--n N] [--dir DIR] [--keep]   (N defaults to 10000;
// --keep leaves the experiment in DIR/exp for profiling)
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "cairn/checkpoint.h"
#include "cairn/manager.h"
#include "cli/commands.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t n = 10000;
  bool keep = false;
  std::filesystem::path dir = std::filesystem::temp_directory_path() / "cairn-history-bench";
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--n" && i + 1 < argc) {
      n = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--dir" && i + 1 < argc) {
      dir = argv[++i];
    } else if (a == "--keep") {
      keep = true;
    } else {
      std::cerr << "usage: history_bench [--n N] [--dir DIR] [--keep]\n";
      return 2;
    }
  }
  if (n < 10) {
    std::cerr << "history_bench: --n must be at least 10\n";
    return 2;
  }
  try {
    const std::filesystem::path exp = dir / "exp";
    const std::filesystem::path src = dir / "source";
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(src);
    auto source = cairn::Checkpoint::from_directory(src.string());
    source.storage().put("model.bin", std::string(64, 'w'));

    std::vector<double> costs;
    costs.reserve(n);
    {
      cairn::CheckpointManager manager(exp.string(), cairn::CheckpointConfig{});
      for (uint64_t i = 0; i < n; ++i) {
        auto t = std::chrono::steady_clock::now();
        manager.register_checkpoint({{"loss", 1.0 / static_cast<double>(i + 1)}, {"step", i}},
                                    source);
        costs.push_back(seconds_since(t));
      }
    }
    const size_t tenth = n / 10;
    std::vector<double> first(costs.begin(), costs.begin() + static_cast<long>(tenth));
    std::vector<double> last(costs.end() - static_cast<long>(tenth), costs.end());

    auto t = std::chrono::steady_clock::now();
    { cairn::CheckpointManager reopened(exp.string(), cairn::CheckpointConfig{}); }
    const double open_s = seconds_since(t);
    t = std::chrono::steady_clock::now();
    auto ls = cairn::cli::collect_ls(exp.string());
    const double ls_s = seconds_since(t);
    t = std::chrono::steady_clock::now();
    auto verify = cairn::cli::collect_verify(exp.string());
    const double verify_s = seconds_since(t);
    if (ls.experiments.size() != 1 || ls.experiments[0].checkpoints.size() != n ||
        verify.checkpoints.size() != n || !verify.problems.empty()) {
      std::cerr << "history_bench: ls or verify did not see the " << n << " checkpoints\n";
      return 1;
    }

    fmt::print("checkpoints               {}\n", n);
    fmt::print("register, first tenth     mean {:.3f} ms  median {:.3f} ms\n", mean(first) * 1e3,
               median(first) * 1e3);
    fmt::print("register, last tenth      mean {:.3f} ms  median {:.3f} ms\n", mean(last) * 1e3,
               median(last) * 1e3);
    fmt::print("last/first (mean)         {:.2f}\n", mean(last) / mean(first));
    fmt::print("last/first (median)       {:.2f}\n", median(last) / median(first));
    fmt::print("open (warm)               {:.3f} s\n", open_s);
    fmt::print("ls (warm)                 {:.3f} s\n", ls_s);
    fmt::print("verify (warm)             {:.3f} s\n", verify_s);
    if (!keep) std::filesystem::remove_all(dir);
  } catch (const std::exception& e) {
    std::cerr << "history_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
