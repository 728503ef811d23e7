// SIGKILL at random moments: of a worker (during training and during a
// checkpoint upload) and of the driver, followed by Trainer::restore. Each
// shows that nothing committed is lost: every checkpoint seen committed
// before a kill is still there and verifies, and the latest one loads.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "cairn/error.h"
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

std::string shard_bytes(int epoch, int rank, size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((epoch * 31 + rank * 7 + i) & 0xff);
  return s;
}

// Every rank saves its shard each epoch; rank 0 also saves the epoch. On
// resume, each rank checks that its shard in the checkpoint is whole.
// Config: epochs, shard_bytes, sleep_ms, pid_dir; extra_files, async
// (ReportOptions::async: the upload runs while the loop goes on).
void sharded_loop(const nlohmann::json& config) {
  const TrainContext& ctx = train::get_context();
  const int rank = ctx.world_rank;
  const size_t n = config.at("shard_bytes").get<size_t>();
  {
    fs::path pid_dir = config.at("pid_dir").get<std::string>();
    fs::path tmp = pid_dir / fmt::format(".rank-{}.{}", rank, ::getpid());
    write_file(tmp, std::to_string(::getpid()));
    fs::rename(tmp, pid_dir / fmt::format("rank-{}", rank));
  }
  int start = 0;
  if (auto ckpt = train::get_checkpoint()) {
    auto dir = ckpt->as_directory();
    const int epoch = std::stoi(slurp(dir.path() / "epoch.txt"));
    if (slurp(dir.path() / fmt::format("shard-{}.bin", rank)) != shard_bytes(epoch, rank, n)) {
      throw std::runtime_error(fmt::format("rank {}: shard of epoch {} is damaged", rank, epoch));
    }
    start = epoch + 1;
    if (rank == 0) {
      write_file(fs::path(config.at("pid_dir").get<std::string>()) /
                     fmt::format("resumed-{}-{}", ctx.attempt, ::getpid()),
                 std::to_string(epoch));
    }
  }
  for (int epoch = start; epoch < config.at("epochs").get<int>(); ++epoch) {
    std::this_thread::sleep_for(std::chrono::milliseconds(config.value("sleep_ms", 0)));
    train::TemporaryDirectory tmp;
    write_file(fs::path(tmp.path()) / fmt::format("shard-{}.bin", rank),
               shard_bytes(epoch, rank, n));
    if (rank == 0) write_file(fs::path(tmp.path()) / "epoch.txt", std::to_string(epoch));
    // Extra small files make an upload last (each is made durable on its own).
    for (int i = 0; i < config.value("extra_files", 0); ++i) {
      write_file(fs::path(tmp.path()) / fmt::format("extra-{}-{}", rank, i), std::to_string(i));
    }
    train::report({{"epoch", epoch}}, Checkpoint::from_directory(tmp.path()),
                  {.async = config.value("async", false)});
  }
}

std::optional<pid_t> read_pid(const fs::path& p) {
  std::string s = slurp(p);
  if (s.empty()) return std::nullopt;
  return static_cast<pid_t>(std::stol(s));
}

// Committed and uncommitted (being uploaded, with files) checkpoint folders.
struct Seen {
  std::set<std::string> committed;
  bool uploading = false;
};
Seen look(const fs::path& experiment) {
  Seen s;
  std::error_code ec;
  for (auto it = fs::directory_iterator(experiment, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("checkpoint_", 0) != 0 || !it->is_directory(ec)) continue;
    if (fs::exists(it->path() / ".cairn" / "manifest.json", ec)) {
      s.committed.insert(name);
    } else if (!fs::is_empty(it->path(), ec)) {
      s.uploading = true;
    }
  }
  return s;
}

