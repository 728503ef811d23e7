// Where a Trainer's experiment lives and which experiment a run continues:
// restore of a moved experiment, experiment names, runs on an existing name,
// "~" in storage paths, default names, and damaged trainer state files.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <set>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cairn/error.h"
#include "cairn/train.h"
#include "experiment/location.h"
#include "support/env.h"
#include "support/temp_dir.h"
#include "train/control/driver.h"
#include "train/train_support.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;
using testing::expect_all_verify;
using testing::expect_no_children;
using testing::ScopedEnv;
using testing::slurp;
using testing::TempDir;
using testing::write_file;

RunConfig run_in(const fs::path& storage, std::string name = "exp") {
  RunConfig r;
  r.name = std::move(name);
  r.storage_path = storage.string();
  return r;
}

// Rank 0 checkpoints every epoch and records, in config["log"], where it
// resumed from and which experiment it ran in. Fails at config["fail_at"].
void logged_loop(const nlohmann::json& config) {
  const TrainContext& ctx = train::get_context();
  int start = 0;
  if (auto ckpt = train::get_checkpoint()) {
    start = std::stoi(slurp(ckpt->as_directory().path() / "epoch.txt")) + 1;
  }
  if (ctx.world_rank == 0 && config.contains("log")) {
    write_file(config["log"].get<std::string>(),
               nlohmann::json{{"start", start},
                              {"name", ctx.experiment_name},
                              {"storage_path", ctx.storage_path},
                              {"experiment_path", ctx.experiment_path}}
                   .dump());
  }
  for (int epoch = start; epoch < config.at("epochs").get<int>(); ++epoch) {
    if (epoch == config.value("fail_at", -1)) throw std::runtime_error("intentional failure");
    train::TemporaryDirectory tmp;
    std::optional<Checkpoint> ckpt;
    if (ctx.world_rank == 0) {
      write_file(fs::path(tmp.path()) / "epoch.txt", std::to_string(epoch));
      ckpt = Checkpoint::from_directory(tmp.path());
    }
    train::report({{"epoch", epoch}}, ckpt);
  }
}

// Sets an environment variable for the scope of a test.

// ------------------------------------------------------------ restore(path)

TEST(TrainExperiment, RestoreContinuesTheExperimentAtPathAfterItWasMoved) {
  TempDir dir;
  Result first = Trainer(logged_loop, {{"epochs", 5}, {"fail_at", 2}},
                         ScalingConfig{.num_workers = 2}, run_in(dir / "old"))
                     .fit();
  ASSERT_TRUE(first.error) << "the first run stops at epoch 2";
  fs::create_directories(dir / "new");
  fs::rename(dir / "old" / "exp", dir / "new" / "moved");
  fs::remove_all(dir / "old");

  const fs::path moved = dir / "new" / "moved";
  ASSERT_TRUE(Trainer::can_restore(moved.string()));
  Trainer t = Trainer::restore(moved.string(), logged_loop,
                               nlohmann::json{{"epochs", 5}, {"log", (dir / "log").string()}});
  EXPECT_EQ(t.run_config().name, "moved");
  EXPECT_EQ(t.run_config().storage_path, (dir / "new").string());
  Result r = t.fit();
  ASSERT_FALSE(r.error) << *r.error;
  auto log = nlohmann::json::parse(slurp(dir / "log"));
  EXPECT_EQ(log["start"], 2) << "resumed from the moved experiment's epoch 1";
  EXPECT_EQ(log["name"], "moved");
  EXPECT_EQ(log["experiment_path"], moved.string());
  EXPECT_EQ(r.path, moved.string());
  EXPECT_FALSE(fs::exists(dir / "old")) << "nothing is written at the old location";
  EXPECT_EQ(expect_all_verify(moved.string()), 5u) << "epochs 0-1 moved, 2-4 added";
  auto state = nlohmann::json::parse(slurp(moved / "trainer_state.json"));
  EXPECT_EQ(state["name"], "moved");
  EXPECT_EQ(state["storage_path"], (dir / "new").string());
  expect_no_children();
}

// ----------------------------------------------------------------- names

