// Asynchronous report (ReportOptions::async) with real worker processes:
// report() returns before the commit, rounds commit in report order, the
// snapshot survives the caller deleting its files, max_in_flight bounds what
// is pending, and a failed background upload stops and restarts the group.
//
// Ranks coordinate through marker files in a shared folder, with bounded
// waits, so what the tests prove does not depend on timing: a rank that waits
// for another rank's marker made after its report() returned can only see it
// if that report() returned before the round could commit.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cairn/error.h"
#include "cairn/state.h"
#include "cairn/train.h"
#include "support/temp_dir.h"
#include "train/train_support.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::expect_all_verify;
using testing::expect_no_children;
using testing::slurp;
using testing::TempDir;
using testing::write_file;

RunConfig run_in(const TempDir& dir) {
  RunConfig r;
  r.name = "exp";
  r.storage_path = dir.str();
  r.failure_config.report_timeout_s = 60;
  return r;
}

void mark(const nlohmann::json& config, const std::string& name) {
  const fs::path dir = config.at("markers").get<std::string>();
  write_file(dir / (name + ".tmp"), "1");
  fs::rename(dir / (name + ".tmp"), dir / name);
}

bool marked(const nlohmann::json& config, const std::string& name) {
  return fs::exists(fs::path(config.at("markers").get<std::string>()) / name);
}

// Waits up to 30 s for another rank's marker; throws if it never comes.
void await_mark(const nlohmann::json& config, const std::string& name) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!marked(config, name)) {
    if (std::chrono::steady_clock::now() > deadline) {
      throw std::runtime_error("marker " + name + " never appeared");
    }
    std::this_thread::sleep_for(2ms);
  }
}

std::string shard(int epoch, int rank) {
  return fmt::format("epoch {} rank {} ", epoch, rank) + std::string(64 << 10, 'a' + epoch % 26);
}

// Every rank writes its shard each epoch into a temporary directory, reports
// it asynchronously and deletes the directory at once. Rank 1 reports epoch
// e only after rank 0 has returned from its report of epoch e: with a
// synchronous report rank 0 could not return before rank 1 reports.
void async_loop(const nlohmann::json& config) {
  const int rank = train::get_context().world_rank;
  int start = 0;
  if (auto ckpt = train::get_checkpoint()) {
    start = std::stoi(slurp(ckpt->as_directory().path() / "epoch.txt")) + 1;
  }
  const int attempt = train::get_context().attempt;
  for (int epoch = start; epoch < config.at("epochs").get<int>(); ++epoch) {
    if (rank == 1) await_mark(config, fmt::format("a{}-rank0-returned-{}", attempt, epoch));
    {
      train::TemporaryDirectory tmp;
      write_file(fs::path(tmp.path()) / fmt::format("shard-{}.bin", rank), shard(epoch, rank));
      if (rank == 0) write_file(fs::path(tmp.path()) / "epoch.txt", std::to_string(epoch));
      train::report({{"epoch", epoch}}, Checkpoint::from_directory(tmp.path()),
                    {.async = true, .max_in_flight = config.value("max_in_flight", 1)});
      // Rewriting the reported file through a new inode leaves the report alone.
      write_file(fs::path(tmp.path()) / "next.tmp", "changed");
      fs::rename(fs::path(tmp.path()) / "next.tmp",
                 fs::path(tmp.path()) / fmt::format("shard-{}.bin", rank));
    }  // deletes the directory while the upload may still be reading
    if (rank == 0) mark(config, fmt::format("a{}-rank0-returned-{}", attempt, epoch));
  }
}

TEST(AsyncReport, ReturnsBeforeTheCommitAndCommitsEveryRoundInOrder) {
  TempDir dir;
  fs::create_directories(dir.path() / "markers");
  RunConfig run = run_in(dir);
  Trainer t(async_loop, {{"epochs", 5}, {"markers", (dir.path() / "markers").string()}},
            ScalingConfig{.num_workers = 2}, run);
  Result r = t.fit();
  ASSERT_FALSE(r.error) << *r.error;
  EXPECT_EQ(r.metrics["epoch"], 4);
  // Every round committed, in report order, each with the files as they were
  // at report() time although the caller deleted and rewrote them.
  ExperimentListing l = read_experiment(r.path);
  ASSERT_EQ(l.checkpoints.size(), 5u);
  for (size_t i = 0; i < l.checkpoints.size(); ++i) {
    const auto& rec = l.checkpoints[i];
    EXPECT_EQ(rec.metrics["epoch"], static_cast<int>(i)) << rec.name;
    auto view = rec.checkpoint.as_directory();
    EXPECT_EQ(slurp(view.path() / "epoch.txt"), std::to_string(i));
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(slurp(view.path() / fmt::format("shard-{}.bin", rank)),
                shard(static_cast<int>(i), rank))
          << rec.name << " rank " << rank;
    }
  }
  EXPECT_EQ(expect_all_verify(r.path), 5u);
  EXPECT_TRUE(l.uncommitted.empty());
  expect_no_children();
}