// Forked before fit(): kills a random worker `kills` times, half at random
// moments and half as soon as a checkpoint is being uploaded, and writes the
// checkpoints it saw committed before each kill to `seen_file`.
pid_t start_worker_killer(const fs::path& pid_dir, const fs::path& experiment,
                          const fs::path& seen_file, int kills, int world_size, unsigned seed) {
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  std::mt19937 rng(seed);
  std::set<std::string> seen;
  int done = 0;
  for (int k = 0; k < kills; ++k) {
    const bool at_upload = k % 2 == 1;
    auto deadline = std::chrono::steady_clock::now() + 3s;
    if (at_upload) {
      while (std::chrono::steady_clock::now() < deadline && !look(experiment).uploading) {
        std::this_thread::sleep_for(1ms);
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(30 + rng() % 200));
    }
    Seen s = look(experiment);
    auto victim = read_pid(pid_dir / fmt::format("rank-{}", rng() % world_size));
    if (victim && ::kill(*victim, SIGKILL) == 0) {
      ++done;
      seen.insert(s.committed.begin(), s.committed.end());
    }
    std::this_thread::sleep_for(100ms);  // let the group restart
  }
  nlohmann::json j = nlohmann::json::array();
  for (const auto& n : seen) j.push_back(n);
  write_file(seen_file, nlohmann::json{{"kills", done}, {"committed", j}}.dump());
  ::_exit(0);
}

void kill_workers(bool async) {
  TempDir dir;
  fs::create_directories(dir.path() / "pids");
  const fs::path experiment = dir.path() / "exp";
  const unsigned seed = static_cast<unsigned>(std::random_device{}());
  SCOPED_TRACE(fmt::format("seed {}", seed));
  const int epochs = 14;
  pid_t killer = start_worker_killer(dir.path() / "pids", experiment, dir.path() / "seen.json",
                                     /*kills=*/6, /*world_size=*/2, seed);
  RunConfig run;
  run.name = "exp";
  run.storage_path = dir.str();
  run.failure_config.max_failures = -1;
  run.failure_config.report_timeout_s = 30;
  Trainer trainer(sharded_loop,
                  {{"epochs", epochs},
                   {"shard_bytes", 2 << 20},
                   {"sleep_ms", 30},
                   {"async", async},
                   {"pid_dir", (dir.path() / "pids").string()}},
                  ScalingConfig{.num_workers = 2}, run);
  Result r = trainer.fit();
  int status = 0;
  ASSERT_EQ(::waitpid(killer, &status, 0), killer);
  ASSERT_FALSE(r.error) << *r.error;
  EXPECT_EQ(r.metrics["epoch"], epochs - 1);

  auto seen = nlohmann::json::parse(slurp(dir.path() / "seen.json"));
  auto state = nlohmann::json::parse(slurp(experiment / "trainer_state.json"));
  EXPECT_GE(state["failures"].get<int>(), 1) << "no kill landed during training";
  // Nothing committed is lost: what was committed before any kill is still
  // there, and everything visible verifies.
  ExperimentListing l = read_experiment(experiment.string());
  std::set<std::string> now;
  for (auto& c : l.checkpoints) now.insert(c.name);
  for (auto& name : seen["committed"]) EXPECT_TRUE(now.count(name)) << name << " was lost";
  expect_all_verify(experiment.string());
  EXPECT_TRUE(l.uncommitted.empty()) << "interrupted uploads are removed";
  // The latest loads, with every rank's shard whole.
  auto latest = r.checkpoint->as_directory();
  EXPECT_EQ(slurp(latest.path() / "epoch.txt"), std::to_string(epochs - 1));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(slurp(latest.path() / fmt::format("shard-{}.bin", rank)),
              shard_bytes(epochs - 1, rank, 2 << 20));
  }
  expect_no_children();
}

TEST(TrainCrash, WorkerKilledAtRandomMomentsAndDuringUploadsLosesNothingCommitted) {
  kill_workers(/*async=*/false);
}

TEST(TrainCrash, WorkerKilledDuringAsynchronousReportsLosesNothingCommitted) {
  kill_workers(/*async=*/true);
}

