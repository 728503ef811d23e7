// The Trainer with real worker processes: report, distributed checkpoints,
// failures and restarts, results.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cairn/error.h"
#include "cairn/train.h"
#include "support/errors.h"
#include "support/temp_dir.h"
#include "train/train_support.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;
using testing::expect_all_verify;
using testing::expect_no_children;
using testing::slurp;
using testing::TempDir;
using testing::write_file;

RunConfig run_in(const TempDir& dir, std::string name = "exp") {
  RunConfig r;
  r.name = std::move(name);
  r.storage_path = dir.str();
  return r;
}

// The reference texts' loop shape: resume from get_checkpoint(), rank 0
// checkpoints every epoch.
void epoch_loop(const nlohmann::json& config) {
  int start = 0;
  if (auto ckpt = train::get_checkpoint()) {
    auto dir = ckpt->as_directory();
    start = std::stoi(slurp(dir.path() / "epoch.txt")) + 1;
  }
  const int rank = train::get_context().world_rank;
  for (int epoch = start; epoch < config.at("epochs").get<int>(); ++epoch) {
    if (config.value("fail_at_epoch", -1) == epoch && train::get_context().attempt == 0 &&
        rank == config.value("fail_rank", 1)) {
      throw std::runtime_error(fmt::format("intentional error at epoch {}", epoch));
    }
    train::TemporaryDirectory tmp;
    std::optional<Checkpoint> ckpt;
    if (rank == 0) {
      write_file(fs::path(tmp.path()) / "epoch.txt", std::to_string(epoch));
      ckpt = Checkpoint::from_directory(tmp.path());
    }
    train::report({{"epoch", epoch}, {"loss", 1.0 / (epoch + 1)}, {"rank", rank}}, ckpt);
  }
}

TEST(Trainer, RankZeroCheckpointsEveryEpochAndResultHasMetricsAndCheckpoints) {
  TempDir dir;
  Trainer t(epoch_loop, {{"epochs", 3}}, ScalingConfig{.num_workers = 2}, run_in(dir));
  Result r = t.fit();
  ASSERT_FALSE(r.error) << *r.error;
  EXPECT_EQ(r.metrics["epoch"], 2);
  EXPECT_EQ(r.metrics["rank"], 0) << "metrics come from rank 0";
  ASSERT_TRUE(r.checkpoint);
  EXPECT_EQ(slurp(fs::path(r.checkpoint->as_directory().path()) / "epoch.txt"), "2");
  EXPECT_EQ(r.best_checkpoints.size(), 3u);
  EXPECT_EQ(r.path, (dir.path() / "exp").string());
  EXPECT_EQ(expect_all_verify(r.path), 3u);
  expect_no_children();
}

// Small state reported from memory: no temporary directory, and resumed from
// the committed copy after a restart.
TEST(Trainer, InMemoryDictCheckpointsAreReportedAndResumed) {
  TempDir dir;
  auto loop = [](const nlohmann::json&) {
    int start = 0;
    if (auto ckpt = train::get_checkpoint()) start = ckpt->to_dict().at("epoch").get<int>() + 1;
    for (int epoch = start; epoch < 4; ++epoch) {
      if (epoch == 2 && train::get_context().attempt == 0) throw std::runtime_error("crash");
      train::report({{"epoch", epoch}}, Checkpoint::from_dict({{"epoch", epoch}, {"w", {1, 2}}}));
    }
  };
  RunConfig rc = run_in(dir);
  rc.failure_config.max_failures = 1;
  Trainer t(loop, {}, ScalingConfig{.num_workers = 2}, rc);
  Result r = t.fit();
  ASSERT_FALSE(r.error) << *r.error;
  ASSERT_TRUE(r.checkpoint);
  EXPECT_EQ(r.checkpoint->to_dict(), (nlohmann::json{{"epoch", 3}, {"w", {1, 2}}}));
  EXPECT_EQ(expect_all_verify(r.path), 4u);  // epochs 0, 1, then 2 and 3 after the restart
  expect_no_children();
}

