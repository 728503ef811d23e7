// The memory tier of a CheckpointManager (MemoryTierConfig): where saves go,
// what is persisted and when, what a crash leaves for the next open, the
// bounds on memory and what `gc` frees.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "cairn/commit.h"
#include "cairn/error.h"
#include "cairn/manager.h"
#include "manager/tier_policy.h"
#include "support/errors.h"
#include "support/temp_dir.h"
#include "util/hash.h"

namespace cairn::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<uint64_t> indices(const std::vector<CheckpointRecord>& records) {
  std::vector<uint64_t> out;
  for (const auto& r : records) out.push_back(r.index);
  return out;
}

// Runs `body` in a child process that ends with _exit, as a crash would: a
// manager the body leaks is never closed, so nothing is persisted or freed
// on the way out.
void in_crashing_child(const std::function<void()>& body) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int code = 0;
    try {
      body();
    } catch (...) {
      code = 3;
    }
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

class MemoryTierTest : public ::testing::Test {
 protected:
  // A source folder holding model.bin with `contents`.
  Checkpoint source(const std::string& name, const std::string& contents) {
    write_text(sources_ / name / "model.bin", contents);
    return Checkpoint::from_directory((sources_ / name).string());
  }
  CheckpointConfig config(int keep_in_memory, int persist_every_n) const {
    CheckpointConfig c;
    c.memory_tier.enabled = true;
    c.memory_tier.root = root_.str();
    c.memory_tier.num_to_keep = keep_in_memory;
    c.memory_tier.persist_every_n = persist_every_n;
    return c;
  }
  std::string experiment() const { return (storage_ / "exp").string(); }
  // The folders of this user's tiers under the test's root.
  std::vector<fs::path> tier_folders() const {
    std::vector<fs::path> out;
    const fs::path base = root_.path() / ("cairn-tier-" + std::to_string(::getuid()));
    if (!fs::exists(base)) return out;
    for (const auto& e : fs::directory_iterator(base)) out.push_back(e.path());
    return out;
  }
  static std::string contents(const CheckpointRecord& r) {
    return r.checkpoint.storage().get("model.bin");
  }

  TempDir root_;  // the tier's RAM-backed folder stands here
  TempDir storage_;
  TempDir sources_;
};

TEST(TierPolicyTest, PersistsEveryNthAndAfterTheInterval) {
  using tier_policy::should_persist;
  EXPECT_FALSE(should_persist(3, 0, 2, 100, 0));
  EXPECT_TRUE(should_persist(3, 0, 3, 100, 0));
  EXPECT_FALSE(should_persist(0, 0, 1000, 1e9, 0));  // only the close persists
  EXPECT_FALSE(should_persist(0, 5, 1, 100 + 299, 100));
  EXPECT_TRUE(should_persist(0, 5, 1, 100 + 300, 100));
  EXPECT_TRUE(should_persist(100, 5, 1, 100 + 300, 100));  // either rule
}

TEST(TierPolicyTest, ShortfallCountsTheKeptCheckpointsAndTheOneBeingWritten) {
  using tier_policy::shortfall;
  // 2 kept + 1 being written, 100 bytes each: 300 needed.
  EXPECT_FALSE(shortfall(100, 2, {0, 300, 0}));
  EXPECT_FALSE(shortfall(100, 2, {200, 100, 0}));  // what the tier holds counts as room
  auto why = shortfall(100, 2, {0, 299, 0});
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("300"), std::string::npos) << *why;
  EXPECT_NE(why->find("299"), std::string::npos) << *why;
  why = shortfall(100, 2, {0, 1000, 250});
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("max_bytes 250"), std::string::npos) << *why;
  EXPECT_FALSE(shortfall(0, 2, {0, 0, 1}));  // nothing known yet
  EXPECT_FALSE(shortfall(UINT64_MAX / 2, 4, {UINT64_MAX, UINT64_MAX, 0}));
  EXPECT_TRUE(shortfall(UINT64_MAX / 2, 4, {0, 10, 0}));  // no overflow into a fit
}