// Runs fit() in a child process (the driver), kills it with SIGKILL once the
// experiment has `min_committed` checkpoints (and, when `during_upload`, at
// the moment one is being uploaded), then restores.
void kill_driver_then_restore(bool during_upload, unsigned seed, bool async = false) {
  TempDir dir;
  fs::create_directories(dir.path() / "pids");
  const fs::path experiment = dir.path() / "exp";
  // Slow enough that the driver is still training when it is killed; large
  // enough shards that an upload is in progress for a while.
  const int epochs = 40;
  const nlohmann::json slow = {{"epochs", epochs}, {"shard_bytes", 1 << 20},
                               {"sleep_ms", 50},   {"extra_files", during_upload ? 24 : 0},
                               {"async", async},   {"pid_dir", (dir.path() / "pids").string()}};
  RunConfig run;
  run.name = "exp";
  run.storage_path = dir.str();
  run.checkpoint_config.num_to_keep = 3;
  pid_t driver = ::fork();
  ASSERT_GE(driver, 0);
  if (driver == 0) {
    // The killed driver cannot remove its scratch directory; the restored
    // driver below must. Both use a TMPDIR inside this test's directory.
    fs::create_directories(dir.path() / "tmp");
    ::setenv("TMPDIR", (dir.path() / "tmp").c_str(), 1);
    Trainer(sharded_loop, slow, ScalingConfig{.num_workers = 2}, run).fit();
    ::_exit(0);
  }
  std::mt19937 rng(seed);
  // At most num_to_keep (3) checkpoints are visible at once.
  const int min_committed = 2 + static_cast<int>(rng() % 2);
  auto deadline = std::chrono::steady_clock::now() + 20s;
  Seen s;
  std::vector<pid_t> workers;
  while (std::chrono::steady_clock::now() < deadline) {
    s = look(experiment);
    if (static_cast<int>(s.committed.size()) >= min_committed) {
      if (workers.empty()) {
        for (int rank = 0; rank < 2; ++rank) {
          auto p = read_pid(dir.path() / "pids" / fmt::format("rank-{}", rank));
          if (p) workers.push_back(*p);
        }
      }
      if (!during_upload || s.uploading) break;
    }
    std::this_thread::sleep_for(1ms);
  }
  if (!during_upload) {
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 80));
    s = look(experiment);
  }
  ASSERT_EQ(::kill(driver, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(driver, &status, 0), driver);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the driver finished before it was killed";
  if (during_upload) {
    ASSERT_TRUE(s.uploading) << "no upload was caught in progress";
  }
  // The workers die with their driver; none is left running.
  for (pid_t w : workers)
    EXPECT_TRUE(testing::wait_gone(w, 5s)) << "worker " << w << " outlived the driver";
  ASSERT_GE(s.committed.size(), 2u) << "the driver made no progress in 20 s";

  // Nothing committed before the kill is lost.
  ExperimentListing before = read_experiment(experiment.string());
  std::set<std::string> kept;
  for (auto& c : before.checkpoints) kept.insert(c.name);
  EXPECT_EQ(expect_all_verify(experiment.string()), before.checkpoints.size());
  ASSERT_FALSE(before.checkpoints.empty());
  const std::string latest_before = before.checkpoints.back().name;
  EXPECT_TRUE(kept.count(*s.committed.rbegin())) << "the latest committed was lost";
  const int latest_epoch = std::stoi(slurp(experiment / latest_before / "epoch.txt"));
  uint64_t max_index_before = before.checkpoints.back().index;

  // The history read back holds the rounds released before the kill (all but
  // perhaps one whose checkpoint was committed just before it); a line torn
  // by the kill (made certain here) is ignored, then dropped.
  const size_t history_before = Result::from_path(experiment.string()).metrics_history.size();
  EXPECT_GE(history_before + 1, s.committed.size());
  {
    std::ofstream torn(experiment / "result.json", std::ios::app);
    torn << "{\"epoch\": 99, \"trai";
  }
  EXPECT_EQ(Result::from_path(experiment.string()).metrics_history.size(), history_before);

  ASSERT_TRUE(Trainer::can_restore(experiment.string()));
  nlohmann::json fast = slow;
  fast["sleep_ms"] = 0;
  fast["extra_files"] = 0;
  const int final_epoch = latest_epoch + 3;  // a few more epochs are enough to show it continues
  fast["epochs"] = final_epoch + 1;
  fs::remove_all(dir.path() / "pids");
  fs::create_directories(dir.path() / "pids");
  auto scratch_dirs = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir.path() / "tmp")) {
      names.push_back(e.path().filename().string());
    }
    return names;
  };
  EXPECT_EQ(scratch_dirs().size(), 1u) << "the killed driver's scratch folder";
  const char* old_tmpdir = std::getenv("TMPDIR");
  const std::string saved_tmpdir = old_tmpdir ? old_tmpdir : "";
  ::setenv("TMPDIR", (dir.path() / "tmp").c_str(), 1);
  Result r = Trainer::restore(experiment.string(), sharded_loop, fast).fit();
  if (old_tmpdir) {
    ::setenv("TMPDIR", saved_tmpdir.c_str(), 1);
  } else {
    ::unsetenv("TMPDIR");
  }
  // The restored driver removed the dead driver's scratch folder, and its own.
  EXPECT_TRUE(scratch_dirs().empty()) << fmt::format("{}", fmt::join(scratch_dirs(), ", "));
  ASSERT_FALSE(r.error) << *r.error;
  EXPECT_EQ(r.metrics["epoch"], final_epoch);
  // It continued from the latest checkpoint...
  std::string resumed;
  for (auto& e : fs::directory_iterator(dir.path() / "pids")) {
    if (e.path().filename().string().rfind("resumed-0-", 0) == 0) resumed = slurp(e.path());
  }
  EXPECT_EQ(resumed, std::to_string(latest_epoch));
  // ...and kept its history and retention: new checkpoints continue the
  // numbering, and num_to_keep=3 still holds.
  ExperimentListing after = read_experiment(experiment.string());
  EXPECT_EQ(after.checkpoints.size(), 3u);
  EXPECT_EQ(after.config.num_to_keep, 3);
  EXPECT_GT(after.checkpoints.back().index, max_index_before);
  EXPECT_TRUE(after.uncommitted.empty());
  EXPECT_EQ(expect_all_verify(experiment.string()), 3u);
  // The restored run's rounds continue the history's iteration count.
  ASSERT_GT(r.metrics_history.size(), history_before);
  for (size_t i = 0; i < r.metrics_history.size(); ++i) {
    EXPECT_EQ(r.metrics_history[i]["training_iteration"], i + 1);
  }
  EXPECT_EQ(r.metrics_history.back()["epoch"], final_epoch);
  EXPECT_EQ(Result::from_path(experiment.string()).metrics_history, r.metrics_history);
  auto state = nlohmann::json::parse(slurp(experiment / "trainer_state.json"));
  EXPECT_EQ(state["driver_starts"], 2);
  EXPECT_EQ(state["status"], "finished");
  expect_no_children();
}