TEST(Trainer, ContextNamesEveryRankAndTheExperiment) {
  TempDir dir;
  auto fn = [&](const nlohmann::json&) {
    const TrainContext& c = train::get_context();
    write_file(dir.path() / fmt::format("ctx-{}.json", c.world_rank),
               nlohmann::json{{"world_size", c.world_size},
                              {"local_rank", c.local_rank},
                              {"node_rank", c.node_rank},
                              {"name", c.experiment_name},
                              {"storage", c.storage_path}}
                   .dump());
  };
  Result r = Trainer(fn, {}, ScalingConfig{.num_workers = 3}, run_in(dir, "ctx")).fit();
  ASSERT_FALSE(r.error) << *r.error;
  for (int rank = 0; rank < 3; ++rank) {
    auto j = nlohmann::json::parse(slurp(dir.path() / fmt::format("ctx-{}.json", rank)));
    EXPECT_EQ(j["world_size"], 3);
    EXPECT_EQ(j["local_rank"], rank);
    EXPECT_EQ(j["node_rank"], 0);
    EXPECT_EQ(j["name"], "ctx");
    EXPECT_EQ(j["storage"], dir.str());
  }
}

TEST(Trainer, EveryRanksShardLandsInOneCommittedCheckpoint) {
  TempDir dir;
  auto fn = [](const nlohmann::json&) {
    const int rank = train::get_context().world_rank;
    train::TemporaryDirectory tmp;
    write_file(fs::path(tmp.path()) / fmt::format("model-rank={}.bin", rank),
               std::string(1000 + rank, static_cast<char>('a' + rank)));
    write_file(fs::path(tmp.path()) / "config.json", "{\"same\": true}");  // identical on all
    train::report({{"step", 1}}, Checkpoint::from_directory(tmp.path()));
  };
  Result r = Trainer(fn, {}, ScalingConfig{.num_workers = 3}, run_in(dir)).fit();
  ASSERT_FALSE(r.error) << *r.error;
  ASSERT_TRUE(r.checkpoint);
  Manifest m = r.checkpoint->manifest();
  std::vector<std::string> names;
  for (auto& f : m.files) names.push_back(f.path);
  EXPECT_EQ(names, (std::vector<std::string>{"config.json", "model-rank=0.bin", "model-rank=1.bin",
                                             "model-rank=2.bin"}));
  EXPECT_TRUE(r.checkpoint->verify().empty());
  EXPECT_EQ(m.metrics["step"], 1);
}

TEST(Trainer, TwoRanksWritingOneNameDifferentlyFailNamingBothAndCommitNothing) {
  TempDir dir;
  auto fn = [](const nlohmann::json&) {
    train::TemporaryDirectory tmp;
    write_file(fs::path(tmp.path()) / "model.pt",
               fmt::format("rank {}", train::get_context().world_rank));
    train::report({}, Checkpoint::from_directory(tmp.path()));
  };
  RunConfig run = run_in(dir);
  run.failure_config.max_failures = 3;
  Result r = Trainer(fn, {}, ScalingConfig{.num_workers = 2}, run).fit();
  ASSERT_TRUE(r.error);
  EXPECT_NE(r.error->find("\"model.pt\" was written by rank 0 and rank 1"), std::string::npos)
      << *r.error;
  EXPECT_NE(r.error->find("after 1 attempt"), std::string::npos) << "not retried: " << *r.error;
  ExperimentListing l = read_experiment(r.path);
  EXPECT_TRUE(l.checkpoints.empty());
  EXPECT_TRUE(l.uncommitted.empty()) << "the reserved location is removed";
  expect_no_children();
}

TEST(Trainer, RanksReportingDifferentNumbersOfTimesGetAClearErrorNotAHang) {
  TempDir dir;
  auto fn = [](const nlohmann::json&) {
    const int n = train::get_context().world_rank == 1 ? 3 : 2;
    for (int i = 0; i < n; ++i) train::report({{"i", i}});
  };
  RunConfig run = run_in(dir);
  run.failure_config.max_failures = -1;
  auto start = std::chrono::steady_clock::now();
  Result r = Trainer(fn, {}, ScalingConfig{.num_workers = 2}, run).fit();
  ASSERT_TRUE(r.error);
  EXPECT_NE(r.error->find("report count mismatch"), std::string::npos) << *r.error;
  EXPECT_NE(r.error->find("rank 1 called report() a 3rd time, but rank 0 returned from train_fn "
                          "after 2 report() calls"),
            std::string::npos)
      << *r.error;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
  expect_no_children();
}

