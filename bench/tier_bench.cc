// Recovery time after a worker failure, by the tier that serves the restore
// (docs/memory-tier.md, docs/benchmarks.md "Recovery from the memory tier").
//
// One Trainer run per round on --storage (a folder or an s3:// URI), with
// --workers ranks each holding a float32 state of --state-mib MiB. Every rank
// saves its state (save_file into a train::TemporaryDirectory) and reports it
// at steps 0 and 1; after step 1 rank 0 evicts the page cache of --dir
// (drop_caches: the whole cache as root, else fadvise of each file; tmpfs
// pages are not cache and stay), notes the time and SIGKILLs itself. The group
// restarts from the latest checkpoint: each rank builds its state afresh
// (a FloatBuffer, 2 MiB aligned and advised to use huge pages as every
// benchmark's buffers, zeroed as a model's initialisation would), loads it
// back (load_into from the checkpoint's storage, checked against the
// manifest's checksum) and notes when its first step after the restore
// begins. With --tier-root the
// run uses the memory tier there (persisting only at the end), so the
// restore reads from memory; without it, from --storage.
//
// Printed, medians over the rounds: recovery_s (the SIGKILL to the last
// rank's first step after the restore), init_s (the slowest rank's fresh
// state, zeroed), load_s (the slowest rank's load alone), and the state's
// size. Times come from the steady clock, which every process on the
// machine shares. bench/tier_run.py runs it for the memory
// tier, the disk and moto's S3 server and prints the ratios.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "cairn/error.h"
#include "cairn/state.h"
#include "cairn/storage.h"
#include "cairn/train.h"

namespace {

namespace fs = std::filesystem;

struct Args {
  std::string storage;
  std::string dir;        // marks and cache eviction
  std::string tier_root;  // "": no memory tier
  uint64_t state_mib = 512;
  int workers = 1;
  int rounds = 3;
  std::string json;
};

Args parse(int argc, char** argv) {
  Args a;
  CLI::App app("Recovery time after a worker failure, by the tier that serves the restore",
               "tier_bench");
  app.add_option("--storage", a.storage, "the experiments' storage (a folder or s3:// URI)")
      ->required();
  app.add_option("--dir", a.dir, "a folder for marks and cache eviction")->required();
  app.add_option("--tier-root", a.tier_root, "use the memory tier there (default: none)");
  app.add_option("--state-mib", a.state_mib, "each rank's state")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--workers", a.workers)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--rounds", a.rounds)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--json", a.json, "write the figures here");
  cairn::bench::parse_or_exit(app, argc, argv);
  return a;
}

void write_mark(const fs::path& p, double value) {
  std::ofstream(p) << fmt::format("{:.9f}", value);
}

double read_mark(const fs::path& p) {
  std::ifstream in(p);
  double v = -1;
  in >> v;
  return v;
}

// Config: numel, marks (folder), evict (folder).
void train_loop(const nlohmann::json& config) {
  const cairn::TrainContext ctx = cairn::train::get_context();
  const fs::path marks = config.at("marks").get<std::string>();
  const double begin = cairn::bench::now_seconds();
  cairn::bench::FloatBuffer buffer(config.at("numel").get<uint64_t>());
  std::span<float> w = buffer.span();
  std::fill(w.begin(), w.end(), 0.0f);
  const double built = cairn::bench::now_seconds();
  cairn::StateDict state;
  state.add_mutable<float>("w", {w.size()}, w);
  int start = 0;
  if (auto ckpt = cairn::train::get_checkpoint()) {
    const std::string key = fmt::format("rank_{}.safetensors", ctx.world_rank);
    cairn::LoadOptions checked;
    for (const auto& f : ckpt->manifest().files) {
      if (f.path == key) checked.expect(f);
    }
    cairn::load_into(ckpt->storage(), key, state, checked);
    const double loaded = cairn::bench::now_seconds();
    start = 2;
    write_mark(marks / fmt::format("init_{}", ctx.world_rank), built - begin);
    write_mark(marks / fmt::format("load_{}", ctx.world_rank), loaded - built);
    write_mark(marks / fmt::format("first_step_{}", ctx.world_rank), loaded);
  } else {
    cairn::bench::fill_random(w, 7 + static_cast<uint64_t>(ctx.world_rank));
  }
  for (int step = start; step < 3; ++step) {
    for (float& x : w) x = x * 0.999f + 1e-4f;
    cairn::train::TemporaryDirectory tmp;
    cairn::save_file(state,
                     fs::path(tmp.path()) / fmt::format("rank_{}.safetensors", ctx.world_rank),
                     {.durable = false});
    cairn::train::report({{"step", step}}, cairn::Checkpoint::from_directory(tmp.path()));
    if (step == 1 && ctx.attempt == 0 && ctx.world_rank == 0) {
      cairn::bench::drop_caches({config.at("evict").get<std::string>()});
      write_mark(marks / "killed", cairn::bench::now_seconds());
      ::kill(::getpid(), SIGKILL);
    }
  }
}

