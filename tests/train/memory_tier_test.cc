// The Trainer with the memory tier (CheckpointConfig::memory_tier): a
// restart after a worker or the driver is killed resumes from the copy in
// memory, the run ends equal to one that never failed, and the newest state
// is persisted and the memory freed at the end.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cairn/train.h"
#include "support/temp_dir.h"
#include "train/train_support.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;
using testing::expect_all_verify;
using testing::slurp;
using testing::TempDir;
using testing::write_file;

// A state that depends on every epoch before it: any epoch lost or repeated
// from a wrong checkpoint changes the final text.
std::string next_state(const std::string& state, int epoch, int rank) {
  return fmt::format("{:016x}",
                     std::hash<std::string>{}(fmt::format("{}|{}|{}", state, epoch, rank)));
}

// Every rank checkpoints its state each epoch; `kill_at` (epoch) kills, on
// the first attempt of the first driver, rank 1 ("worker") or the driver
// ("driver"), once.
void tiered_loop(const nlohmann::json& config) {
  const TrainContext ctx = train::get_context();
  std::string state = "seed";
  int start = 0;
  if (auto ckpt = train::get_checkpoint()) {
    auto dir = ckpt->as_directory();
    start = std::stoi(slurp(dir.path() / "epoch.txt")) + 1;
    state = slurp(dir.path() / fmt::format("state_{}.txt", ctx.world_rank));
  }
  const fs::path marker = config.at("marker").get<std::string>();
  for (int epoch = start; epoch < config.at("epochs").get<int>(); ++epoch) {
    if (epoch == config.value("kill_at", -1) && ctx.world_rank == 1 && !fs::exists(marker)) {
      write_file(marker, "killed");
      if (config.contains("await_persisted")) {
        // Bounded: the background persistence of one of these checkpoints
        // is done (a newer due one replaces one still waiting).
        auto persisted = [&] {
          for (const auto& name : config["await_persisted"]) {
            const fs::path manifest = fs::path(ctx.experiment_path) / name.get<std::string>() /
                                      ".cairn" / "manifest.json";
            if (fs::exists(manifest)) return true;
          }
          return false;
        };
        for (int i = 0; i < 6000 && !persisted(); ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      }
      if (config.at("kill") == "driver") ::kill(::getppid(), SIGKILL);
      ::kill(::getpid(), SIGKILL);
    }
    state = next_state(state, epoch, ctx.world_rank);
    train::TemporaryDirectory tmp;
    write_file(fs::path(tmp.path()) / fmt::format("state_{}.txt", ctx.world_rank), state);
    if (ctx.world_rank == 0) write_file(fs::path(tmp.path()) / "epoch.txt", std::to_string(epoch));
    train::report({{"epoch", epoch}}, Checkpoint::from_directory(tmp.path()));
  }
}

class TrainerMemoryTier : public ::testing::Test {
 protected:
  RunConfig run(const std::string& name) const {
    RunConfig r;
    r.name = name;
    r.storage_path = storage_.str();
    r.failure_config.max_failures = 2;
    r.checkpoint_config.memory_tier.enabled = true;
    r.checkpoint_config.memory_tier.root = root_.str();
    r.checkpoint_config.memory_tier.num_to_keep = 2;
    r.checkpoint_config.memory_tier.persist_every_n = 0;  // only the end persists
    return r;
  }
  nlohmann::json config(const std::string& kill, int kill_at) const {
    return {{"epochs", 6},
            {"kill", kill},
            {"kill_at", kill_at},
            {"marker", (storage_.path() / ("killed-" + kill)).string()}};
  }
  // The final state files of the experiment's latest persisted checkpoint.
  std::string final_states(const std::string& name) const {
    ExperimentListing l = read_experiment((storage_.path() / name).string());
    EXPECT_FALSE(l.checkpoints.empty());
    if (l.checkpoints.empty()) return "";
    const Checkpoint& c = l.checkpoints.back().checkpoint;
    return c.storage().get("epoch.txt") + " " + c.storage().get("state_0.txt") + " " +
           c.storage().get("state_1.txt");
  }
  size_t tiers_left() const {
    const fs::path base = root_.path() / fmt::format("cairn-tier-{}", ::getuid());
    if (!fs::exists(base)) return 0;
    return static_cast<size_t>(std::distance(fs::directory_iterator(base), {}));
  }
  std::string reference() {
    Result r =
        Trainer(tiered_loop, config("none", -1), ScalingConfig{.num_workers = 2}, run("reference"))
            .fit();
    EXPECT_FALSE(r.error) << *r.error;
    EXPECT_TRUE(r.restores.empty());
    return final_states("reference");
  }

  TempDir root_;
  TempDir storage_;
};

TEST_F(TrainerMemoryTier, AKilledWorkerRestartsFromMemoryAndTheRunEndsAsIfNothingFailed) {
  const std::string want = reference();
  Result r =
      Trainer(tiered_loop, config("worker", 3), ScalingConfig{.num_workers = 2}, run("exp")).fit();
  ASSERT_FALSE(r.error) << *r.error;
  ASSERT_EQ(r.restores.size(), 1u);
  EXPECT_EQ(r.restores[0].attempt, 1);
  EXPECT_EQ(r.restores[0].checkpoint, "checkpoint_000002");  // epoch 2, in memory only
  EXPECT_EQ(r.restores[0].tier, "memory");
  EXPECT_EQ(final_states("exp"), want);
  // The end persisted the newest and freed the memory.
  ASSERT_TRUE(r.checkpoint);
  EXPECT_EQ(r.checkpoint->uri().find(root_.str()), std::string::npos) << r.checkpoint->uri();
  EXPECT_EQ(expect_all_verify(r.path), 1u);
  EXPECT_EQ(tiers_left(), 0u);
}

TEST_F(TrainerMemoryTier, AKilledDriverIsRestoredFromTheTierItLeft) {
  const std::string want = reference();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The driver: killed by its rank 1 at epoch 4.
    Trainer(tiered_loop, config("driver", 4), ScalingConfig{.num_workers = 2}, run("exp")).fit();
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  EXPECT_EQ(tiers_left(), 1u);  // epochs 2 and 3 are in memory, nothing persisted
  EXPECT_TRUE(read_experiment((storage_.path() / "exp").string()).checkpoints.empty());

  const std::string path = (storage_.path() / "exp").string();
  // Read from outside, the dead run's result names what its tier holds.
  const Result left = Result::from_path(path);
  ASSERT_TRUE(left.checkpoint);
  EXPECT_EQ(left.checkpoint->uri().rfind("file://" + root_.str(), 0), 0u) << left.checkpoint->uri();
  EXPECT_EQ(fs::path(left.checkpoint->uri()).filename(), "checkpoint_000003");
  EXPECT_TRUE(left.checkpoint->verify().empty());
  EXPECT_EQ(left.checkpoint->storage().get("epoch.txt"), "3");
  EXPECT_EQ(left.best_checkpoints.size(), 2u);

  Result r = Trainer::restore(path, tiered_loop).fit();
  ASSERT_FALSE(r.error) << *r.error;
  ASSERT_EQ(r.restores.size(), 1u);
  EXPECT_EQ(r.restores[0].checkpoint, "checkpoint_000003");
  EXPECT_EQ(r.restores[0].tier, "memory");
  EXPECT_EQ(final_states("exp"), want);
  EXPECT_EQ(tiers_left(), 0u);
}

TEST_F(TrainerMemoryTier, WhenTheHostsMemoryIsLostTooTheRestoreUsesTheNewestPersistedCheckpoint) {
  const std::string want = reference();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Every 2nd checkpoint persisted; the driver is killed at epoch 4, once
    // epoch 1's or epoch 3's copy is committed, with epochs 2 and 3 in
    // memory.
    RunConfig r = run("exp");
    r.checkpoint_config.memory_tier.persist_every_n = 2;
    nlohmann::json c = config("driver", 4);
    c["await_persisted"] = {"checkpoint_000001", "checkpoint_000003"};
    Trainer(tiered_loop, c, ScalingConfig{.num_workers = 2}, r).fit();
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  // The host's memory is gone (a reboot): only persistent storage is left.
  fs::remove_all(root_.path() / fmt::format("cairn-tier-{}", ::getuid()));
  const std::string path = (storage_.path() / "exp").string();
  const ExperimentListing persisted = read_experiment(path);
  ASSERT_FALSE(persisted.checkpoints.empty());
  const std::string newest = persisted.checkpoints.back().name;
  EXPECT_TRUE(newest == "checkpoint_000001" || newest == "checkpoint_000003") << newest;
  // Without the tier, from_path sees the persistent checkpoints only.
  ASSERT_TRUE(Result::from_path(path).checkpoint);
  EXPECT_EQ(Result::from_path(path).checkpoint->uri(),
            persisted.checkpoints.back().checkpoint.uri());

  Result r = Trainer::restore(path, tiered_loop).fit();
  ASSERT_FALSE(r.error) << *r.error;
  ASSERT_EQ(r.restores.size(), 1u);
  EXPECT_EQ(r.restores[0].checkpoint, newest);
  EXPECT_EQ(r.restores[0].tier, "persistent");
  EXPECT_EQ(final_states("exp"), want);
  EXPECT_EQ(tiers_left(), 0u);
}

}  // namespace
}  // namespace cairn