// max_in_flight = 2: rank 0 passes two reports that cannot commit yet (rank 1
// holds back), and its third blocks until the first commits, which needs rank
// 1's first report.
TEST(AsyncReport, MaxInFlightBoundsTheReportsNotYetCommitted) {
  TempDir dir;
  fs::create_directories(dir.path() / "markers");
  auto loop = [](const nlohmann::json& config) {
    const int rank = train::get_context().world_rank;
    for (int epoch = 0; epoch < 3; ++epoch) {
      if (rank == 1 && epoch == 0) {
        await_mark(config, "rank0-returned-1");
        // Round 1 cannot commit before this rank reports it, so rank 0's
        // third report cannot have returned.
        if (marked(config, "rank0-returned-2")) {
          throw std::runtime_error("rank 0 had three reports in flight with max_in_flight=2");
        }
      }
      train::report({{"epoch", epoch}}, Checkpoint::from_dict({{"epoch", epoch}}),
                    {.async = true, .max_in_flight = 2});
      if (rank == 0) mark(config, fmt::format("rank0-returned-{}", epoch));
    }
  };
  Trainer t(loop, {{"markers", (dir.path() / "markers").string()}}, ScalingConfig{.num_workers = 2},
            run_in(dir));
  Result r = t.fit();
  ASSERT_FALSE(r.error) << *r.error;
  ASSERT_TRUE(r.checkpoint);
  EXPECT_EQ(r.checkpoint->to_dict()["epoch"], 2);
  EXPECT_EQ(expect_all_verify(r.path), 3u);
  expect_no_children();
}

// Ranks may mix synchronous and asynchronous reports, with and without
// checkpoints; the order of commits is the order of reports.
TEST(AsyncReport, MixedWithSynchronousReportsKeepsReportOrder) {
  TempDir dir;
  // Each rank's file has a name of its own (the same name with different
  // contents would be a file conflict).
  auto loop = [](const nlohmann::json&) {
    const int rank = train::get_context().world_rank;
    for (int epoch = 0; epoch < 6; ++epoch) {
      const bool async = (epoch + rank) % 2 == 0;
      std::optional<Checkpoint> ckpt;
      if (epoch % 3 != 2) {
        ckpt = Checkpoint::in_memory();
        ckpt->storage().put(fmt::format("rank-{}.json", rank),
                            nlohmann::json{{"epoch", epoch}}.dump());
      }
      train::report({{"epoch", epoch}}, ckpt, {.async = async, .max_in_flight = 3});
      if (epoch == 3) train::wait_for_reports();
    }
  };
  Trainer t(loop, nlohmann::json::object(), ScalingConfig{.num_workers = 2}, run_in(dir));
  Result r = t.fit();
  ASSERT_FALSE(r.error) << *r.error;
  ExperimentListing l = read_experiment(r.path);
  std::vector<int> epochs;
  for (const auto& rec : l.checkpoints) {
    const int epoch = rec.metrics["epoch"].get<int>();
    epochs.push_back(epoch);
    for (int rank = 0; rank < 2; ++rank) {
      auto j =
          nlohmann::json::parse(rec.checkpoint.storage().get(fmt::format("rank-{}.json", rank)));
      EXPECT_EQ(j["epoch"], epoch) << rec.name;
    }
  }
  EXPECT_EQ(epochs, (std::vector<int>{0, 1, 3, 4}));
  EXPECT_EQ(r.metrics["epoch"], 5);
  expect_no_children();
}

