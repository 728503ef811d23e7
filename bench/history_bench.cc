// The checkpoint manager's history at scale (docs/benchmarks.md, "history"):
// registers N tiny checkpoints with keep-all into a file:// experiment and
// prints the register cost over the first and the last tenth of them and
// their ratio (flat when a register is O(1) whatever the number kept), then
// the time to open the experiment and to run `cairn ls` and `cairn verify`'s
// code paths at that size, warm; with --cold also with the page cache
// dropped before each (`sync; echo 3 > /proc/sys/vm/drop_caches`: root only),
// and with --cli the `cairn ls --json` binary run as a subprocess (cold: its
// own pages warmed first by `cairn --version`, so the figure is the
// experiment's reading, not the program's loading).
//
// Usage: history_bench [--n N] [--dir DIR] [--keep] [--reuse] [--cold]
//                      [--cli PATH]
// N defaults to 10000; --keep leaves the experiment in DIR/exp for
// profiling; --reuse times the experiment already in DIR/exp (kept by an
// earlier --keep) instead of registering a new one.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

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

// Drops the page cache (dentries, inodes and pages) so the next read comes
// from the disk; false when this process may not (not root).
bool drop_caches() {
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  f << "3\n";
  f.flush();
  return static_cast<bool>(f);
}

// Seconds `fn` takes.
double timed(const std::function<void()>& fn) {
  auto t = std::chrono::steady_clock::now();
  fn();
  return seconds_since(t);
}

// Runs a shell command, failing the bench if it fails.
void shell(const std::string& command) {
  if (std::system(command.c_str()) != 0) {
    throw std::runtime_error(fmt::format("`{}` failed", command));
  }
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t n = 10000;
  bool keep = false;
  bool reuse = false;
  bool cold = false;
  std::string cli;
  std::filesystem::path dir = std::filesystem::temp_directory_path() / "cairn-history-bench";
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--n" && i + 1 < argc) {
      n = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--dir" && i + 1 < argc) {
      dir = argv[++i];
    } else if (a == "--keep") {
      keep = true;
    } else if (a == "--reuse") {
      reuse = keep = true;
    } else if (a == "--cold") {
      cold = true;
    } else if (a == "--cli" && i + 1 < argc) {
      cli = argv[++i];
    } else {
      std::cerr << "usage: history_bench [--n N] [--dir DIR] [--keep] [--reuse] [--cold] "
                   "[--cli PATH]\n";
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
    std::vector<double> costs;
    if (!reuse) {
      std::filesystem::remove_all(dir);
      std::filesystem::create_directories(src);
      auto source = cairn::Checkpoint::from_directory(src.string());
      source.storage().put("model.bin", std::string(64, 'w'));
      costs.reserve(n);
      cairn::CheckpointManager manager(exp.string(), cairn::CheckpointConfig{});
      for (uint64_t i = 0; i < n; ++i) {
        auto t = std::chrono::steady_clock::now();
        manager.register_checkpoint({{"loss", 1.0 / static_cast<double>(i + 1)}, {"step", i}},
                                    source);
        costs.push_back(seconds_since(t));
      }
    }

    // open, ls and verify of the experiment; each checks what it saw.
    auto open = [&] { cairn::CheckpointManager reopened(exp.string(), cairn::CheckpointConfig{}); };
    auto ls = [&] {
      auto view = cairn::cli::collect_ls(exp.string());
      if (view.experiments.size() != 1 || view.experiments[0].checkpoints.size() != n) {
        throw std::runtime_error(fmt::format("ls did not see the {} checkpoints", n));
      }
    };
    auto verify = [&] {
      auto view = cairn::cli::collect_verify(exp.string());
      if (view.checkpoints.size() != n || !view.problems.empty()) {
        throw std::runtime_error(fmt::format("verify did not pass the {} checkpoints", n));
      }
    };
    const std::string ls_command = fmt::format("{} ls --json {} > /dev/null", cli, exp.string());
    if (reuse) {
      // Warm means every file in the page cache, as right after registering.
      open();
      ls();
      verify();
    }
    const double open_s = timed(open);
    const double ls_s = timed(ls);
    const double verify_s = timed(verify);
    const double cli_s = cli.empty() ? 0.0 : timed([&] { shell(ls_command); });
    double open_cold = 0, ls_cold = 0, verify_cold = 0, cli_cold = 0;
    bool dropped = false;
    if (cold && (dropped = drop_caches())) {
      open_cold = timed(open);
      drop_caches();
      ls_cold = timed(ls);
      drop_caches();
      verify_cold = timed(verify);
      if (!cli.empty()) {
        drop_caches();
        shell(cli + " --version > /dev/null");  // the program's pages, not the experiment's
        cli_cold = timed([&] { shell(ls_command); });
      }
    }

    fmt::print("checkpoints               {}\n", n);
    if (!costs.empty()) {
      const size_t tenth = n / 10;
      std::vector<double> first(costs.begin(), costs.begin() + static_cast<long>(tenth));
      std::vector<double> last(costs.end() - static_cast<long>(tenth), costs.end());
      fmt::print("register, first tenth     mean {:.3f} ms  median {:.3f} ms\n", mean(first) * 1e3,
                 median(first) * 1e3);
      fmt::print("register, last tenth      mean {:.3f} ms  median {:.3f} ms\n", mean(last) * 1e3,
                 median(last) * 1e3);
      fmt::print("last/first (mean)         {:.2f}\n", mean(last) / mean(first));
      fmt::print("last/first (median)       {:.2f}\n", median(last) / median(first));
    }
    fmt::print("open (warm)               {:.3f} s\n", open_s);
    fmt::print("ls (warm)                 {:.3f} s\n", ls_s);
    fmt::print("verify (warm)             {:.3f} s\n", verify_s);
    if (!cli.empty()) fmt::print("cairn ls --json (warm)    {:.3f} s\n", cli_s);
    if (cold && !dropped) {
      fmt::print("cold: not measured (cannot write /proc/sys/vm/drop_caches; run as root)\n");
    } else if (cold) {
      fmt::print("open (cold)               {:.3f} s\n", open_cold);
      fmt::print("ls (cold)                 {:.3f} s\n", ls_cold);
      fmt::print("verify (cold)             {:.3f} s\n", verify_cold);
      if (!cli.empty()) fmt::print("cairn ls --json (cold)    {:.3f} s\n", cli_cold);
    }
    if (!keep) std::filesystem::remove_all(dir);
  } catch (const std::exception& e) {
    std::cerr << "history_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