TEST(Trainer, RankThatStopsReportingIsDetectedAfterTheTimeout) {
  TempDir dir;
  auto fn = [](const nlohmann::json&) {
    train::report({{"i", 0}});
    if (train::get_context().world_rank == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(60));  // hangs; the driver kills it
    }
    train::report({{"i", 1}});
  };
  RunConfig run = run_in(dir);
  run.failure_config.report_timeout_s = 0.5;
  Result r = Trainer(fn, {}, ScalingConfig{.num_workers = 2}, run).fit();
  ASSERT_TRUE(r.error);
  EXPECT_NE(r.error->find("report #2: rank(s) 1 did not call report() within 0.5 s"),
            std::string::npos)
      << *r.error;
  expect_no_children();
}

TEST(Trainer, ExceptionRestartsTheGroupFromTheLatestCheckpoint) {
  TempDir dir;
  RunConfig run = run_in(dir);
  run.failure_config.max_failures = 1;
  auto fn = [&](const nlohmann::json& config) {
    if (train::get_context().world_rank == 0) {
      auto ckpt = train::get_checkpoint();
      write_file(dir.path() / fmt::format("resumed-{}", train::get_context().attempt),
                 ckpt ? slurp(ckpt->as_directory().path() / "epoch.txt") : "none");
    }
    epoch_loop(config);
  };
  Result r =
      Trainer(fn, {{"epochs", 5}, {"fail_at_epoch", 2}}, ScalingConfig{.num_workers = 2}, run)
          .fit();
  ASSERT_FALSE(r.error) << *r.error;
  EXPECT_EQ(slurp(dir.path() / "resumed-0"), "none");
  EXPECT_EQ(slurp(dir.path() / "resumed-1"), "1") << "restart resumes from epoch 1's checkpoint";
  EXPECT_EQ(r.metrics["epoch"], 4);
  EXPECT_EQ(expect_all_verify(r.path), 5u);
  auto state = nlohmann::json::parse(slurp(dir.path() / "exp" / "trainer_state.json"));
  EXPECT_EQ(state["failures"], 1);
  EXPECT_EQ(state["status"], "finished");
  expect_no_children();
}

// result.json's lines, read back.
std::vector<nlohmann::json> result_lines(const fs::path& experiment) {
  return testing::read_json_lines(experiment / "result.json");
}