// An in-memory checkpoint is frozen without a copy: writing to it after
// report() returns does not change what is committed.
TEST(AsyncReport, AnInMemoryCheckpointChangedAfterReportCommitsAsReported) {
  TempDir dir;
  auto loop = [](const nlohmann::json&) {
    const int rank = train::get_context().world_rank;
    Checkpoint ckpt = Checkpoint::in_memory();
    for (int epoch = 0; epoch < 3; ++epoch) {
      ckpt.storage().put(fmt::format("rank-{}.txt", rank), std::to_string(epoch));
      train::report({{"epoch", epoch}}, ckpt, {.async = true, .max_in_flight = 3});
      ckpt.storage().put(fmt::format("rank-{}.txt", rank), "changed after report");
      ckpt.storage().put(fmt::format("extra-{}.txt", rank), "added after report");
    }
  };
  Trainer t(loop, nlohmann::json::object(), ScalingConfig{.num_workers = 2}, run_in(dir));
  Result r = t.fit();
  ASSERT_FALSE(r.error) << *r.error;
  ExperimentListing l = read_experiment(r.path);
  ASSERT_EQ(l.checkpoints.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const Storage& s = l.checkpoints[i].checkpoint.storage();
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(const_cast<Storage&>(s).get(fmt::format("rank-{}.txt", rank)), std::to_string(i));
    }
    // What was added after the first report is in the later ones only.
    EXPECT_EQ(l.checkpoints[i].checkpoint.files().size(), i == 0 ? 2u : 4u);
  }
  expect_no_children();
}

// The pattern for tensor state every step: StateStager copies it into reused
// memory, the asynchronous report freezes that without a copy, and the
// caller changes its tensors at once.
TEST(AsyncReport, StagedStateEveryStepCommitsEachStepsValues) {
  TempDir dir;
  auto loop = [](const nlohmann::json&) {
    const int rank = train::get_context().world_rank;
    std::vector<float> w(1 << 16);
    StateStager stager;
    for (int step = 0; step < 6; ++step) {
      std::fill(w.begin(), w.end(), static_cast<float>(step * 10 + rank));
      StateDict state;
      state.add(fmt::format("w{}", rank), {w.size()}, std::span<const float>(w));
      // Each rank's file needs a name of its own.
      Checkpoint ckpt = stager.stage(state, nullptr, fmt::format("state-{}.safetensors", rank));
      train::report({{"step", step}}, ckpt, {.async = true, .max_in_flight = 2});
      std::fill(w.begin(), w.end(), -1.0f);
    }
  };
  Trainer t(loop, nlohmann::json::object(), ScalingConfig{.num_workers = 2}, run_in(dir));
  Result r = t.fit();
  ASSERT_FALSE(r.error) << *r.error;
  ExperimentListing l = read_experiment(r.path);
  ASSERT_EQ(l.checkpoints.size(), 6u);
  for (size_t step = 0; step < 6; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      MappedState m = MappedState::open(l.checkpoints[step].checkpoint.storage(),
                                        fmt::format("state-{}.safetensors", rank));
      auto v = m.tensor(fmt::format("w{}", rank)).as<float>();
      EXPECT_EQ(v[0], static_cast<float>(step * 10 + rank));
      EXPECT_EQ(v[v.size() - 1], static_cast<float>(step * 10 + rank));
    }
  }
  expect_no_children();
}

// The snapshot of rank 1's report is removed before the upload reads it: the
// background upload fails, the group stops and restarts from the latest
// checkpoint, and the run finishes with everything committed intact.
void sabotaged_loop(const nlohmann::json& config) {
  const int rank = train::get_context().world_rank;
  const int attempt = train::get_context().attempt;
  int start = 0;
  if (auto ckpt = train::get_checkpoint()) start = ckpt->to_dict()["epoch"].get<int>() + 1;
  for (int epoch = start; epoch < 4; ++epoch) {
    // Rank 0 reports after rank 1 has reported (and removed its snapshot):
    // the round's upload starts only then.
    if (rank == 0) await_mark(config, fmt::format("a{}-rank1-reported-{}", attempt, epoch));
    train::TemporaryDirectory tmp;
    write_file(fs::path(tmp.path()) / fmt::format("rank-{}.txt", rank), std::to_string(epoch));
    if (rank == 0) {
      write_file(fs::path(tmp.path()) / "dict.json", nlohmann::json{{"epoch", epoch}}.dump());
    }
    train::report({{"epoch", epoch}}, Checkpoint::from_directory(tmp.path()), {.async = true});
    if (rank == 1) {
      if (attempt == 0 && epoch == 2) {
        // The snapshots lie in the scratch folder next to this directory;
        // with max_in_flight = 1 only this report's is there.
        fs::remove_all(fs::path(tmp.path()).parent_path() / "reports");
      }
      mark(config, fmt::format("a{}-rank1-reported-{}", attempt, epoch));
    }
  }
}