TEST(TrainExperiment, NameMustBeOneFolderNameAndTheErrorNamesTheField) {
  TempDir dir;
  auto fn = [](const nlohmann::json&) {};
  for (const std::string& name :
       {std::string("exp/checkpoint_000005"), std::string("a/b"), std::string("/abs"),
        std::string("."), std::string(".."), std::string("a\\b"), std::string("a\0b", 3)}) {
    SCOPED_TRACE(name);
    try {
      Trainer(fn, {}, ScalingConfig{}, run_in(dir.path(), name));
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("RunConfig::name"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

TEST(TrainExperiment, StoragePathThatIsAnExperimentIsRefusedAndTheExperimentKept) {
  TempDir dir;
  Result exp =
      Trainer(logged_loop, {{"epochs", 2}}, ScalingConfig{}, run_in(dir.path(), "exp")).fit();
  ASSERT_FALSE(exp.error) << *exp.error;
  auto fn = [](const nlohmann::json&) {};
  try {
    Trainer(fn, {}, ScalingConfig{}, run_in(dir / "exp", "checkpoint_000005")).fit();
    FAIL() << "a run nested inside an experiment was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("RunConfig::storage_path"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir / "exp" / "checkpoint_000005"));
  EXPECT_EQ(expect_all_verify((dir / "exp").string()), 2u);
}

// ------------------------------------------------- a new run on an old name

TEST(TrainExperiment, FitOnAnExistingExperimentFailsPointingToRestoreAndChangesNothing) {
  TempDir dir;
  RunConfig run = run_in(dir.path());
  run.checkpoint_config.num_to_keep = 5;
  Result old = Trainer(logged_loop, {{"epochs", 3}}, ScalingConfig{}, run).fit();
  ASSERT_FALSE(old.error) << *old.error;
  const std::string state_before = slurp(dir / "exp" / "trainer_state.json");

  // A new run with a smaller num_to_keep must not apply it to the old run.
  RunConfig again = run_in(dir.path());
  again.checkpoint_config.num_to_keep = 1;
  again.failure_config.max_failures = 1;
  auto fails = [](const nlohmann::json&) { throw std::runtime_error("worker failure"); };
  try {
    Trainer(fails, {}, ScalingConfig{}, again).fit();
    FAIL() << "a new run mixed itself into an existing experiment";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kAlreadyExists) << e.what();
    EXPECT_NE(std::string(e.what()).find("Trainer::restore"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("RunConfig::resume_existing"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(slurp(dir / "exp" / "trainer_state.json"), state_before);
  EXPECT_EQ(expect_all_verify((dir / "exp").string()), 3u);

  // Checkpoints alone (a CheckpointManager's experiment) count as well.
  {
    CheckpointManager m((dir / "plain").string(), {});
    write_file(dir / "src" / "f", "x");
    m.register_checkpoint({}, Checkpoint::from_directory((dir / "src").string()));
  }
  try {
    Trainer(fails, {}, ScalingConfig{}, run_in(dir.path(), "plain")).fit();
    FAIL() << "a new run mixed itself into a checkpoint manager's experiment";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kAlreadyExists) << e.what();
  }
  expect_no_children();
}

TEST(TrainExperiment, ResumeExistingContinuesAnExperimentOrStartsANewOne) {
  TempDir dir;
  RunConfig run = run_in(dir.path());
  run.resume_existing = true;
  const nlohmann::json config = {{"epochs", 2}, {"log", (dir / "log").string()}};
  Result first = Trainer(logged_loop, config, ScalingConfig{.num_workers = 2}, run).fit();
  ASSERT_FALSE(first.error) << *first.error;
  EXPECT_EQ(nlohmann::json::parse(slurp(dir / "log"))["start"], 0) << "nothing to resume";

  nlohmann::json more = config;
  more["epochs"] = 4;
  Result second = Trainer(logged_loop, more, ScalingConfig{.num_workers = 2}, run).fit();
  ASSERT_FALSE(second.error) << *second.error;
  EXPECT_EQ(nlohmann::json::parse(slurp(dir / "log"))["start"], 2) << "continued after epoch 1";
  ExperimentListing l = read_experiment(second.path);
  ASSERT_EQ(l.checkpoints.size(), 4u);
  EXPECT_EQ(l.checkpoints.back().name, "checkpoint_000003") << "numbering continues";
  auto state = nlohmann::json::parse(slurp(dir / "exp" / "trainer_state.json"));
  EXPECT_EQ(state["driver_starts"], 2);
  expect_no_children();
}

// --------------------------------------------------------------- "~" paths

TEST(TrainExperiment, TildeInStoragePathIsTheHomeDirectory) {
  TempDir dir;
  fs::create_directories(dir / "home");
  fs::create_directories(dir / "cwd");
  ScopedEnv home("HOME", (dir / "home").string());
  const fs::path cwd = fs::current_path();
  fs::current_path(dir / "cwd");
  auto fn = [](const nlohmann::json&) { train::report({{"x", 1}}); };
  Result a = Trainer(fn, {}, ScalingConfig{}, run_in("~/results", "a")).fit();
  Result b, c;
  {
    ScopedEnv storage("CAIRN_STORAGE_PATH", "~/from_env");
    b = Trainer(fn, {}, ScalingConfig{}, run_in("", "b")).fit();
  }
  {
    ScopedEnv storage("CAIRN_STORAGE_PATH", "");
    c = Trainer(fn, {}, ScalingConfig{}, run_in("", "c")).fit();
  }
  fs::current_path(cwd);
  EXPECT_EQ(a.path, (dir / "home" / "results" / "a").string());
  EXPECT_EQ(b.path, (dir / "home" / "from_env" / "b").string());
  EXPECT_EQ(c.path, (dir / "home" / "cairn_results" / "c").string());
  EXPECT_TRUE(fs::is_empty(dir / "cwd")) << "no literal ./~ folder";
  for (const auto& r : {a, b, c}) EXPECT_TRUE(Trainer::can_restore(r.path)) << r.path;
  EXPECT_TRUE(Trainer::can_restore("~/results/a"));
  EXPECT_EQ(Trainer::restore("~/results/a", fn).run_config().storage_path,
            (dir / "home" / "results").string());
}

// ------------------------------------------------------------ default names

TEST(TrainExperiment, DefaultNameHasSubSecondTimeAndARandomSuffix) {
  using namespace std::chrono;
  const auto t = system_clock::time_point(seconds(1714564800)) + microseconds(123456);
  const std::string a = experiment::default_run_name(t, 0x1a2b3c);
  EXPECT_TRUE(std::regex_match(
      a, std::regex(R"(cairn_train_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d\.123456_1a2b3c)")))
      << a;
  EXPECT_NE(experiment::default_run_name(t, 0x1a2b3d), a) << "same microsecond, other draw";
  EXPECT_NE(experiment::default_run_name(t + microseconds(1), 0x1a2b3c), a);
  experiment::check_experiment_name(a, "a default name");
}

TEST(TrainExperiment, DefaultNamesOfConcurrentAndBackToBackFitsDiffer) {
  TempDir dir;
  auto fn = [](const nlohmann::json&) { train::report({{"x", 1}}); };
  RunConfig run = run_in(dir.path(), "");
  // Back to back, in one process.
  Result a = Trainer(fn, {}, ScalingConfig{}, run).fit();
  Result b = Trainer(fn, {}, ScalingConfig{}, run).fit();
  ASSERT_FALSE(a.error) << *a.error;
  ASSERT_FALSE(b.error) << *b.error;
  EXPECT_NE(a.path, b.path);
  // Four drivers started at once.
  std::vector<pid_t> drivers;
  for (int i = 0; i < 4; ++i) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int status = 1;
      try {
        status = Trainer(fn, {}, ScalingConfig{}, run).fit().error ? 2 : 0;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "driver %d: %s\n", i, e.what());
        status = 3;
      }
      ::_exit(status);
    }
    drivers.push_back(pid);
  }
  for (pid_t pid : drivers) {
    int status = -1;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  }
  std::set<std::string> finished;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    Result r = Result::from_path(e.path().string());
    if (!r.error && r.checkpoint == std::nullopt && r.metrics["x"] == 1) {
      finished.insert(e.path().filename().string());
    }
  }
  EXPECT_EQ(finished.size(), 6u) << "six runs, six experiment folders";
  expect_no_children();
}

// --------------------------------------------------- damaged trainer state

TEST(TrainExperiment, DeeplyNestedTrainerStateIsCorruptionNotACrash) {
  TempDir dir;
  const fs::path exp = dir / "exp";
  write_file(exp / "trainer_state.json", std::string(100000, '[') + std::string(100000, ']'));
  auto expect_corruption = [&](auto&& call, const char* what) {
    try {
      call();
      ADD_FAILURE() << what << " accepted a state nested 100,000 levels deep";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCorruption) << what << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("trainer_state.json"), std::string::npos) << e.what();
    }
  };
  expect_corruption([&] { Trainer::can_restore(exp.string()); }, "can_restore");
  expect_corruption([&] { Trainer::restore(exp.string(), [](const nlohmann::json&) {}); },
                    "restore");
  expect_corruption([&] { Result::from_path(exp.string()); }, "Result::from_path");
}

TEST(TrainExperiment, TrainerStateWithAFieldOfTheWrongTypeIsCorruption) {
  TempDir dir;
  const fs::path exp = dir / "exp";
  write_file(exp / "trainer_state.json",
             R"({"format": "cairn-trainer-state", "version": 1, "num_workers": "two"})");
  try {
    Trainer::restore(exp.string(), [](const nlohmann::json&) {});
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruption) << e.what();
    EXPECT_NE(std::string(e.what()).find("num_workers"), std::string::npos) << e.what();
  }
  write_file(exp / "trainer_state.json", "not json");
  EXPECT_THROW(Trainer::can_restore(exp.string()), Error) << "damage is reported, not hidden";
}

}  // namespace
}  // namespace cairn
