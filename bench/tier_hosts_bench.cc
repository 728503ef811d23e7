// Recovery of a job across two hosts, by the tier that serves the restore
// (docs/memory-tier.md "Across hosts", docs/benchmarks.md). Started by
// mpirun, one process per host, by bench/tier_hosts_run.py, in two phases:
//
//   --phase save     a Trainer run whose ranks each fill a float32 state of
//                    --state-mib MiB, save it and report it once; then rank
//                    0 writes MARKS/saved and every rank waits to be killed
//                    (the script SIGKILLs the job, drops what the mode
//                    loses, and starts the restore).
//   --phase restore  Trainer::restore of the experiment: each rank builds a
//                    fresh state (2 MiB aligned, zeroed), loads its file
//                    back checked against the manifest's checksum, and
//                    notes when its first step begins (MARKS/first_step_<r>,
//                    with init_<r> and load_<r>); then the run ends.
//
// With --tier-root the run keeps the memory tier there (each host's own
// memory, mounted there by the script), persisting only at the end; with
// --own-files too, MemoryTierConfig::ranks_read_own_files (each rank reads
// only its own file, as it does here anyway).
// Every process writes MARKS/pid-<MPI rank>; process 0 writes
// MARKS/result.json (the Result's restores). Times are on the steady clock,
// which every process on the machine shares.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "cairn/error.h"
#include "cairn/state.h"
#include "cairn/train.h"

namespace {

namespace fs = std::filesystem;

void write_mark(const fs::path& p, double value) {
  std::ofstream(p) << fmt::format("{:.9f}", value);
}

// Config: numel, marks (folder).
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
  const std::string key = fmt::format("rank_{}.safetensors", ctx.world_rank);
  if (auto ckpt = cairn::train::get_checkpoint()) {
    cairn::LoadOptions checked;
    for (const auto& f : ckpt->manifest().files) {
      if (f.path == key) checked.expect(f);
    }
    cairn::load_into(ckpt->storage(), key, state, checked);
    const double loaded = cairn::bench::now_seconds();
    write_mark(marks / fmt::format("init_{}", ctx.world_rank), built - begin);
    write_mark(marks / fmt::format("load_{}", ctx.world_rank), loaded - built);
    write_mark(marks / fmt::format("first_step_{}", ctx.world_rank), loaded);
    return;
  }
  cairn::bench::fill_random(w, 7 + static_cast<uint64_t>(ctx.world_rank));
  cairn::train::TemporaryDirectory tmp;
  cairn::save_file(state, fs::path(tmp.path()) / key, {.durable = false});
  cairn::train::report({{"step", 0}}, cairn::Checkpoint::from_directory(tmp.path()));
  if (ctx.world_rank == 0) write_mark(marks / "saved", cairn::bench::now_seconds());
  std::this_thread::sleep_for(std::chrono::minutes(10));  // until the job is killed
}

}  // namespace

int main(int argc, char** argv) {
  std::string phase, storage, marks, tier_root;
  bool own_files = false;
  uint64_t state_mib = 1024;
  CLI::App app("Recovery of a job across two hosts, by the tier that serves the restore",
               "tier_hosts_bench");
  app.add_option("--phase", phase)->required()->check(CLI::IsMember({"save", "restore"}));
  app.add_option("--storage", storage, "the experiment's storage (a folder or s3:// URI)")
      ->required();
  app.add_option("--marks", marks, "a folder every process sees, for the marks")->required();
  app.add_option("--tier-root", tier_root, "use the memory tier there (default: none)");
  app.add_flag("--own-files", own_files,
               "MemoryTierConfig::ranks_read_own_files (each rank reads its own file only)");
  app.add_option("--state-mib", state_mib, "each rank's state")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cairn::bench::parse_or_exit(app, argc, argv);
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const std::string me = rank ? rank : "0";
  std::ofstream(fs::path(marks) / fmt::format("pid-{}", me)) << ::getpid();

  const nlohmann::json config = {{"numel", (state_mib << 20) / sizeof(float)}, {"marks", marks}};
  try {
    cairn::Result r = [&] {
      if (phase == "restore") {
        return cairn::Trainer::restore(storage + "/tier-hosts-bench", train_loop, config).fit();
      }
      cairn::RunConfig run;
      run.name = "tier-hosts-bench";
      run.storage_path = storage;
      run.checkpoint_config.num_to_keep = 1;
      if (!tier_root.empty()) {
        run.checkpoint_config.memory_tier.enabled = true;
        run.checkpoint_config.memory_tier.root = tier_root;
        run.checkpoint_config.memory_tier.num_to_keep = 1;
        run.checkpoint_config.memory_tier.persist_every_n = 0;
        run.checkpoint_config.memory_tier.ranks_read_own_files = own_files;
      }
      return cairn::Trainer(train_loop, config, cairn::ScalingConfig{.num_workers = 0}, run).fit();
    }();
    if (me == "0") {
      nlohmann::json restores = nlohmann::json::array();
      for (const auto& x : r.restores) {
        restores.push_back(
            {{"checkpoint", x.checkpoint}, {"tier", x.tier}, {"rank_tiers", x.rank_tiers}});
      }
      std::ofstream(fs::path(marks) / "result.json") << nlohmann::json{
          {"restores", restores},
          {"error", r.error ? nlohmann::json(*r.error)
                            : nlohmann::json()}}.dump();
    }
    return r.error ? 1 : 0;
  } catch (const cairn::Error& e) {
    std::fprintf(stderr, "tier_hosts_bench: %s\n", e.what());
    return 1;
  }
}