TEST(TierPolicyTest, FolderNamesAreReadableAndDistinct) {
  using tier_policy::tier_folder_name;
  const std::string a = tier_folder_name("file:///data/runs/exp_1");
  EXPECT_EQ(a.rfind("exp_1-", 0), 0u) << a;
  EXPECT_EQ(a, tier_folder_name("file:///data/runs/exp_1"));
  EXPECT_NE(a, tier_folder_name("file:///other/runs/exp_1"));
  EXPECT_EQ(tier_folder_name("s3://b/x/../.hidden").find('/'), std::string::npos);
  EXPECT_NE(tier_folder_name("s3://b/x/.hidden")[0], '.');
}

TEST_F(MemoryTierTest, SavesGoToMemoryAndEveryNthIsPersistedInTheBackground) {
  CheckpointConfig c = config(/*keep_in_memory=*/2, /*persist_every_n=*/3);
  CheckpointManager m(experiment(), c);
  for (int i = 0; i < 7; ++i) {
    CheckpointRecord r = m.register_checkpoint(
        {{"step", i}}, source("s" + std::to_string(i), "state " + std::to_string(i)));
    EXPECT_EQ(r.index, static_cast<uint64_t>(i));
    EXPECT_EQ(r.tier, "memory");
    EXPECT_NE(r.checkpoint.uri().find(fs::path(root_.str()).filename().string()), std::string::npos)
        << r.checkpoint.uri();
    // Each due copy finishes before the next is due: a newer due checkpoint
    // would otherwise replace one still waiting on a loaded machine.
    m.wait_for_persistence();
  }
  // The 3rd and 6th went to persistent storage too, under their own names.
  ExperimentListing stored = read_experiment(experiment());
  EXPECT_EQ(indices(stored.checkpoints), (std::vector<uint64_t>{2, 5}));
  EXPECT_EQ(
      Checkpoint::from_directory(experiment() + "/checkpoint_000005").storage().get("model.bin"),
      "state 5");
  EXPECT_EQ(stored.checkpoints[1].metrics, json({{"step", 5}}));
  // Memory keeps the newest two; the history lists each checkpoint once.
  std::vector<CheckpointRecord> all = m.history();
  EXPECT_EQ(indices(all), (std::vector<uint64_t>{2, 5, 6}));
  EXPECT_EQ(all[0].tier, "persistent");
  EXPECT_EQ(all[1].tier, "memory");
  EXPECT_TRUE(all[1].persisted);
  EXPECT_EQ(all[2].tier, "memory");
  EXPECT_FALSE(all[2].persisted);
  auto latest = m.latest();
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->index, 6u);
  EXPECT_EQ(contents(*latest), "state 6");
  EXPECT_TRUE(latest->checkpoint.verify().empty()) << latest->checkpoint.uri();

  // Releasing persists the newest and frees the tier.
  m.release_memory_tier();
  EXPECT_TRUE(tier_folders().empty());
  EXPECT_EQ(indices(read_experiment(experiment()).checkpoints), (std::vector<uint64_t>{2, 5, 6}));
  latest = m.latest();
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->tier, "persistent");
  EXPECT_EQ(contents(*latest), "state 6");
  // Later saves go to persistent storage, after every index the tier used.
  CheckpointRecord after = m.register_checkpoint({{"step", 7}}, source("s7", "state 7"));
  EXPECT_EQ(after.index, 7u);
  EXPECT_EQ(after.tier, "persistent");
}

TEST_F(MemoryTierTest, PersistentRetentionFollowsItsOwnRules) {
  CheckpointConfig c = config(/*keep_in_memory=*/3, /*persist_every_n=*/1);
  c.num_to_keep = 1;
  {
    CheckpointManager m(experiment(), c);
    for (int i = 0; i < 4; ++i) {
      m.register_checkpoint({{"step", i}}, source("s" + std::to_string(i), std::to_string(i)));
      m.wait_for_persistence();
    }
    EXPECT_EQ(indices(read_experiment(experiment()).checkpoints), (std::vector<uint64_t>{3}));
    // Memory keeps three; the older two exist only there now.
    EXPECT_EQ(indices(m.history()), (std::vector<uint64_t>{1, 2, 3}));
  }
  EXPECT_TRUE(tier_folders().empty());
  EXPECT_EQ(indices(read_experiment(experiment()).checkpoints), (std::vector<uint64_t>{3}));
}

