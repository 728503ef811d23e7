// The demo program end to end: it fails once on purpose, resumes from the
// latest checkpoint when run again and finishes with a checkpoint that
// verifies, exactly as an uninterrupted run would have.
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cairn/checkpoint.h"
#include "cairn/manager.h"
#include "cli/subprocess.h"
#include "support/temp_dir.h"

namespace cairn {
namespace {

using testing::ProcessResult;
using testing::TempDir;

ProcessResult demo(const TempDir& storage, std::vector<std::string> extra) {
  std::vector<std::string> args{"--storage", storage.str(), "--experiment", "logreg"};
  args.insert(args.end(), extra.begin(), extra.end());
  return testing::run_process(CAIRN_DEMO_PATH, args);
}

ExperimentListing listing(const TempDir& storage) {
  return read_experiment((storage / "logreg").string());
}

int epoch_of(const CheckpointRecord& r) { return r.metrics.at("epoch").get<int>(); }

uint64_t checksum_of(const Checkpoint& cp, const std::string& file) {
  for (const auto& f : cp.manifest().files) {
    if (f.path == file) return f.xxh3;
  }
  ADD_FAILURE() << file << " not in " << cp.uri();
  return 0;
}

TEST(Demo, FailsAtTheChosenEpochAfterCommittingItsCheckpoint) {
  TempDir storage;
  ProcessResult r = demo(storage, {"--epochs", "5", "--fail-at-epoch", "3"});
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_NE(r.err.find("injected failure after epoch 3"), std::string::npos) << r.err;
  ExperimentListing l = listing(storage);
  ASSERT_EQ(l.checkpoints.size(), 3u);
  EXPECT_EQ(epoch_of(l.checkpoints.back()), 3);
}

TEST(Demo, ResumedRunFinishesEveryEpochAndItsFinalCheckpointVerifies) {
  TempDir storage;
  const std::vector<std::string> flags{"--epochs", "5", "--fail-at-epoch", "3"};
  ASSERT_EQ(demo(storage, flags).exit_code, 3);

  ProcessResult resumed = demo(storage, flags);  // same flags: the failure is injected once
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_NE(resumed.out.find("resumed from checkpoint_000002 (epoch 3)"), std::string::npos)
      << resumed.out;
  EXPECT_EQ(resumed.out.find("epoch   3/5"), std::string::npos) << resumed.out;  // not redone
  EXPECT_NE(resumed.out.find("finished: epoch 5/5"), std::string::npos) << resumed.out;

  ExperimentListing l = listing(storage);
  ASSERT_EQ(l.checkpoints.size(), 5u);
  for (size_t i = 0; i < l.checkpoints.size(); ++i) {
    EXPECT_EQ(epoch_of(l.checkpoints[i]), static_cast<int>(i) + 1);
  }
  const Checkpoint& final_cp = l.checkpoints.back().checkpoint;
  EXPECT_TRUE(final_cp.is_committed());
  EXPECT_TRUE(final_cp.verify().empty());
  ProcessResult verify = testing::run_process(CAIRN_CLI_PATH, {"verify", storage.str()});
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;

  // A third run has nothing left to do and does not fail either.
  ProcessResult again = demo(storage, flags);
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(listing(storage).checkpoints.size(), 5u);
}

TEST(Demo, ResumedRunEndsWithTheSameModelAndOptimizerAsAnUninterruptedRun) {
  TempDir interrupted, straight;
  ASSERT_EQ(demo(interrupted, {"--epochs", "4", "--fail-at-epoch", "2"}).exit_code, 3);
  ASSERT_EQ(demo(interrupted, {"--epochs", "4", "--fail-at-epoch", "2"}).exit_code, 0);
  ASSERT_EQ(demo(straight, {"--epochs", "4"}).exit_code, 0);
  const Checkpoint a = listing(interrupted).checkpoints.back().checkpoint;
  const Checkpoint b = listing(straight).checkpoints.back().checkpoint;
  EXPECT_EQ(checksum_of(a, "model.bin"), checksum_of(b, "model.bin"));
  EXPECT_EQ(checksum_of(a, "optimizer.bin"), checksum_of(b, "optimizer.bin"));
  EXPECT_EQ(checksum_of(a, "state.json"), checksum_of(b, "state.json"));
}

TEST(Demo, KeepsTheBestCheckpointsByTheScoreAttributeAndAlwaysTheLatest) {
  TempDir storage;
  ProcessResult r = demo(storage, {"--epochs", "6", "--num-to-keep", "2", "--score-attribute",
                                   "accuracy", "--score-order", "max"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ExperimentListing l = listing(storage);
  EXPECT_LE(l.checkpoints.size(), 3u);  // the K best, plus the latest if it is not among them
  EXPECT_EQ(epoch_of(l.checkpoints.back()), 6);
  EXPECT_EQ(l.config.num_to_keep, 2);
  EXPECT_EQ(l.config.checkpoint_score_attribute, "accuracy");
}

TEST(Demo, RejectsABadScoreOrderAsAUsageError) {
  TempDir storage;
  ProcessResult r = demo(storage, {"--score-order", "sideways"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--score-order"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace cairn
