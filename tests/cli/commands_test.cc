// The CLI commands' data collection on the in-memory backend, in process:
// the same code must work with object-store semantics (no directories, no
// rename), where a location exists only while objects lie under it.
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cairn/checkpoint.h"
#include "cairn/error.h"
#include "cairn/manager.h"
#include "cairn/storage.h"
#include "cli/commands.h"

namespace cairn::cli {
namespace {

// Writes `count` checkpoints with a 64-byte model.bin each into
// `experiment_uri`, staging them in the memory bucket `scratch_bucket`.
void make_experiment(const std::string& experiment_uri, const std::string& scratch_bucket,
                     int count) {
  CheckpointManager manager(experiment_uri, {});
  for (int i = 0; i < count; ++i) {
    const std::string scratch = "memory://" + scratch_bucket + "/" + std::to_string(i);
    open_storage(scratch)->put("model.bin", std::string(64, static_cast<char>('a' + i)));
    manager.register_checkpoint({{"epoch", i}}, Checkpoint::from_directory(scratch));
  }
}

TEST(CommandsOnMemoryStorage, LsListsCheckpointsAndALeftoverWithoutDirectories) {
  make_experiment("memory://cli-ls/root/exp", "cli-ls-scratch", 2);
  open_storage("memory://cli-ls/root/exp")->put("checkpoint_000007/model.bin", "partial");
  LsView view = collect_ls("memory://cli-ls/root");
  EXPECT_EQ(view.uri, "memory://cli-ls/root");
  ASSERT_EQ(view.experiments.size(), 1u);
  const ExperimentView& e = view.experiments[0];
  EXPECT_EQ(e.name, "exp");
  ASSERT_EQ(e.checkpoints.size(), 3u);
  EXPECT_TRUE(e.checkpoints[0].committed);
  EXPECT_EQ(e.checkpoints[1].size_bytes, 64u);
  EXPECT_EQ(e.checkpoints[1].metrics, nlohmann::json({{"epoch", 1}}));
  EXPECT_FALSE(e.checkpoints[2].committed);
  EXPECT_EQ(e.checkpoints[2].name, "checkpoint_000007");
}

TEST(CommandsOnMemoryStorage, VerifyNamesAnAlteredObject) {
  make_experiment("memory://cli-verify/exp", "cli-verify-scratch", 2);
  open_storage("memory://cli-verify/exp")->put("checkpoint_000001/model.bin", std::string(64, 'z'));
  VerifyView view = collect_verify("memory://cli-verify/exp");
  EXPECT_FALSE(view.ok());
  ASSERT_EQ(view.problems.size(), 1u);
  EXPECT_EQ(view.problems[0].checkpoint, "memory://cli-verify/exp/checkpoint_000001");
  EXPECT_EQ(view.problems[0].path, "model.bin");
  EXPECT_EQ(view.checkpoints.size(), 2u);
}

TEST(CommandsOnMemoryStorage, GcRemovesALeftoverAndKeepsTheCommitted) {
  make_experiment("memory://cli-gc/exp", "cli-gc-scratch", 1);
  auto storage = open_storage("memory://cli-gc/exp");
  storage->put("checkpoint_000004/model.bin", "partial");
  GcView view = collect_gc("memory://cli-gc/exp", /*dry_run=*/false);
  ASSERT_EQ(view.removed.size(), 1u);
  EXPECT_EQ(view.removed[0], "memory://cli-gc/exp/checkpoint_000004/model.bin");
  EXPECT_FALSE(storage->exists("checkpoint_000004/model.bin"));
  EXPECT_TRUE(collect_verify("memory://cli-gc/exp").ok());
}

TEST(CommandsOnMemoryStorage, AnEmptyPrefixIsNotFound) {
  try {
    collect_ls("memory://cli-nothing/here");
    FAIL() << "expected kNotFound";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("memory://cli-nothing/here"), std::string::npos);
  }
}

TEST(CommandsOnMemoryStorage, LsOfACheckpointPointsToShow) {
  make_experiment("memory://cli-lscp/exp", "cli-lscp-scratch", 1);
  try {
    collect_ls("memory://cli-lscp/exp/checkpoint_000000");
    FAIL() << "expected kInvalidArgument";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("cairn show"), std::string::npos) << e.what();
  }
  ShowView show = collect_show("memory://cli-lscp/exp/checkpoint_000000");
  EXPECT_TRUE(show.committed);
  ASSERT_EQ(show.files.size(), 1u);
  EXPECT_EQ(show.files[0].path, "model.bin");
}

TEST(CommandsOnMemoryStorage, LsOfATunerExperimentReadsTrialFoldersWithoutDirectories) {
  make_experiment("memory://cli-tune/root/tune/trial_00000", "cli-tune-scratch-0", 2);
  make_experiment("memory://cli-tune/root/other", "cli-tune-scratch-1", 1);
  auto tune = open_storage("memory://cli-tune/root/tune");
  tune->put("trial_00000/params.json", R"({"lr": 0.1})");
  tune->put("tuner_state.json", R"({"format": "cairn-tuner-state", "version": 1, "name": "tune",
    "updated_at": 1714564803, "metric": "epoch", "mode": "max", "trials": [
      {"trial_id": "trial_00000", "dir": "trial_00000", "status": "RUNNING",
       "config": {"lr": 0.1}, "last_result": {"epoch": 1}, "num_failures": 0, "error": null,
       "latest_checkpoint": "checkpoint_000001"},
      {"trial_id": "trial_00001", "dir": "trial_00001", "status": "PENDING",
       "config": {"lr": 0.2}, "last_result": null, "num_failures": 0, "error": null,
       "latest_checkpoint": null}]})");
  LsView view = collect_ls("memory://cli-tune/root");
  ASSERT_EQ(view.experiments.size(), 2u);
  EXPECT_EQ(view.experiments[0].name, "other");
  EXPECT_EQ(view.experiments[0].tuner, nullptr);
  const ExperimentView& e = view.experiments[1];
  EXPECT_EQ(e.name, "tune");
  ASSERT_NE(e.tuner, nullptr);
  ASSERT_EQ(e.tuner->trials.size(), 2u);
  const TrialView& running = e.tuner->trials[0];
  EXPECT_EQ(running.status, "RUNNING");
  EXPECT_FALSE(running.folder_missing);
  EXPECT_EQ(running.uri, "memory://cli-tune/root/tune/trial_00000");
  ASSERT_EQ(running.folder.checkpoints.size(), 2u);
  EXPECT_EQ(running.folder.checkpoints[1].uri,
            "memory://cli-tune/root/tune/trial_00000/checkpoint_000001");
  EXPECT_TRUE(e.tuner->trials[1].folder_missing);  // no object under it

  ShowView show = collect_show("memory://cli-tune/root/tune/trial_00000");
  ASSERT_TRUE(show.trial.has_value());
  EXPECT_EQ(show.trial->experiment_uri, "memory://cli-tune/root/tune");
  EXPECT_EQ(show.trial->trial.status, "RUNNING");
  EXPECT_EQ(show.trial->trial.folder.checkpoints.size(), 2u);
}

}  // namespace
}  // namespace cairn::cli