std::vector<std::string> csv_lines(const fs::path& experiment) {
  std::vector<std::string> lines;
  std::istringstream in(slurp(experiment / "progress.csv"));
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(Trainer, EveryRoundIsInTheHistoryAcrossRestartsAndRestore) {
  TempDir dir;
  RunConfig run = run_in(dir);
  run.failure_config.max_failures = 1;
  const fs::path exp = dir.path() / "exp";
  // Epochs 0 and 1, a failure, epoch 2 after the restart.
  Result r = Trainer(epoch_loop, {{"epochs", 3}, {"fail_at_epoch", 2}},
                     ScalingConfig{.num_workers = 2}, run)
                 .fit();
  ASSERT_FALSE(r.error) << *r.error;
  auto rows = result_lines(exp);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(r.metrics_history, rows);
  const std::vector<int> attempts = {0, 0, 1};
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i]["training_iteration"], i + 1);
    EXPECT_EQ(rows[i]["epoch"], i);
    EXPECT_EQ(rows[i]["rank"], 0);
    EXPECT_EQ(rows[i]["attempt"], attempts[i]);
    const auto& name = rows[i]["checkpoint_dir_name"];
    ASSERT_TRUE(name.is_string()) << rows[i];
    EXPECT_TRUE(fs::exists(exp / name.get<std::string>() / kManifestKey)) << name;
  }
  EXPECT_EQ(rows[2]["checkpoint_dir_name"],
            r.checkpoint->uri().substr(r.checkpoint->uri().rfind('/') + 1));

  // Trainer::restore continues the count (two more epochs).
  Result r2 = Trainer::restore(exp.string(), epoch_loop, nlohmann::json{{"epochs", 5}}).fit();
  ASSERT_FALSE(r2.error) << *r2.error;
  rows = result_lines(exp);
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_EQ(r2.metrics_history, rows);
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i]["training_iteration"], i + 1);
    EXPECT_EQ(rows[i]["epoch"], i);
    if (i > 0) {
      EXPECT_GE(rows[i]["timestamp"], rows[i - 1]["timestamp"]);
      EXPECT_GE(rows[i]["time_total_s"], rows[i - 1]["time_total_s"]);
    }
  }
  EXPECT_EQ(rows[4]["attempt"], 0);
  EXPECT_EQ(Result::from_path(exp.string()).metrics_history, rows);

  // progress.csv: a header and one row per round, with the metric values.
  auto lines = csv_lines(exp);
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_EQ(lines[0],
            "attempt,checkpoint_dir_name,epoch,iterations_since_restore,loss,rank,"
            "time_this_iter_s,time_total_s,timestamp,training_iteration");
  // Rows since the last (re)start: the group restart after epoch 1, then
  // the restore's driver.
  const std::vector<int> since_restore = {1, 2, 1, 1, 2};
  for (size_t i = 1; i < lines.size(); ++i) {
    const auto& row = rows[i - 1];
    EXPECT_EQ(row["iterations_since_restore"], since_restore[i - 1]) << i;
    EXPECT_EQ(lines[i], fmt::format("{},{},{},{},{},0,{},{},{},{}", row["attempt"].dump(),
                                    row["checkpoint_dir_name"].get<std::string>(),
                                    row["epoch"].dump(), row["iterations_since_restore"].dump(),
                                    row["loss"].dump(), row["time_this_iter_s"].dump(),
                                    row["time_total_s"].dump(), row["timestamp"].dump(), i));
  }
  // One TensorBoard event file per driver.
  int event_files = 0;
  for (const auto& e : fs::directory_iterator(exp)) {
    event_files += e.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  }
  EXPECT_EQ(event_files, 2);
  expect_no_children();
}

TEST(Trainer, AHistoryThatCannotBeWrittenFailsTheRunNamingTheFile) {
  TempDir dir;
  // A folder where result.json should be: neither appended to nor replaced.
  write_file(dir.path() / "exp" / "result.json" / "in-the-way", "x");
  RunConfig run = run_in(dir);
  run.failure_config.max_failures = 1;
  Result r = Trainer(epoch_loop, {{"epochs", 2}}, ScalingConfig{.num_workers = 1}, run).fit();
  ASSERT_TRUE(r.error);
  EXPECT_NE(r.error->find("recording report #1 in the run's history"), std::string::npos)
      << *r.error;
  EXPECT_NE(r.error->find("result.json"), std::string::npos) << *r.error;
  EXPECT_NE(r.error->find("after 2 attempt(s)"), std::string::npos) << *r.error;
  expect_no_children();
}

TEST(Trainer, ADamagedHistoryRefusesRestoreNamingTheLineAndChangesNothing) {
  TempDir dir;
  const fs::path exp = dir.path() / "exp";
  Result r =
      Trainer(epoch_loop, {{"epochs", 2}}, ScalingConfig{.num_workers = 1}, run_in(dir)).fit();
  ASSERT_FALSE(r.error) << *r.error;
  std::string text = slurp(exp / "result.json");
  text.insert(0, "{oops\n");
  write_file(exp / "result.json", text);
  const std::string state = slurp(exp / "trainer_state.json");
  std::string msg = testing::error_message_of(
      [&] { Trainer::restore(exp.string(), epoch_loop).fit(); }, ErrorCode::kCorruption);
  EXPECT_NE(msg.find("result.json line 1"), std::string::npos) << msg;
  EXPECT_EQ(slurp(exp / "trainer_state.json"), state);
  EXPECT_EQ(testing::code_of([&] { Result::from_path(exp.string()); }), ErrorCode::kCorruption);
  expect_no_children();
}

