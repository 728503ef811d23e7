// A training program for the launchers' tests, started by mpirun
// (tests/train/mpi_test.cc) or with torchrun's variables
// (tests/train/env_launch_test.cc). Every process calls Trainer::fit() and
// writes what it returned or threw to OUT/process-<MPI rank or RANK>.json; every
// worker writes its context to OUT/ctx-<rank>-<attempt>.json.
//
//   train_mpi_program SCENARIO STORAGE_PATH OUT_DIR
//
// Scenarios: basic (3 epochs, every rank saves a shard each epoch), restart
// (rank 1 throws at epoch 1 once; max_failures=1), killed (rank 1 SIGKILLs
// itself at epoch 1; max_failures=0), hang (rank 1 stops reporting at epoch
// 1; report_timeout_s=2), mismatch (num_workers=3), slow (8 epochs of 300 ms,
// for a test that kills the driver; every process writes OUT/pid-<MPI rank>),
// restore (Trainer::restore of the experiment, then fit), async (basic with
// asynchronous reports, two in flight) and preempt (up to 400 epochs of 50
// ms, checkpointing only when train::should_checkpoint() says so, then
// returning: for a test that sends SIGTERM to an MPI process), elastic and
// elastic_rejoin (an elastic group of 2 to 4 ranks losing one: elastic_fn),
// elastic_no_retries (the same with max_failures = 0).
// The hosts_tier scenarios run 8 epochs with the memory tier at OUT/tiers
// (each host's own, mounted there by the test), every 2nd checkpoint
// persisted: hosts_tier_restart (rank 1 throws at epoch 1 once;
// max_failures=1), hosts_tier_crash (at epoch 5 of its first run, rank 1's
// worker waits (up to 60 s) until checkpoint 3's persistent copy is
// committed, writes OUT/crashed and waits for the test to SIGKILL the job;
// hosts_tier_crash_r2 the same with MemoryTierConfig::replicas = 2,
// hosts_tier_crash_own with ranks_read_own_files and epoch.txt written by
// every rank),
// hosts_tier_restore
// (Trainer::restore of the experiment, then fit), hosts_tier_soak (epochs
// of 5 ms with shards of 1 MiB, every 2nd checkpoint persisted, restoring
// the experiment when it exists, until killed: for a test that SIGKILLs the
// job at random moments) and hosts_tier_soak_end (the same, restored, for
// 20 epochs more), and hosts_tier_small (8 epochs with shards of 1 MiB,
// falling back to persistent storage when a host's memory cannot hold the
// next checkpoint).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cairn/error.h"
#include "cairn/sharded.h"
#include "cairn/state.h"
#include "cairn/train.h"
#include "support/files.h"

namespace fs = std::filesystem;