TEST(AsyncReport, FailedBackgroundUploadStopsTheGroupWhichRestartsFromTheLatestCheckpoint) {
  TempDir dir;
  fs::create_directories(dir.path() / "markers");
  RunConfig run = run_in(dir);
  run.failure_config.max_failures = 1;
  Trainer t(sabotaged_loop, {{"markers", (dir.path() / "markers").string()}},
            ScalingConfig{.num_workers = 2}, run);
  Result r = t.fit();
  ASSERT_FALSE(r.error) << *r.error;
  EXPECT_EQ(r.metrics["epoch"], 3);
  auto state = nlohmann::json::parse(slurp(dir.path() / "exp" / "trainer_state.json"));
  EXPECT_EQ(state["failures"], 1);
  ExperimentListing l = read_experiment(r.path);
  std::vector<int> epochs;
  for (const auto& rec : l.checkpoints) epochs.push_back(rec.metrics["epoch"].get<int>());
  EXPECT_EQ(epochs, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(expect_all_verify(r.path), 4u);
  EXPECT_TRUE(l.uncommitted.empty()) << "the failed upload's folder is removed";
  expect_no_children();
}

TEST(AsyncReport, FailedBackgroundUploadWithoutRetriesEndsTheRunNamingTheRank) {
  TempDir dir;
  fs::create_directories(dir.path() / "markers");
  RunConfig run = run_in(dir);
  run.failure_config.max_failures = 0;
  Trainer t(sabotaged_loop, {{"markers", (dir.path() / "markers").string()}},
            ScalingConfig{.num_workers = 2}, run);
  Result r = t.fit();
  ASSERT_TRUE(r.error);
  EXPECT_NE(r.error->find("rank 1 failed in asynchronous report #3"), std::string::npos)
      << *r.error;
  ASSERT_TRUE(r.checkpoint);
  EXPECT_EQ(r.checkpoint->to_dict()["epoch"], 1) << "what was committed before stays";
  EXPECT_EQ(expect_all_verify(r.path), 2u);
  expect_no_children();
}

TEST(AsyncReport, MaxInFlightBelowOneIsAnInvalidReportNotRetried) {
  TempDir dir;
  RunConfig run = run_in(dir);
  run.failure_config.max_failures = 3;
  auto loop = [](const nlohmann::json&) {
    train::report({{"epoch", 0}}, std::nullopt, {.async = true, .max_in_flight = 0});
  };
  Result r = Trainer(loop, nlohmann::json::object(), ScalingConfig{.num_workers = 2}, run).fit();
  ASSERT_TRUE(r.error);
  EXPECT_NE(r.error->find("max_in_flight must be at least 1, got 0"), std::string::npos)
      << *r.error;
  auto state = nlohmann::json::parse(slurp(dir.path() / "exp" / "trainer_state.json"));
  EXPECT_EQ(state["failures"], 1) << "not retried";
  expect_no_children();
}

TEST(AsyncReport, ASnapshotOfAMissingDirectoryFailsInReportNamingIt) {
  TempDir dir;
  RunConfig run = run_in(dir);
  run.failure_config.max_failures = 0;
  auto loop = [](const nlohmann::json&) {
    const int rank = train::get_context().world_rank;
    try {
      train::report({{"epoch", 0}}, Checkpoint::from_directory("/nonexistent/cairn-ckpt"),
                    {.async = true});
    } catch (const Error& e) {
      // Nothing was sent: report again, properly, and the run goes on.
      if (std::string(e.what()).find("/nonexistent/cairn-ckpt") == std::string::npos) throw;
      train::report({{"epoch", 0}, {"rank", rank}}, Checkpoint::from_dict({{"ok", true}}),
                    {.async = true});
      return;
    }
    throw std::runtime_error("the snapshot of a missing directory did not fail");
  };
  Result r = Trainer(loop, nlohmann::json::object(), ScalingConfig{.num_workers = 2}, run).fit();
  ASSERT_FALSE(r.error) << *r.error;
  EXPECT_EQ(r.checkpoint->to_dict()["ok"], true);
  expect_no_children();
}

TEST(AsyncReport, WaitForReportsOutsideAWorkerThrows) {
  EXPECT_THROW(train::wait_for_reports(), Error);
}

}  // namespace
}  // namespace cairn