TEST(Trainer, SpentBudgetErrorNamesRankCauseAndStderrTail) {
  TempDir dir;
  RunConfig run = run_in(dir);
  run.failure_config.max_failures = 1;
  auto fn = [](const nlohmann::json&) {
    if (train::get_context().world_rank == 1) {
      std::fprintf(stderr, "loading shard from /data/shard-1\n");
      throw std::runtime_error("shard is corrupt");
    }
    train::report({});
  };
  Result r = Trainer(fn, {}, ScalingConfig{.num_workers = 2}, run).fit();
  ASSERT_TRUE(r.error);
  const std::string& e = *r.error;
  EXPECT_NE(e.find("max_failures=1 spent"), std::string::npos) << e;
  EXPECT_NE(e.find("after 2 attempt(s)"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 1 failed: train_fn raised std::runtime_error: shard is corrupt"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("exited with status 1"), std::string::npos) << e;
  EXPECT_NE(e.find("last lines of rank 1's stderr"), std::string::npos) << e;
  EXPECT_NE(e.find("loading shard from /data/shard-1"), std::string::npos) << e;
  Result stored = Result::from_path(r.path);
  EXPECT_EQ(stored.error, r.error);
  expect_no_children();
}

TEST(Trainer, WorkerKilledBySignalOrExitingNonZeroIsAFailure) {
  TempDir dir;
  for (int mode = 0; mode < 2; ++mode) {
    RunConfig run = run_in(dir, fmt::format("mode{}", mode));
    auto fn = [mode](const nlohmann::json&) {
      train::report({});
      if (train::get_context().world_rank == 1) {
        if (mode == 0) ::kill(::getpid(), SIGKILL);
        ::_exit(3);
      }
      train::report({});
    };
    Result r = Trainer(fn, {}, ScalingConfig{.num_workers = 2}, run).fit();
    ASSERT_TRUE(r.error);
    EXPECT_NE(
        r.error->find(mode == 0 ? "was killed by signal 9 (SIGKILL)" : "exited with status 3"),
        std::string::npos)
        << *r.error;
    EXPECT_NE(r.error->find("rank 1"), std::string::npos) << *r.error;
  }
  expect_no_children();
}

TEST(Trainer, ResumeFromCheckpointSeedsTheFirstGetCheckpoint) {
  TempDir dir;
  Result first =
      Trainer(epoch_loop, {{"epochs", 2}}, ScalingConfig{.num_workers = 1}, run_in(dir, "first"))
          .fit();
  ASSERT_FALSE(first.error) << *first.error;
  ASSERT_TRUE(first.checkpoint);
  Result second = Trainer(epoch_loop, {{"epochs", 4}}, ScalingConfig{.num_workers = 2},
                          run_in(dir, "second"), first.checkpoint)
                      .fit();
  ASSERT_FALSE(second.error) << *second.error;
  ExperimentListing l = read_experiment(second.path);
  ASSERT_EQ(l.checkpoints.size(), 2u) << "epochs 2 and 3 only";
  EXPECT_EQ(l.checkpoints[0].metrics["epoch"], 2);
}

TEST(Trainer, RetentionKeepsTheBestByScoreThroughTheManager) {
  TempDir dir;
  RunConfig run = run_in(dir);
  run.checkpoint_config.num_to_keep = 2;
  run.checkpoint_config.checkpoint_score_attribute = "loss";
  run.checkpoint_config.checkpoint_score_order = "min";
  auto fn = [](const nlohmann::json&) {
    const double losses[] = {0.5, 0.1, 0.9, 0.3};
    for (double loss : losses) {
      train::TemporaryDirectory tmp;
      write_file(fs::path(tmp.path()) / "w", std::to_string(loss));
      train::report({{"loss", loss}}, Checkpoint::from_directory(tmp.path()));
    }
  };
  Result r = Trainer(fn, {}, ScalingConfig{.num_workers = 1}, run).fit();
  ASSERT_FALSE(r.error) << *r.error;
  ASSERT_EQ(r.best_checkpoints.size(), 2u);
  EXPECT_EQ(r.best_checkpoints[0].metrics["loss"], 0.1);
  EXPECT_EQ(r.best_checkpoints[1].metrics["loss"], 0.3);
  EXPECT_EQ(r.checkpoint->manifest().metrics["loss"], 0.3) << "latest";
  Result stored = Result::from_path(r.path);
  EXPECT_EQ(stored.metrics, r.metrics);
  ASSERT_EQ(stored.best_checkpoints.size(), 2u);
  EXPECT_EQ(stored.best_checkpoints[0].checkpoint.uri(), r.best_checkpoints[0].checkpoint.uri());
  EXPECT_EQ(stored.checkpoint->uri(), r.checkpoint->uri());
}

TEST(Trainer, NonNumericScoreAttributeFailsOnceBeforeAnyUpload) {
  TempDir dir;
  RunConfig run = run_in(dir);
  run.checkpoint_config.checkpoint_score_attribute = "loss";
  run.failure_config.max_failures = 3;
  auto fn = [](const nlohmann::json&) {
    train::TemporaryDirectory tmp;
    write_file(fs::path(tmp.path()) / fmt::format("w-{}", train::get_context().world_rank), "w");
    train::report({{"loss", "low"}}, Checkpoint::from_directory(tmp.path()));
  };
  Result r = Trainer(fn, {}, ScalingConfig{.num_workers = 2}, run).fit();
  ASSERT_TRUE(r.error);
  EXPECT_NE(r.error->find("after 1 attempt(s)"), std::string::npos) << "not retried: " << *r.error;
  EXPECT_NE(r.error->find("score attribute \"loss\""), std::string::npos) << *r.error;
  EXPECT_NE(r.error->find("\"low\""), std::string::npos) << *r.error;
  ExperimentListing l = read_experiment(r.path);
  EXPECT_TRUE(l.checkpoints.empty());
  EXPECT_TRUE(l.uncommitted.empty()) << "no rank was told to upload";
  expect_no_children();
}

TEST(Trainer, MetricsThatAreNotAnObjectFailOnceNamingTheRank) {
  TempDir dir;
  RunConfig run = run_in(dir);
  run.failure_config.max_failures = 3;
  auto fn = [](const nlohmann::json&) {
    const int rank = train::get_context().world_rank;
    train::report(rank == 1 ? nlohmann::json::array({1, 2}) : nlohmann::json{{"x", 1}});
  };
  Result r = Trainer(fn, {}, ScalingConfig{.num_workers = 2}, run).fit();
  ASSERT_TRUE(r.error);
  EXPECT_NE(r.error->find("after 1 attempt(s)"), std::string::npos) << "not retried: " << *r.error;
  EXPECT_NE(r.error->find("rank 1"), std::string::npos) << *r.error;
  EXPECT_NE(r.error->find("JSON object"), std::string::npos) << *r.error;
  expect_no_children();
}

TEST(Trainer, ACheckpointFolderThatDoesNotExistFailsTheReportNamingItInsteadOfSavingNothing) {
  TempDir dir;
  RunConfig run = run_in(dir);
  auto fn = [](const nlohmann::json&) {
    train::report({{"x", 1}}, Checkpoint::from_directory("/nonexistent/typo-dir"));
  };
  Result r = Trainer(fn, {}, ScalingConfig{.num_workers = 1}, run).fit();
  ASSERT_TRUE(r.error);
  EXPECT_NE(r.error->find("typo-dir"), std::string::npos) << *r.error;
  EXPECT_FALSE(r.checkpoint) << "no empty checkpoint was committed";
  expect_no_children();
}

TEST(Trainer, LocalTemporaryDirectoriesAreRemovedEvenWhenAWorkerIsKilled) {
  TempDir dir;
  auto fn = [&](const nlohmann::json&) {
    train::TemporaryDirectory tmp;
    write_file(dir.path() / fmt::format("tmp-{}", train::get_context().world_rank), tmp.path());
    write_file(fs::path(tmp.path()) / "x", "x");
    train::report({}, Checkpoint::from_directory(tmp.path()));
    if (train::get_context().world_rank == 1) ::kill(::getpid(), SIGKILL);  // tmp is not destroyed
    train::report({});
  };
  Result r = Trainer(fn, {}, ScalingConfig{.num_workers = 2}, run_in(dir)).fit();
  ASSERT_TRUE(r.error);
  for (int rank = 0; rank < 2; ++rank) {
    fs::path tmp = slurp(dir.path() / fmt::format("tmp-{}", rank));
    EXPECT_FALSE(fs::exists(tmp)) << tmp;
    EXPECT_FALSE(fs::exists(tmp.parent_path().parent_path())) << "the scratch root goes too";
  }
  EXPECT_EQ(expect_all_verify(r.path), 1u);
}

TEST(Trainer, EnvironmentValueReadsTheCEnvironmentAsItIsNow) {
  ::setenv("CAIRN_TEST_ENVIRONMENT_VALUE", "set later", 1);
  EXPECT_EQ(train::environment_value("CAIRN_TEST_ENVIRONMENT_VALUE"), "set later");
  ::unsetenv("CAIRN_TEST_ENVIRONMENT_VALUE");
  EXPECT_EQ(train::environment_value("CAIRN_TEST_ENVIRONMENT_VALUE"), std::nullopt);
}

TEST(Trainer, TrainApiOutsideAWorkerThrows) {
  EXPECT_THROW(train::report({}), Error);
  EXPECT_THROW(train::get_checkpoint(), Error);
  EXPECT_THROW(train::get_context(), Error);
}

TEST(Trainer, BadConfigurationIsRefusedBeforeAnythingStarts) {
  TempDir dir;
  auto fn = [](const nlohmann::json&) {};
  EXPECT_THROW(
      Trainer(fn, {}, ScalingConfig{.num_workers = 0, .launcher = Launcher::kLocal}, run_in(dir)),
      Error);
  RunConfig bad = run_in(dir);
  bad.failure_config.max_failures = -2;
  EXPECT_THROW(Trainer(fn, {}, ScalingConfig{}, bad), Error);
  RunConfig traversal = run_in(dir, "../escape");
  EXPECT_THROW(Trainer(fn, {}, ScalingConfig{}, traversal), Error);
}

TEST(Trainer, WhatTheExperimentStoresMustBeStorableJsonAndIsRefusedNamingTheField) {
  TempDir dir;
  auto fn = [](const nlohmann::json&) {};
  auto code_and_message = [](const std::function<void()>& make) {
    return testing::error_message_of(make, ErrorCode::kInvalidArgument);
  };
  EXPECT_NE(code_and_message([&] {
              Trainer(fn, {{"tag", "\xff"}}, ScalingConfig{}, run_in(dir));
            }).find("train_loop_config"),
            std::string::npos);
  EXPECT_NE(code_and_message([&] {
              Trainer(fn, {}, ScalingConfig{}, run_in(dir, "caf\xe9"));
            }).find("RunConfig::name"),
            std::string::npos);
  RunConfig latin1 = run_in(dir);
  latin1.storage_path = dir.str() + "/caf\xe9";
  EXPECT_NE(code_and_message([&] {
              Trainer(fn, {}, ScalingConfig{}, latin1);
            }).find("RunConfig::storage_path"),
            std::string::npos);
  EXPECT_TRUE(fs::is_empty(dir.path())) << "nothing was created";
}

TEST(Trainer, SecondDriverOnALiveExperimentIsRefusedByTheLock) {
  TempDir dir;
  CheckpointManager holder((dir.path() / "exp").string(), {});
  auto fn = [](const nlohmann::json&) {};
  try {
    Trainer(fn, {}, ScalingConfig{}, run_in(dir)).fit();
    FAIL() << "expected kLocked";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kLocked) << e.what();
  }
}

}  // namespace
}  // namespace cairn