TEST_F(MemoryTierTest, ACrashLeavesTheTierAndTheNextOpenResumesFromMemory) {
  const CheckpointConfig c = config(/*keep_in_memory=*/2, /*persist_every_n=*/0);
  in_crashing_child([&] {
    auto* m = new CheckpointManager(experiment(), c);
    for (int i = 0; i < 4; ++i) {
      m->register_checkpoint({{"step", i}},
                             source("s" + std::to_string(i), "v" + std::to_string(i)));
    }
  });
  EXPECT_TRUE(read_experiment(experiment()).checkpoints.empty());  // nothing persisted yet
  ASSERT_EQ(tier_folders().size(), 1u);
  {
    CheckpointManager m(experiment(), c);
    auto latest = m.latest();
    ASSERT_TRUE(latest);
    EXPECT_EQ(latest->index, 3u);
    EXPECT_EQ(latest->tier, "memory");
    EXPECT_EQ(contents(*latest), "v3");
    // Numbering goes on after the tier's checkpoints.
    EXPECT_EQ(m.register_checkpoint({{"step", 4}}, source("s4", "v4")).index, 4u);
  }
  // The close persisted the newest and freed the memory.
  EXPECT_TRUE(tier_folders().empty());
  ExperimentListing stored = read_experiment(experiment());
  ASSERT_EQ(indices(stored.checkpoints), (std::vector<uint64_t>{4}));
  EXPECT_EQ(stored.checkpoints[0].checkpoint.storage().get("model.bin"), "v4");
}

// A bit flip in RAM: latest_intact() finds it by the manifest's checksum,
// drops the damaged copy (reported) and takes the next one: the persistent
// copy of the same checkpoint, else the newest older copy in memory. An
// intact memory copy is returned as it is.
TEST_F(MemoryTierTest, ADamagedCopyInMemoryIsDroppedAndTheNextCopyTaken) {
  auto flip = [](const CheckpointRecord& r) {
    std::string bytes = r.checkpoint.storage().get("model.bin");
    bytes[bytes.size() / 2] ^= 0x01;
    r.checkpoint.storage().put("model.bin", bytes);
  };
  CheckpointManager m(experiment(), config(/*keep_in_memory=*/3, /*persist_every_n=*/2));
  for (int i = 0; i < 4; ++i) {
    m.register_checkpoint({{"i", i}}, source("s" + std::to_string(i), std::string(4096, 'a' + i)));
  }
  m.wait_for_persistence();  // 1 and 3 persisted; 0..3 in memory (3 kept there: 1..3)
  std::vector<std::string> dropped;
  auto intact = m.latest_intact(&dropped);
  ASSERT_TRUE(intact && intact->index == 3 && intact->tier == "memory");
  EXPECT_TRUE(dropped.empty());

  flip(*intact);
  intact = m.latest_intact(&dropped);
  ASSERT_TRUE(intact);
  EXPECT_EQ(intact->index, 3u);
  EXPECT_EQ(intact->tier, "persistent");
  EXPECT_EQ(contents(*intact), std::string(4096, 'd'));
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_NE(dropped[0].find("checkpoint_000003"), std::string::npos) << dropped[0];
  EXPECT_NE(dropped[0].find("model.bin"), std::string::npos) << dropped[0];

  // Nothing persisted of 2: its damaged memory copy gives way to 1 in memory.
  m.register_checkpoint({{"i", 4}}, source("s4", std::string(4096, 'e')));
  const auto newest = m.latest();  // 4, in memory only (persisted every 2nd: 5)
  ASSERT_TRUE(newest && newest->index == 4 && newest->tier == "memory" && !newest->persisted);
  flip(*newest);
  dropped.clear();
  intact = m.latest_intact(&dropped);
  ASSERT_TRUE(intact);
  EXPECT_EQ(intact->index, 3u);
  EXPECT_EQ(dropped.size(), 1u);
  // The dropped copies are gone from the tier and from the history.
  for (const auto& r : m.history()) {
    if (r.tier == "memory") {
      EXPECT_NE(r.index, 4u);
    }
  }
  EXPECT_EQ(indices(m.history()).back(), 3u);
}