namespace {

using cairn::testing::read_file;
using cairn::testing::write_file_atomically;

// Rank `rank`'s shard at `epoch`: its text, repeated to `bytes` when given.
std::string shard(int rank, int epoch, size_t bytes) {
  const std::string text = fmt::format("rank {} epoch {}", rank, epoch);
  if (bytes == 0) return text;
  std::string out;
  out.reserve(bytes);
  while (out.size() < bytes) out += text;
  out.resize(bytes);
  return out;
}

void train_fn(const nlohmann::json& config) {
  const cairn::TrainContext& ctx = cairn::train::get_context();
  const fs::path out = config.at("out").get<std::string>();
  const std::string scenario = config.at("scenario").get<std::string>();
  const int rank = ctx.world_rank;
  int start = 0;
  nlohmann::json seen = {{"world_rank", rank},
                         {"world_size", ctx.world_size},
                         {"local_rank", ctx.local_rank},
                         {"local_world_size", ctx.local_world_size},
                         {"node_rank", ctx.node_rank},
                         {"experiment_name", ctx.experiment_name},
                         {"experiment_path", ctx.experiment_path},
                         {"attempt", ctx.attempt},
                         {"pid", ::getpid()},
                         {"resumed_from_epoch", nullptr}};
  if (auto ckpt = cairn::train::get_checkpoint()) {
    auto dir = ckpt->as_directory();
    const int epoch = std::stoi(read_file(dir.path() / "epoch.txt"));
    if (read_file(dir.path() / fmt::format("shard-{}.bin", rank)) !=
        shard(rank, epoch, config.value("shard_bytes", size_t{0}))) {
      throw std::runtime_error(fmt::format("rank {}: my shard of epoch {} is wrong", rank, epoch));
    }
    seen["resumed_from_epoch"] = epoch;
    start = epoch + 1;
  }
  write_file_atomically(out / fmt::format("ctx-{}-{}.json", rank, ctx.attempt), seen.dump());
  const int epochs = config.contains("more_epochs") ? start + config["more_epochs"].get<int>()
                                                    : config.value("epochs", 3);
  for (int epoch = start; epoch < epochs; ++epoch) {
    std::this_thread::sleep_for(std::chrono::milliseconds(config.value("sleep_ms", 0)));
    if (rank == 1 && epoch == 1 && ctx.attempt == 0) {
      if (scenario == "restart" || scenario == "tier_restart" || scenario == "hosts_tier_restart") {
        throw std::runtime_error("intentional error at epoch 1");
      }
      if (scenario == "killed") {
        std::fprintf(stderr, "rank 1 is about to die\n");
        std::fflush(stderr);
        ::raise(SIGKILL);
      }
      if (scenario == "hang") std::this_thread::sleep_for(std::chrono::seconds(60));
    }
    if (scenario.starts_with("hosts_tier_crash") && rank == 1 && epoch == 5 &&
        !fs::exists(out / "crashed")) {
      // The persisting of checkpoint 3 (every 2nd) runs in the background:
      // the crash comes once it is committed, so that what persistent
      // storage holds after it does not depend on the machine's load.
      const fs::path persisted =
          fs::path(ctx.experiment_path) / "checkpoint_000003" / ".cairn" / "manifest.json";
      for (int i = 0; i < 1200 && !fs::exists(persisted); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      write_file_atomically(out / "crashed", "");
      std::this_thread::sleep_for(std::chrono::seconds(120));  // until the test kills the job
    }
    if (scenario == "preempt" && !cairn::train::should_checkpoint()) {
      cairn::train::report({{"epoch", epoch}, {"loss", 1.0 / (epoch + 1)}});
      continue;
    }
    cairn::train::TemporaryDirectory tmp;
    write_file_atomically(fs::path(tmp.path()) / fmt::format("shard-{}.bin", rank),
                          shard(rank, epoch, config.value("shard_bytes", size_t{0})));
    if (rank == 0 || config.value("every_rank_writes_epoch", false)) {
      write_file_atomically(fs::path(tmp.path()) / "epoch.txt", std::to_string(epoch));
    }
    cairn::train::report({{"epoch", epoch}, {"loss", 1.0 / (epoch + 1)}},
                         cairn::Checkpoint::from_directory(tmp.path()),
                         {.async = scenario == "async", .max_in_flight = 2});
    if (scenario == "preempt") return;  // the emergency checkpoint is in
  }
}

// The elastic scenarios: one global tensor "w" of kElasticSize int64
// elements, split evenly over the ranks of each attempt; epoch e adds
// (i + 1) * (e + 1) to element i, so the state after any epoch is the same
// whatever the world sizes that computed it. Each rank saves its shard with
// save_rank_shards and reads its share of the restored checkpoint with
// ShardedReader (re-sharded when the world size changed).
//   elastic: rank 3 of attempt 0 writes OUT/kill-me at epoch 3 and waits to
//     be killed (the test SIGKILLs its process): the group goes on with 3.
//   elastic_rejoin: as elastic; then rank 1 of attempt 1 waits at epoch 6 for
//     OUT/rejoined (the test starts rank 3 again) and throws, so the next
//     attempt runs with the rank that came back.
//   elastic_restore: Trainer::restore of the experiment, then fit.
// The last attempt's ranks write OUT/final-<rank>.json: offset and values.
constexpr uint64_t kElasticSize = 24;

void wait_for_file(const fs::path& p) {
  for (int i = 0; i < 1200 && !fs::exists(p); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void elastic_fn(const nlohmann::json& config) {
  const cairn::TrainContext& ctx = cairn::train::get_context();
  const fs::path out = config.at("out").get<std::string>();
  const std::string scenario = config.at("scenario").get<std::string>();
  const int rank = ctx.world_rank;
  const cairn::Box box = cairn::even_split({kElasticSize}, 0, rank, ctx.world_size);
  std::vector<int64_t> w(box.shape[0], 0);
  int start = 0;
  nlohmann::json seen = {{"world_rank", rank},
                         {"world_size", ctx.world_size},
                         {"node_rank", ctx.node_rank},
                         {"attempt", ctx.attempt},
                         {"resumed_from_epoch", nullptr}};
  if (auto ckpt = cairn::train::get_checkpoint()) {
    cairn::ShardedReader reader(*ckpt);
    seen["saved_by"] = reader.world_size();
    reader.read("w", box, std::as_writable_bytes(std::span<int64_t>(w)));
    start = std::stoi(read_file(ckpt->as_directory().path() / "epoch.txt")) + 1;
    seen["resumed_from_epoch"] = start - 1;
  }
  write_file_atomically(out / fmt::format("ctx-{}-{}.json", rank, ctx.attempt), seen.dump());
  for (int epoch = start; epoch < 10; ++epoch) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (size_t i = 0; i < w.size(); ++i) {
      w[i] += static_cast<int64_t>((box.offsets[0] + i + 1) * static_cast<uint64_t>(epoch + 1));
    }
    if (ctx.attempt == 0 && rank == 3 && epoch == 3) {
      write_file_atomically(out / "kill-me", "");
      std::this_thread::sleep_for(std::chrono::seconds(120));  // killed meanwhile
    }
    if (scenario == "elastic_rejoin" && ctx.attempt == 1 && rank == 1 && epoch == 6) {
      wait_for_file(out / "rejoined");
      throw std::runtime_error("intentional error once rank 3 is back");
    }
    cairn::train::TemporaryDirectory tmp;
    cairn::StateDict state;
    state.add<int64_t>("w", {box.shape[0]}, std::span<const int64_t>(w));
    cairn::save_rank_shards(state, {{"w", {{kElasticSize}, box.offsets}}},
                            cairn::Checkpoint::from_directory(tmp.path()), rank);
    if (rank == 0) write_file_atomically(fs::path(tmp.path()) / "epoch.txt", std::to_string(epoch));
    cairn::train::report({{"epoch", epoch}, {"loss", 1.0 / (epoch + 1)}},
                         cairn::Checkpoint::from_directory(tmp.path()));
  }
  write_file_atomically(
      out / fmt::format("final-{}.json", rank),
      nlohmann::json{{"world_size", ctx.world_size}, {"offset", box.offsets[0]}, {"w", w}}.dump());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s SCENARIO STORAGE_PATH OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string scenario = argv[1];
  const fs::path out = argv[3];
  // Started by mpirun, or by a torchrun-style launcher (env_launch_test.cc).
  const char* mpi_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (mpi_rank == nullptr) mpi_rank = std::getenv("RANK");
  if (mpi_rank == nullptr) mpi_rank = std::getenv("SLURM_PROCID");
  const fs::path report = out / fmt::format("process-{}.json", mpi_rank ? mpi_rank : "none");
  write_file_atomically(out / fmt::format("pid-{}", mpi_rank ? mpi_rank : "none"),
                        std::to_string(::getpid()));
  nlohmann::json config = {{"out", out.string()}, {"scenario", scenario}};
  if (scenario == "slow" || scenario == "restore") {
    config["epochs"] = 8;
    config["sleep_ms"] = 300;
  }
  if (scenario == "preempt") {
    config["epochs"] = 400;
    config["sleep_ms"] = 50;
  }
  const bool hosts_tier = scenario.starts_with("hosts_tier");
  if (hosts_tier) config["epochs"] = 8;
  if (scenario.starts_with("hosts_tier_soak")) {
    config["epochs"] = 1'000'000;
    config["sleep_ms"] = 5;
    config["shard_bytes"] = 1 << 20;
    if (scenario == "hosts_tier_soak_end") config["more_epochs"] = 20;
  }
  if (scenario == "hosts_tier_small") config["shard_bytes"] = 1 << 20;

  cairn::RunConfig run;
  run.name = "mpi_exp";
  run.storage_path = argv[2];
  run.checkpoint_config.num_to_keep = 2;
  run.checkpoint_config.checkpoint_score_attribute = "loss";
  run.checkpoint_config.checkpoint_score_order = "min";
  run.failure_config.max_failures =
      scenario == "restart" || scenario == "tier_restart" || scenario == "hosts_tier_restart" ? 1
                                                                                              : 0;
  if (scenario == "tier" || scenario == "tier_restart" || hosts_tier) {  // under OUT/tiers
    run.checkpoint_config.memory_tier.enabled = true;
    run.checkpoint_config.memory_tier.root = (out / "tiers").string();
    if (hosts_tier) run.checkpoint_config.memory_tier.persist_every_n = 2;
    if (scenario == "hosts_tier_crash_r2") run.checkpoint_config.memory_tier.replicas = 2;
    if (scenario == "hosts_tier_crash_own") {
      // Each rank reads only its own files (epoch.txt is every rank's).
      run.checkpoint_config.memory_tier.ranks_read_own_files = true;
      config["every_rank_writes_epoch"] = true;
    }
    if (scenario == "hosts_tier_small") {
      run.checkpoint_config.memory_tier.on_insufficient_memory = "persistent_only";
    }
    fs::create_directories(run.checkpoint_config.memory_tier.root);
  }
  if (scenario == "hang") run.failure_config.report_timeout_s = 2;
  cairn::ScalingConfig scaling{.num_workers = scenario == "mismatch" ? 3 : 0};
  const bool elastic = scenario.starts_with("elastic");
  if (elastic) {
    scaling = {.num_workers = 4, .min_workers = 2};
    // A lost rank counts against max_failures: with none allowed, the run
    // ends at the loss (elastic_no_retries).
    run.failure_config.max_failures = scenario == "elastic_no_retries" ? 0 : 3;
  }

  nlohmann::json what;
  try {
    const std::string exp = (fs::path(run.storage_path) / run.name).string();
    cairn::Trainer trainer =
        scenario == "restore" || scenario == "hosts_tier_restore" ||
                (scenario.starts_with("hosts_tier_soak") &&
                 fs::exists(fs::path(exp) / "trainer_state.json"))
            ? cairn::Trainer::restore(exp, train_fn, config)
        : scenario == "elastic_restore"
            ? cairn::Trainer::restore(exp, elastic_fn, config)
            : cairn::Trainer(elastic ? elastic_fn : train_fn, config, scaling, run);
    cairn::Result r = trainer.fit();
    nlohmann::json best = nlohmann::json::array();
    for (const auto& b : r.best_checkpoints) best.push_back(b.checkpoint.uri());
    nlohmann::json restores = nlohmann::json::array();
    for (const auto& x : r.restores) {
      restores.push_back({{"attempt", x.attempt},
                          {"checkpoint", x.checkpoint},
                          {"tier", x.tier},
                          {"world_size", x.world_size},
                          {"rank_tiers", x.rank_tiers}});
    }
    what = {{"metrics", r.metrics},
            {"checkpoint", r.checkpoint ? nlohmann::json(r.checkpoint->uri()) : nlohmann::json()},
            {"best", best},
            {"path", r.path},
            {"preempted", r.preempted},
            {"history", r.metrics_history},
            {"restores", restores},
            {"error", r.error ? nlohmann::json(*r.error) : nlohmann::json()}};
  } catch (const cairn::Error& e) {
    what = {{"threw", e.what()}, {"code", std::string(cairn::error_code_name(e.code()))}};
  }
  write_file_atomically(report, what.dump(2));
  return 0;
}