TEST(TrainCrash, DriverKilledAtARandomMomentThenRestoreContinuesWithItsHistory) {
  const unsigned seed = static_cast<unsigned>(std::random_device{}());
  SCOPED_TRACE(fmt::format("seed {}", seed));
  kill_driver_then_restore(/*during_upload=*/false, seed);
}

TEST(TrainCrash, DriverKilledDuringACheckpointUploadThenRestoreContinues) {
  const unsigned seed = static_cast<unsigned>(std::random_device{}());
  SCOPED_TRACE(fmt::format("seed {}", seed));
  kill_driver_then_restore(/*during_upload=*/true, seed);
}

TEST(TrainCrash, DriverKilledDuringAnAsynchronousUploadThenRestoreContinues) {
  const unsigned seed = static_cast<unsigned>(std::random_device{}());
  SCOPED_TRACE(fmt::format("seed {}", seed));
  kill_driver_then_restore(/*during_upload=*/true, seed, /*async=*/true);
}

TEST(TrainCrash, CanRestoreIsFalseWhereNoTrainerRan) {
  TempDir dir;
  EXPECT_FALSE(Trainer::can_restore(dir.str()));
  EXPECT_FALSE(Trainer::can_restore((dir.path() / "missing").string()));
  EXPECT_THROW(Trainer::restore(dir.str(), [](const nlohmann::json&) {}), Error);
}

}  // namespace
}  // namespace cairn