TEST_F(MemoryTierTest, ATierLeftByAnEarlierExperimentAtTheSameUriIsNotUsed) {
  const CheckpointConfig c = config(2, 0);
  in_crashing_child([&] {
    auto* m = new CheckpointManager(experiment(), c);
    m->register_checkpoint({{"step", 0}}, source("old", "old state"));
  });
  fs::remove_all(experiment());  // the experiment is deleted and started again
  CheckpointManager m(experiment(), c);
  EXPECT_FALSE(m.latest().has_value());
  EXPECT_EQ(m.register_checkpoint({{"step", 0}}, source("new", "new state")).index, 0u);
  EXPECT_EQ(contents(*m.latest()), "new state");
}

TEST_F(MemoryTierTest, DistributedSavesReserveAndCommitInMemory) {
  CheckpointManager m(experiment(), config(2, 2));
  Checkpoint reserved = m.reserve_next();
  EXPECT_NE(reserved.uri().find(fs::path(root_.str()).filename().string()), std::string::npos)
      << reserved.uri();
  reserved.storage().put("rank_0.bin", "zero");
  reserved.storage().put("rank_1.bin", "one");
  const std::vector<ManifestEntry> files = {{"rank_0.bin", 4, xxh3_64("zero")},
                                            {"rank_1.bin", 3, xxh3_64("one")}};
  const json two_ranks = {{"world_size", 2}, {"contributed", {0, 1}}};
  CheckpointRecord r =
      m.commit_reserved(reserved, {{"loss", 1.0}}, files, nullptr, nullptr, two_ranks);
  EXPECT_EQ(r.tier, "memory");
  EXPECT_EQ(r.checkpoint.manifest().ranks, two_ranks);
  Checkpoint gone = m.reserve_next();
  gone.storage().put("rank_0.bin", "partial");
  m.abandon_reserved(gone);
  EXPECT_FALSE(gone.storage().exists("rank_0.bin"));
  const json one_rank = {{"world_size", 2}, {"contributed", {0}}};
  Checkpoint second = m.reserve_next();
  second.storage().put("rank_0.bin", "zero");
  m.commit_reserved(second, {{"loss", 0.5}}, {{"rank_0.bin", 4, xxh3_64("zero")}}, nullptr, nullptr,
                    one_rank);
  m.wait_for_persistence();
  // The second commit was the 2nd tier save: persisted with its ranks.
  ExperimentListing stored = read_experiment(experiment());
  ASSERT_EQ(stored.checkpoints.size(), 1u);
  EXPECT_EQ(stored.checkpoints[0].index, 2u);
  EXPECT_EQ(stored.checkpoints[0].checkpoint.manifest().ranks, one_rank);
  EXPECT_TRUE(stored.checkpoints[0].checkpoint.verify().empty());
}

TEST_F(MemoryTierTest, ATierThatCannotHoldTheStateRefusesOrFallsBackAsConfigured) {
  CheckpointConfig c = config(2, 0);
  c.memory_tier.max_bytes = 1000;  // 3 × 400 bytes do not fit
  {
    CheckpointManager m(experiment(), c);
    const std::string message = error_message_of(
        [&] {
          m.register_checkpoint({{"step", 0}}, source("big", std::string(400, 'x')));
        },
        ErrorCode::kNoSpace);
    for (const char* word : {"memory tier", "max_bytes 1000", "1200", "on_insufficient_memory"}) {
      EXPECT_NE(message.find(word), std::string::npos) << message;
    }
    EXPECT_FALSE(m.latest().has_value());
    EXPECT_TRUE(read_experiment(experiment()).checkpoints.empty());
  }
  c.memory_tier.on_insufficient_memory = "persistent_only";
  std::vector<std::string> warnings;
  ManagerOptions options;
  options.warn = [&](const std::string& w) { warnings.push_back(w); };
  CheckpointManager m(experiment(), c, options);
  CheckpointRecord r = m.register_checkpoint({{"step", 0}}, source("big", std::string(400, 'x')));
  EXPECT_EQ(r.tier, "persistent");
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("persistent storage only"), std::string::npos) << warnings[0];
  // A small one fits again and goes to memory.
  EXPECT_EQ(m.register_checkpoint({{"step", 1}}, source("small", "x")).tier, "memory");
}