using cairn::bench::median;

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const size_t numel = static_cast<size_t>(a.state_mib << 20) / sizeof(float);
  std::vector<double> recovery, init, load;
  for (int round = 0; round < a.rounds; ++round) {
    const fs::path marks = fs::path(a.dir) / fmt::format("tier-bench-marks-{}", round);
    fs::remove_all(marks);
    fs::create_directories(marks);
    cairn::RunConfig run;
    run.name = fmt::format("tier-bench-{}-{}", ::getpid(), round);
    run.storage_path = a.storage;
    run.failure_config.max_failures = 1;
    run.checkpoint_config.num_to_keep = 1;
    if (!a.tier_root.empty()) {
      run.checkpoint_config.memory_tier.enabled = true;
      run.checkpoint_config.memory_tier.root = a.tier_root;
      run.checkpoint_config.memory_tier.num_to_keep = 1;
      run.checkpoint_config.memory_tier.persist_every_n = 0;
    }
    cairn::Result r =
        cairn::Trainer(train_loop, {{"numel", numel}, {"marks", marks.string()}, {"evict", a.dir}},
                       cairn::ScalingConfig{.num_workers = a.workers}, run)
            .fit();
    if (r.error) {
      std::fprintf(stderr, "tier_bench: round %d failed: %s\n", round, r.error->c_str());
      return 1;
    }
    if (r.restores.size() != 1) {
      std::fprintf(stderr, "tier_bench: round %d restored %zu times, not once\n", round,
                   r.restores.size());
      return 1;
    }
    const double killed = read_mark(marks / "killed");
    double last_first_step = 0, slowest_load = 0, slowest_init = 0;
    for (int rank = 0; rank < a.workers; ++rank) {
      slowest_init = std::max(slowest_init, read_mark(marks / fmt::format("init_{}", rank)));
      last_first_step =
          std::max(last_first_step, read_mark(marks / fmt::format("first_step_{}", rank)));
      slowest_load = std::max(slowest_load, read_mark(marks / fmt::format("load_{}", rank)));
    }
    recovery.push_back(last_first_step - killed);
    init.push_back(slowest_init);
    load.push_back(slowest_load);
    std::printf("round %d: restored from %s (%s tier): recovery %.3f s, init %.3f s, load %.3f s\n",
                round, r.restores[0].checkpoint.c_str(), r.restores[0].tier.c_str(),
                recovery.back(), init.back(), load.back());
    fs::remove_all(marks);
    try {
      cairn::open_storage(r.path)->remove_prefix("");
    } catch (const cairn::Error& e) {
      std::fprintf(stderr, "tier_bench: could not remove %s: %s\n", r.path.c_str(), e.what());
    }
  }
  const nlohmann::json out = {{"storage", a.storage},
                              {"tier", a.tier_root.empty() ? "persistent" : "memory"},
                              {"state_mib_per_rank", a.state_mib},
                              {"workers", a.workers},
                              {"recovery_s", median(recovery)},
                              {"init_s", median(init)},
                              {"load_s", median(load)},
                              {"rounds_init_s", init},
                              {"rounds_recovery_s", recovery},
                              {"rounds_load_s", load}};
  std::printf("%s\n", out.dump().c_str());
  if (!a.json.empty()) std::ofstream(a.json) << out.dump(2);
  return 0;
}
