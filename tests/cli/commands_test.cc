// The CLI commands' data collection on the in-memory backend, in process:
// the same code must work with object-store semantics (no directories, no
// rename), where a location exists only while objects lie under it.
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cairn/checkpoint.h"
#include "cairn/error.h"
#include "cairn/manager.h"
#include "cairn/storage.h"
#include "cli/commands.h"
#include "manager/history.h"
#include "manager/history_store.h"
#include "storage/backends.h"

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

// Every read and listing inside a checkpoint folder of `bucket`, and every
// listing of a whole experiment (a walk; list_names is another op), from now
// on goes into `touched`.
void watch_checkpoint_reads(const std::string& bucket, std::vector<std::string>& touched) {
  set_memory_faults(
      bucket, MemoryFaults{std::nullopt, [&touched](std::string_view op, std::string_view key) {
                             if (((op == "read" || op == "list") &&
                                  key.find("/checkpoint_0") != std::string_view::npos) ||
                                 (op == "list" && key.find('/') == std::string_view::npos)) {
                               touched.push_back(std::string(op) + " " + std::string(key));
                             }
                           }});
}

TEST(CommandsOnMemoryStorage, LsOfAKeepAllExperimentReadsNoManifest) {
  make_experiment("memory://cli-fast/exp", "cli-fast-scratch", 3);
  std::vector<std::string> touched;
  watch_checkpoint_reads("cli-fast", touched);
  LsView view = collect_ls("memory://cli-fast/exp");
  set_memory_faults("cli-fast", {});
  EXPECT_TRUE(touched.empty()) << touched.front();
  ASSERT_EQ(view.experiments.size(), 1u);
  const auto& rows = view.experiments[0].checkpoints;
  ASSERT_EQ(rows.size(), 3u);
  for (const auto& row : rows) {
    EXPECT_TRUE(row.committed);
    EXPECT_EQ(row.size_bytes, 64u);
    EXPECT_EQ(row.file_count, 1u);
    EXPECT_TRUE(row.time.has_value());
    EXPECT_EQ(row.error, "");
  }
  EXPECT_EQ(rows[2].metrics, nlohmann::json({{"epoch", 2}}));
}

// Plain ls trusts the history for what it names; --check reads every
// manifest and flags one removed behind the history's back.
TEST(CommandsOnMemoryStorage, LsCheckFlagsAManifestThatIsGoneWherePlainLsTrustsTheHistory) {
  make_experiment("memory://cli-check/exp", "cli-check-scratch", 2);
  auto storage = open_storage("memory://cli-check/exp");
  storage->remove(join_key("checkpoint_000001", kManifestKey));
  LsView plain = collect_ls("memory://cli-check/exp");
  ASSERT_EQ(plain.experiments[0].checkpoints.size(), 2u);
  EXPECT_EQ(plain.experiments[0].checkpoints[1].error, "");
  LsView checked = collect_ls("memory://cli-check/exp", /*check=*/true);
  ASSERT_EQ(checked.experiments[0].checkpoints.size(), 2u);
  EXPECT_EQ(checked.experiments[0].checkpoints[0].error, "");
  const std::string& error = checked.experiments[0].checkpoints[1].error;
  EXPECT_NE(error.find("checkpoint_000001"), std::string::npos) << error;
  EXPECT_NE(error.find("no manifest"), std::string::npos) << error;
  EXPECT_FALSE(collect_verify("memory://cli-check/exp").skipped.empty());
}

// A history an older Cairn wrote has no sizes: ls reads those manifests.
TEST(CommandsOnMemoryStorage, LsOfAnOldHistoryTakesSizesAndFileCountsFromTheManifests) {
  make_experiment("memory://cli-old/exp", "cli-old-scratch", 2);
  auto storage = open_storage("memory://cli-old/exp");
  history::Loaded loaded =
      history::load_history(*storage, storage->list(""), [](const std::string&) {});
  nlohmann::json old = history::snapshot_json(loaded.state);
  old["version"] = 1;
  old.erase("log_seq");
  for (auto& c : old["checkpoints"]) {
    c.erase("size_bytes");
    c.erase("file_count");
  }
  for (uint64_t seq : loaded.log_seqs) storage->remove(history::log_key(seq));
  storage->put(history::kSnapshotKey, old.dump(1));
  LsView view = collect_ls("memory://cli-old/exp");
  const auto& rows = view.experiments[0].checkpoints;
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& row : rows) {
    EXPECT_EQ(row.size_bytes, 64u);
    EXPECT_EQ(row.file_count, 1u);
  }
  EXPECT_EQ(rows[1].metrics, nlohmann::json({{"epoch", 1}}));
}

// The history names a checkpoint whose folder is gone (deleted by hand):
// it is not listed (a warning says so), and the next open drops its record.
TEST(CommandsOnMemoryStorage, LsLeavesOutACheckpointTheHistoryNamesWhoseFolderIsGone) {
  make_experiment("memory://cli-gone/exp", "cli-gone-scratch", 3);
  open_storage("memory://cli-gone/exp")->remove_prefix("checkpoint_000001");
  LsView view = collect_ls("memory://cli-gone/exp");
  const auto& rows = view.experiments[0].checkpoints;
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].name, "checkpoint_000000");
  EXPECT_EQ(rows[1].name, "checkpoint_000002");
}

}  // namespace
}  // namespace cairn::cli