TEST_F(MemoryTierTest, GcFreesTheTiersOfDeadRunsAndSkipsLiveOnes) {
  const CheckpointConfig c = config(2, 0);
  in_crashing_child([&] {
    auto* m = new CheckpointManager(experiment(), c);
    m->register_checkpoint({{"step", 0}}, source("s", "v"));
  });
  ASSERT_EQ(tier_folders().size(), 1u);
  GcReport dry = collect_memory_tiers(root_.str(), /*dry_run=*/true);
  ASSERT_EQ(dry.removed.size(), 1u);
  EXPECT_NE(dry.removed[0].find(experiment()), std::string::npos) << dry.removed[0];
  EXPECT_EQ(tier_folders().size(), 1u);
  {
    CheckpointManager live((storage_ / "other").string(), c);
    live.register_checkpoint({{"step", 0}}, source("s", "v"));
    GcReport report = collect_memory_tiers(root_.str());
    EXPECT_EQ(report.removed.size(), 1u);
    ASSERT_EQ(report.skipped.size(), 1u);
    EXPECT_NE(report.skipped[0].find("live"), std::string::npos) << report.skipped[0];
    EXPECT_EQ(tier_folders().size(), 1u);
    EXPECT_TRUE(live.latest()->checkpoint.verify().empty());
  }
  EXPECT_TRUE(tier_folders().empty());
}

TEST_F(MemoryTierTest, BadSettingsAreRefusedNamingTheField) {
  CheckpointConfig c = config(2, 0);
  c.memory_tier.num_to_keep = 0;
  expect_invalid_argument([&] { c.validate(); }, "MemoryTierConfig.num_to_keep");
  c = config(2, 0);
  c.memory_tier.persist_every_n = -1;
  expect_invalid_argument([&] { c.validate(); }, "MemoryTierConfig.persist_every_n");
  c = config(2, 0);
  c.memory_tier.persist_every_minutes = -1;
  expect_invalid_argument([&] { c.validate(); }, "MemoryTierConfig.persist_every_minutes");
  c = config(2, 0);
  c.memory_tier.replicas = -1;
  expect_invalid_argument([&] { c.validate(); }, "MemoryTierConfig.replicas must be >= 0, got -1");
  c = config(2, 0);
  c.memory_tier.on_insufficient_memory = "spill";
  expect_invalid_argument([&] { c.validate(); },
                          "MemoryTierConfig.on_insufficient_memory must be \"error\" or "
                          "\"persistent_only\", got \"spill\"");
  c = config(2, 0);
  c.memory_tier.root = (root_ / "missing").string();
  expect_invalid_argument([&] { CheckpointManager m(experiment(), c); },
                          "MemoryTierConfig.root " + (root_ / "missing").string());
}

TEST_F(MemoryTierTest, TheConfigurationRoundTripsThroughJson) {
  CheckpointConfig c = config(3, 4);
  c.memory_tier.persist_every_minutes = 2.5;
  c.memory_tier.max_bytes = 1 << 20;
  c.memory_tier.on_insufficient_memory = "persistent_only";
  c.memory_tier.replicas = 2;
  EXPECT_EQ(CheckpointConfig::from_json(c.to_json()).memory_tier, c.memory_tier);
  EXPECT_FALSE(CheckpointConfig().to_json().contains("memory_tier"));
  EXPECT_FALSE(CheckpointConfig::from_json(CheckpointConfig().to_json()).memory_tier.enabled);
}

}  // namespace
}  // namespace cairn::testing
