// The Tuner's driver killed by SIGKILL at random moments, then restored:
// every trial finishes, the saved state never names a missing checkpoint,
// and no trial that had a checkpoint starts again from scratch. Also PBT
// with num_to_keep = 1: a clone always resumes from an intact copy.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cairn/manager.h"
#include "cairn/storage.h"
#include "cairn/tuner.h"
#include "manager/memory_tier.h"
#include "support/temp_dir.h"
#include "train/train_support.h"
#include "tune/trial_runner.h"

namespace cairn::tune {
namespace {

namespace fs = std::filesystem;
using testing::slurp;
using testing::TempDir;
using testing::write_file;

// A trial's checkpoints in either tier (this host's memory tier, when the
// run has one, and persistent storage).
ExperimentListing trial_checkpoints(const std::string& path) {
  ExperimentListing listing = read_experiment(path);
  merge_memory_tier(open_storage(path)->uri(), listing);
  return listing;
}

void append_line(const fs::path& p, const std::string& line) {
  std::ofstream out(p, std::ios::app);
  out << line << "\n";
}

// Counts to config["iters"], a checkpoint every step (num_to_keep = 1 in the
// tests), sleeping a little so that kills land in every phase. Writes a
// violation next to the experiment when it starts from scratch although its
// trial has a committed checkpoint.
void slow_counter(const nlohmann::json& config) {
  const TrainContext& ctx = train::get_context();
  int start = 0;
  std::optional<Checkpoint> c = train::get_checkpoint();
  if (c) {
    start = std::stoi(slurp(c->as_directory().path() / "step.txt"));
  } else if (!trial_checkpoints(ctx.experiment_path).checkpoints.empty()) {
    append_line(fs::path(ctx.storage_path).parent_path() / "violations.txt",
                ctx.experiment_name + " started from scratch with a checkpoint");
  }
  for (int step = start + 1; step <= config.at("iters").get<int>(); ++step) {
    std::this_thread::sleep_for(std::chrono::milliseconds(config.value("sleep_ms", 40)));
    train::TemporaryDirectory tmp;
    write_file(fs::path(tmp.path()) / "step.txt", std::to_string(step));
    train::report({{"step", step}, {"score", config.at("x").get<double>() * step}},
                  Checkpoint::from_directory(tmp.path()));
  }
}

// Trials save into memory tiers under `root` (created), every
// `persist_every_n`-th checkpoint persisted (0: only when a runner ends).
void in_memory_tier(RunConfig& r, const fs::path& root, int persist_every_n) {
  r.checkpoint_config.memory_tier.enabled = true;
  r.checkpoint_config.memory_tier.root = root.string();
  r.checkpoint_config.memory_tier.persist_every_n = persist_every_n;
  fs::create_directories(root);
}

// With `tier_root`, trials save into a memory tier there, every 3rd
// checkpoint persisted: most kills leave a trial's newest in memory only.
RunConfig run_config(const fs::path& storage, const fs::path& tier_root = {}) {
  RunConfig r;
  r.name = "crashy";
  r.storage_path = storage.string();
  r.checkpoint_config.num_to_keep = 1;
  if (!tier_root.empty()) in_memory_tier(r, tier_root, 3);
  r.failure_config.max_failures = 3;
  return r;
}

// The memory tiers (one per trial) held under `root`.
size_t tiers_under(const fs::path& root) {
  size_t n = 0;
  std::error_code ec;
  for (const auto& user : fs::directory_iterator(root, ec)) {
    for ([[maybe_unused]] const auto& tier : fs::directory_iterator(user.path())) ++n;
  }
  return n;
}

// Runs fit() (or restore + fit) in a child process leading its own process
// group; returns its pid. Both sides make the child lead its group, so the
// group exists before either goes on: set by the child alone, a kill that
// came before the child ran (a few ms under load) found no group and left
// the whole driver running.
pid_t spawn_driver(const fs::path& storage, bool restore, const fs::path& tier_root = {}) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid != 0) {
    ::setpgid(pid, pid);  // ignore-error: EACCES/ESRCH mean the child did it or died
    return pid;
  }
  ::setpgid(0, 0);
  // Saved often, so that the state names the trials and their checkpoints
  // at most kills (the automatic period, 1 s at least, would outlive most
  // drivers here), while retention deletes one every 40 ms per trial.
  ::setenv("CAIRN_TUNE_STATE_PERIOD_S", "0.05", 1);
  int code = 1;
  try {
    const std::string path = (storage / "crashy").string();
    TuneConfig tc;
    tc.metric = "score";
    tc.mode = "max";
    tc.max_concurrent_trials = 2;
    ResultGrid grid =
        restore && Tuner::can_restore(path)
            ? Tuner::restore(path, slow_counter).fit()
            : Tuner(slow_counter, {{"x", grid_search({1.0, 2.0, 3.0, 4.0, 5.0})}, {"iters", 60}},
                    tc, run_config(storage, tier_root))
                  .fit();
    code = grid.num_terminated() == grid.size() && grid.size() == 5 ? 0 : 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "driver: %s\n", e.what());
    code = 2;
  }
  std::fflush(nullptr);
  ::_exit(code);
}

// Kills the driver's process group and waits until every process it
// started is gone: the test is a child subreaper (see the test), so the
// orphaned runners and workers become its children, reaped here.
// Workers lead groups of their own and die by their death signal once their
// runner is gone, so the wait is bounded generously for a loaded machine.
void kill_group(pid_t pid) {
  if (::kill(-pid, SIGKILL) != 0 && errno != ESRCH) {
    ADD_FAILURE() << "kill(-" << pid << "): " << std::strerror(errno);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    const pid_t r = ::waitpid(-1, nullptr, WNOHANG);
    if (r < 0 && errno == ECHILD) return;
    if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ADD_FAILURE() << "processes of the killed driver are still running after 30 s";
}

// Whether `state_file` was written after `before` (or newly) and names a
// checkpoint of some trial.
bool names_a_checkpoint_since(const fs::path& state_file, fs::file_time_type before) {
  std::error_code ec;
  const auto now = fs::last_write_time(state_file, ec);
  if (ec || now == before) return false;
  try {
    const nlohmann::json s = nlohmann::json::parse(slurp(state_file));
    for (const auto& t : s.at("trials")) {
      if (!t.at("checkpoints").empty() || t.at("latest_checkpoint").is_string()) return true;
    }
  } catch (const std::exception&) {
    // ignore-error: not there yet, or being replaced; asked again shortly
  }
  return false;
}

// Every checkpoint the saved state names exists, committed, in its trial.
// Returns how many it checked.
size_t expect_state_references_exist(const fs::path& experiment, int round) {
  size_t checked = 0;
  if (!fs::exists(experiment / "tuner_state.json")) return 0;
  const nlohmann::json s = nlohmann::json::parse(slurp(experiment / "tuner_state.json"));
  for (const auto& t : s.at("trials")) {
    std::vector<std::string> names = t.at("checkpoints").get<std::vector<std::string>>();
    if (t.at("latest_checkpoint").is_string()) names.push_back(t["latest_checkpoint"]);
    const fs::path trial = experiment / t.at("dir").get<std::string>();
    std::set<std::string> committed;
    if (fs::exists(trial)) {
      for (const auto& r : trial_checkpoints(trial.string()).checkpoints) committed.insert(r.name);
    }
    for (const auto& name : names) {
      EXPECT_TRUE(committed.count(name))
          << "after kill " << round << ": the state names " << t.at("dir") << "/" << name
          << ", which is not a committed checkpoint in either tier";
      ++checked;
    }
  }
  return checked;
}

// Kills the Tuner's driver `kKills` times at random moments, restoring it
// each time, then lets the last restore run to the end. With `tier_root`,
// the trials save into memory tiers there.
void kill_and_restore_until_the_end(const fs::path& dir, const int kKills,
                                    const fs::path& tier_root = {}) {
  // Orphans of a killed driver are reparented here, not to init, so that
  // kill_group can wait for them (init may reap zombies only now and then).
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  const fs::path storage = dir / "results";
  fs::create_directories(storage);
  const fs::path experiment = storage / "crashy";
  std::mt19937 rng(20261125);
  int kills = 0;
  size_t checked = 0;  // checkpoint names in the states left by the kills
  for (int round = 0; round < kKills; ++round) {
    const fs::path state_file = experiment / "tuner_state.json";
    std::error_code ec;
    const auto saved_before = fs::last_write_time(state_file, ec);
    const pid_t pid = spawn_driver(storage, round > 0, tier_root);
    if (round % 2 == 1) {
      // Odd rounds wait (bounded) until this driver has saved a state that
      // names a checkpoint, however slow the machine (sanitizers), so that
      // the kills check what such states name; even rounds kill at any
      // moment, start-up included.
      for (int i = 0; i < 3000 && !names_a_checkpoint_since(state_file, saved_before); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    // At most 50 x 150 ms of progress after those waits before the last
    // kill: well under the experiment's 3 waves x 60 steps x 40 ms.
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 150));
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      // It finished before the kill: the experiment is done.
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "round " << round;
      kill_group(pid);
      break;
    }
    kill_group(pid);
    ++kills;
    checked += expect_state_references_exist(experiment, round);
    ASSERT_FALSE(::testing::Test::HasFailure());
  }
  // The last restore runs to the end.
  const pid_t pid = spawn_driver(storage, true, tier_root);
  int status = 0;
  ::waitpid(pid, &status, 0);
  kill_group(pid);
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
  ASSERT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(kills, kKills) << "the experiment finished before every kill landed";
  EXPECT_GE(checked, static_cast<size_t>(kKills / 2))
      << "the killed drivers' states named too few checkpoints to check";
  EXPECT_FALSE(fs::exists(dir / "violations.txt")) << slurp(dir / "violations.txt");
  const nlohmann::json s = nlohmann::json::parse(slurp(experiment / "tuner_state.json"));
  ASSERT_EQ(s.at("trials").size(), 5u);
  for (const auto& t : s.at("trials")) {
    EXPECT_EQ(t.at("status"), "TERMINATED") << t.at("trial_id");
    const fs::path trial = experiment / t.at("dir").get<std::string>();
    ExperimentListing listing = read_experiment(trial.string());
    ASSERT_FALSE(listing.checkpoints.empty());
    EXPECT_EQ(slurp(listing.checkpoints.back().checkpoint.as_directory().path() / "step.txt"),
              "60");
    testing::expect_all_verify(trial.string());
  }
  expect_state_references_exist(experiment, kKills);
  // Every trial's newest checkpoint is persisted (read from persistent
  // storage above) and no trial's memory is left.
  if (!tier_root.empty()) {
    EXPECT_EQ(tiers_under(tier_root), 0u);
  }
}

TEST(TunerCrash, DriverKilledAtRandomMomentsIsRestoredUntilEveryTrialFinishes) {
  TempDir dir;
  kill_and_restore_until_the_end(dir.path(), 50);
}

// The same with the trials' checkpoints in memory tiers, every 3rd
// persisted: a killed driver's runners leave their tiers, the restore
// resumes each trial from its newest checkpoint in memory, and the state
// never names a checkpoint neither tier holds.
TEST(TunerCrash, TrialsInTheMemoryTierSurviveTheirDriversKillsAndEndPersisted) {
  TempDir dir;
  kill_and_restore_until_the_end(dir.path(), 25, dir / "shm");
}

// PBT's trainable: value grows by lr each step; the checkpoint holds value
// and a check (value * 7) that a torn or foreign copy would break.
void pbt_trainable(const nlohmann::json& config) {
  double value = 0;
  int step = 0;
  if (auto c = train::get_checkpoint()) {
    const std::string text = slurp(c->as_directory().path() / "state.json");
    const nlohmann::json st = nlohmann::json::parse(text);
    value = st.at("value").get<double>();
    step = st.at("step").get<int>();
    if (st.at("check").get<double>() != value * 7) {
      throw std::runtime_error("checkpoint state does not check: " + text);
    }
  }
  const double lr = config.at("lr").get<double>();
  while (step < 12) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ++step;
    value += lr;
    train::TemporaryDirectory tmp;
    write_file(fs::path(tmp.path()) / "state.json",
               nlohmann::json({{"value", value}, {"step", step}, {"check", value * 7}}).dump());
    train::report({{"score", value}, {"lr", lr}}, Checkpoint::from_directory(tmp.path()));
  }
}

// Kills its own driver at the n-th trial start or the n-th result.
struct KillAt : Callback {
  KillAt(int starts, int results) : starts_left(starts), results_left(results) {}
  int starts_left;
  int results_left;
  void on_trial_start(const TrialInfo&) override {
    if (--starts_left == 0) ::raise(SIGKILL);
  }
  void on_trial_result(const TrialInfo&, nlohmann::json&) override {
    if (--results_left == 0) ::raise(SIGKILL);
  }
};

TuneConfig pbt_config(std::shared_ptr<Callback> callback) {
  TuneConfig tc;
  tc.metric = "score";
  tc.mode = "max";
  tc.max_concurrent_trials = 2;
  PBTOptions o;
  o.perturbation_interval = 2;
  o.quantile_fraction = 0.5;
  o.resample_probability = 0.5;
  o.hyperparam_mutations = {{"lr", uniform(0.1, 10.0)}};
  o.seed = 11;
  tc.scheduler = std::make_shared<PopulationBasedTraining>(o);
  if (callback) tc.callbacks = {callback};
  return tc;
}

TEST(TunerPbt, ClonesResumeFromIntactCopiesEvenWithNumToKeepOne) {
  TempDir dir;
  RunConfig run;
  run.name = "pbt";
  run.storage_path = dir.str();
  run.checkpoint_config.num_to_keep = 1;  // every commit deletes the previous checkpoint
  TuneConfig tc = pbt_config(nullptr);
  tc.max_concurrent_trials = 4;
  Tuner tuner(pbt_trainable, {{"lr", grid_search({0.1, 0.2, 5.0, 8.0})}}, tc, run);
  ResultGrid grid = tuner.fit();
  ASSERT_EQ(grid.size(), 4u);
  EXPECT_EQ(grid.num_errors(), 0u);
  size_t cloned = 0;
  for (const auto& r : grid) {
    EXPECT_EQ(r.status, TrialStatus::kTerminated) << r.trial_id;
    std::set<double> lrs;
    for (const auto& row : r.metrics_history) lrs.insert(row.at("lr").get<double>());
    cloned += lrs.size() > 1 ? 1 : 0;
    testing::expect_all_verify((dir / "pbt" / r.trial_id).string());
  }
  EXPECT_GE(cloned, 1u) << "no trial was ever cloned";
  // No pending copy is left behind.
  const fs::path clones = dir / "pbt" / ".cairn_clones";
  EXPECT_TRUE(!fs::exists(clones) || fs::is_empty(clones));
}

// The trials' checkpoints in memory, persisted only when a runner ends:
// the first exploits copy a running source's newest checkpoint, which only
// its memory tier holds (with persistent storage alone there would be
// nothing to clone), and every trial ends with its newest persisted and
// its memory freed.
TEST(TunerPbt, ClonesAreCopiedFromTheSourcesMemoryTier) {
  TempDir dir;
  RunConfig run;
  run.name = "pbt";
  run.storage_path = dir.str();
  run.checkpoint_config.num_to_keep = 1;
  in_memory_tier(run, dir / "shm", 0);
  TuneConfig tc = pbt_config(nullptr);
  tc.max_concurrent_trials = 4;
  ResultGrid grid =
      Tuner(pbt_trainable, {{"lr", grid_search({0.1, 0.2, 5.0, 8.0})}}, tc, run).fit();
  ASSERT_EQ(grid.size(), 4u);
  size_t cloned = 0;
  for (const auto& r : grid) {
    EXPECT_EQ(r.status, TrialStatus::kTerminated) << r.trial_id << " " << r.error.value_or("");
    std::set<double> lrs;
    for (const auto& row : r.metrics_history) lrs.insert(row.at("lr").get<double>());
    cloned += lrs.size() > 1 ? 1 : 0;
    const fs::path trial = dir / "pbt" / r.trial_id;
    ExperimentListing listing = read_experiment(trial.string());
    ASSERT_FALSE(listing.checkpoints.empty()) << r.trial_id;
    const nlohmann::json st = nlohmann::json::parse(
        slurp(listing.checkpoints.back().checkpoint.as_directory().path() / "state.json"));
    EXPECT_EQ(st.at("step"), 12) << r.trial_id;
    testing::expect_all_verify(trial.string());
  }
  EXPECT_GE(cloned, 1u) << "no trial was ever cloned";
  EXPECT_EQ(tiers_under(dir / "shm"), 0u);
  const fs::path clones = dir / "pbt" / ".cairn_clones";
  EXPECT_TRUE(!fs::exists(clones) || fs::is_empty(clones));
}

// PBT over a class trainable: value grows by lr each step. With
// config["reuse"], reset_config() adopts the new config in place; without,
// the instance is replaced. Either way the trial stays in its process.
class Grower : public Trainable {
 public:
  void setup(const nlohmann::json& config) override {
    lr_ = config.at("lr").get<double>();
    reuse_ = config.value("reuse", false);
    ++setups_;
  }
  nlohmann::json step() override {
    std::this_thread::sleep_for(std::chrono::milliseconds(15));
    ++step_;
    value_ += lr_;
    return {{"score", value_},    {"lr", lr_},         {"step", step_},
            {"setups", setups_},  {"resets", resets_}, {"pid", static_cast<int>(::getpid())},
            {"done", step_ >= 12}};
  }
  void save_checkpoint(const std::string& dir) override {
    write_file(fs::path(dir) / "state.json",
               nlohmann::json({{"value", value_}, {"step", step_}, {"check", value_ * 7}}).dump());
  }
  void load_checkpoint(const std::string& dir) override {
    const nlohmann::json st = nlohmann::json::parse(slurp(fs::path(dir) / "state.json"));
    value_ = st.at("value").get<double>();
    step_ = st.at("step").get<int>();
    if (st.at("check").get<double>() != value_ * 7) throw std::runtime_error("torn checkpoint");
  }
  bool reset_config(const nlohmann::json& config) override {
    if (!reuse_) return false;
    lr_ = config.at("lr").get<double>();
    ++resets_;
    return true;
  }

 private:
  static inline int setups_ = 0;  // per process: counts replaced instances too
  double lr_ = 0;
  bool reuse_ = false;
  double value_ = 0;
  int step_ = 0;
  int resets_ = 0;
};

TEST(TunerPbt, ClassTrainablesTakeClonesInPlaceWithResetConfigOrAFreshInstance) {
  for (const bool reuse : {true, false}) {
    SCOPED_TRACE(reuse ? "reset_config adopts" : "reset_config declines");
    TempDir dir;
    RunConfig run;
    run.name = "inplace";
    run.storage_path = dir.str();
    run.checkpoint_config.num_to_keep = 1;
    run.checkpoint_config.checkpoint_frequency = 1;
    TuneConfig tc = pbt_config(nullptr);
    tc.max_concurrent_trials = 4;
    ResultGrid grid = Tuner([] { return std::make_unique<Grower>(); },
                            {{"lr", grid_search({0.1, 0.2, 5.0, 8.0})}, {"reuse", reuse}}, tc, run)
                          .fit();
    ASSERT_EQ(grid.size(), 4u);
    size_t in_place = 0;
    for (const auto& r : grid) {
      EXPECT_EQ(r.status, TrialStatus::kTerminated) << r.trial_id;
      std::set<int> pids;
      std::set<double> lrs;
      for (const auto& row : r.metrics_history) {
        pids.insert(row.at("pid").get<int>());
        lrs.insert(row.at("lr").get<double>());
      }
      EXPECT_EQ(pids.size(), 1u) << r.trial_id << ": a clone in place keeps the process";
      const nlohmann::json& last = r.metrics_history.back();
      if (lrs.size() > 1) {
        ++in_place;
        EXPECT_EQ(last.at(reuse ? "resets" : "setups").get<int>() > (reuse ? 0 : 1), true)
            << r.trial_id;
      }
      EXPECT_EQ(r.config.at("lr"), last.at("lr")) << r.trial_id;
      EXPECT_EQ(nlohmann::json::parse(slurp(dir / "inplace" / r.trial_id / "params.json")),
                r.config)
          << r.trial_id;
      testing::expect_all_verify((dir / "inplace" / r.trial_id).string());
    }
    EXPECT_GE(in_place, 1u) << "no trial was cloned";
    const fs::path clones = dir / "inplace" / ".cairn_clones";
    EXPECT_TRUE(!fs::exists(clones) || fs::is_empty(clones));
  }
}

// The driver killed as a clone restarts (right after the copy was committed
// into the trial) and at results around perturbations: restore finishes
// every trial, each to its last step, with nothing left in .cairn_clones.
// With `in_memory`, the trials save into memory tiers persisted only when a
// runner ends, so that the kills leave the newest checkpoints in memory.
void kill_around_clones_and_restore(bool in_memory) {
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);  // see kill_group
  const std::vector<std::pair<int, int>> kill_points = {{5, -1}, {6, -1},  {7, -1},
                                                        {-1, 9}, {-1, 14}, {-1, 23}};
  for (const auto& [starts, results] : kill_points) {
    SCOPED_TRACE(fmt::format("kill at start {} / result {}", starts, results));
    TempDir dir;
    RunConfig run;
    run.name = "pbt";
    run.storage_path = dir.str();
    run.checkpoint_config.num_to_keep = 1;
    if (in_memory) in_memory_tier(run, dir / "shm", 0);
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);  // and below: both sides, see spawn_driver
      Tuner(pbt_trainable, {{"lr", grid_search({0.1, 0.2, 5.0, 8.0})}},
            pbt_config(std::make_shared<KillAt>(starts, results)), run)
          .fit();
      ::_exit(0);
    }
    ::setpgid(pid, pid);  // ignore-error: EACCES/ESRCH mean the child did it or died
    int status = 0;
    ::waitpid(pid, &status, 0);
    kill_group(pid);  // its runners may be dying still, holding the lock
    const std::string path = (dir / "pbt").string();
    ResultGrid grid = Tuner::restore(path, pbt_trainable, {}, pbt_config(nullptr)).fit();
    ASSERT_EQ(grid.size(), 4u);
    for (const auto& r : grid) {
      EXPECT_EQ(r.status, TrialStatus::kTerminated) << r.trial_id;
      ExperimentListing listing = read_experiment((dir / "pbt" / r.trial_id).string());
      ASSERT_FALSE(listing.checkpoints.empty()) << r.trial_id;
      const nlohmann::json st = nlohmann::json::parse(
          slurp(listing.checkpoints.back().checkpoint.as_directory().path() / "state.json"));
      EXPECT_EQ(st.at("step"), 12) << r.trial_id;
    }
    const fs::path clones = dir / "pbt" / ".cairn_clones";
    EXPECT_TRUE(!fs::exists(clones) || fs::is_empty(clones));
    if (in_memory) {
      EXPECT_EQ(tiers_under(dir / "shm"), 0u);
    }
  }
}

TEST(TunerPbt, DriverKilledAroundClonesIsRestoredAndEveryTrialRunsToItsEnd) {
  kill_around_clones_and_restore(false);
}

TEST(TunerPbt, DriverKilledAroundClonesFromMemoryTiersIsRestoredAndEveryTrialRunsToItsEnd) {
  kill_around_clones_and_restore(true);
}

// The runner's death signal (PR_SET_PDEATHSIG) comes after the kernel closed
// the dead driver's end of the channel, so a runner waiting for the answer to
// a round can see the close first. The hook takes the signal away: the runner
// always sees the close, and must leave its trial resumable (not errored).
TEST(TunerCrash, ARunnerThatSeesItsDriverGoBeforeItsDeathSignalLeavesTheTrialResumable) {
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);  // the orphaned runner is reaped here
  TempDir dir;
  const fs::path storage = dir / "results";
  fs::create_directories(storage);
  const std::string experiment = (storage / "crashy").string();
  const nlohmann::json space = {{"x", 1.0}, {"iters", 6}, {"sleep_ms", 0}};
  tune_internal::runner_started_hook = [] { ::prctl(PR_SET_PDEATHSIG, 0); };
  std::fflush(nullptr);
  const pid_t driver = ::fork();
  if (driver == 0) {
    // Saves whenever something changed: the state knows the trial is RUNNING.
    ::setenv("CAIRN_TUNE_STATE_PERIOD_S", "0", 1);
    TuneConfig tc;
    tc.callbacks = {std::make_shared<KillAt>(0, 3)};  // while its runner waits for an answer
    try {
      Tuner(slow_counter, space, tc, run_config(storage)).fit();
    } catch (...) {
    }
    ::_exit(1);  // not reached: the callback kills the driver
  }
  tune_internal::runner_started_hook = nullptr;
  int status = 0;
  ASSERT_EQ(::waitpid(driver, &status, 0), driver);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
  // The runner (and its worker) outlive the driver until they see it gone.
  int reaped = 0;
  while (true) {
    const pid_t r = ::waitpid(-1, &status, 0);
    if (r > 0) ++reaped;
    if (r < 0 && errno != EINTR) break;
  }
  EXPECT_GE(reaped, 1) << "the runner died with the driver: the hook did not take effect";
  const nlohmann::json ts =
      nlohmann::json::parse(slurp(fs::path(experiment) / "trial_00000" / "trainer_state.json"));
  EXPECT_EQ(ts.at("status"), "running") << ts.dump(2);
  const nlohmann::json saved =
      nlohmann::json::parse(slurp(fs::path(experiment) / "tuner_state.json"));
  ASSERT_EQ(saved.at("trials").size(), 1u);
  EXPECT_EQ(saved.at("trials")[0].at("status"), "RUNNING");

  ResultGrid grid = Tuner::restore(experiment, slow_counter).fit();
  ASSERT_EQ(grid.size(), 1u);
  EXPECT_EQ(grid[0].status, TrialStatus::kTerminated) << grid[0].error.value_or("");
  EXPECT_EQ(grid[0].metrics.at("step"), 6);
  EXPECT_EQ(grid[0].metrics_history.size(), 6u) << "resumed from its checkpoint at step 3";
  testing::expect_no_children();
}

// Counts from 1, a checkpoint every 10th step and whenever
// should_checkpoint() says so (a preemption notice), logging each start and
// step to <log>/<trial>.txt. It ends at the first step at or past
// config["iters"] once <log>/may_finish exists: before that no trial ends on
// its own, however the machine's load spreads the trials' starts.
void preemptible_counter(const nlohmann::json& config) {
  const TrainContext& ctx = train::get_context();
  const fs::path dir = config.at("log").get<std::string>();
  const fs::path log = dir / (ctx.experiment_name + ".txt");
  int step = 0;
  if (std::optional<Checkpoint> c = train::get_checkpoint()) {
    step = std::stoi(slurp(c->as_directory().path() / "step.txt"));
  }
  append_line(log, fmt::format("start {}", step));
  while (true) {
    ++step;
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
    append_line(log, fmt::format("step {}", step));
    const nlohmann::json row = {{"step", step}, {"score", step}};
    if (train::should_checkpoint() || step % 10 == 0) {
      train::TemporaryDirectory tmp;
      write_file(fs::path(tmp.path()) / "step.txt", std::to_string(step));
      train::report(row, Checkpoint::from_directory(tmp.path()));
    } else {
      train::report(row);
    }
    if (step >= config.at("iters").get<int>() && fs::exists(dir / "may_finish")) return;
  }
}

// The numbers after `word` on the lines of `path` that start with it.
std::vector<int> logged(const fs::path& path, const std::string& word) {
  std::vector<int> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(word + " ", 0) == 0) out.push_back(std::stoi(line.substr(word.size() + 1)));
  }
  return out;
}

// Forks a Tuner driver running `fit`. It writes to <dir>/grid.txt
// "preempted" or "finished" and a line "<trial> <STATUS>" per trial (or
// "error <what>") before it exits.
pid_t fork_driver(const fs::path& dir, const std::function<ResultGrid()>& fit) {
  std::fflush(nullptr);
  const pid_t driver = ::fork();
  if (driver != 0) return driver;
  std::ofstream out(dir / "grid.txt");
  try {
    ResultGrid grid = fit();
    out << (grid.preempted() ? "preempted" : "finished") << "\n";
    for (const auto& r : grid) out << r.trial_id << " " << to_string(r.status) << "\n";
  } catch (const std::exception& e) {
    out << "error " << e.what() << "\n";
  }
  out.close();
  ::_exit(0);
}

// Waits, bounded, until `ready` holds.
bool wait_until(const std::function<bool()>& ready) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!ready()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// SIGTERM to `driver`; true once it exited on its own with status 0.
bool sigterm_and_reap(pid_t driver) {
  int status = 0;
  return ::kill(driver, SIGTERM) == 0 && ::waitpid(driver, &status, 0) == driver &&
         WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

TEST(TunerPreemption, SigtermPausesTheRunningTrialsWithACheckpointAndRestoreFinishesThem) {
  TempDir dir;
  RunConfig run;
  run.name = "pre";
  run.storage_path = dir.str();
  run.failure_config.preemption_grace_s = 60;
  const std::string experiment = (dir.path() / "pre").string();
  auto tune_config = [] {
    TuneConfig tc;
    tc.metric = "score";
    tc.mode = "max";
    tc.max_concurrent_trials = 2;
    return tc;
  };
  constexpr int kIters = 25;
  const nlohmann::json space = {
      {"x", grid_search({1, 2, 3})}, {"iters", kIters}, {"log", dir.str()}};
  const pid_t driver = fork_driver(
      dir.path(), [&] { return Tuner(preemptible_counter, space, tune_config(), run).fit(); });
  // Once both running trials have taken three steps, SIGTERM to the driver.
  // (The third trial is created when a slot frees: not before the restore.)
  const fs::path log0 = dir.path() / "trial_00000.txt";
  const fs::path log1 = dir.path() / "trial_00001.txt";
  ASSERT_TRUE(wait_until([&] {
    return logged(log0, "step").size() >= 3 && logged(log1, "step").size() >= 3;
  })) << "the trials made no progress";
  const int before0 = logged(log0, "step").back();
  const int before1 = logged(log1, "step").back();
  ASSERT_TRUE(sigterm_and_reap(driver));
  EXPECT_EQ(slurp(dir.path() / "grid.txt"), "preempted\ntrial_00000 PAUSED\ntrial_00001 PAUSED\n");

  // Each paused trial checkpointed after the signal: at a step at least as
  // late as the one it had reached.
  std::vector<int> paused_at;
  const std::vector<std::pair<std::string, int>> running = {{"trial_00000", before0},
                                                            {"trial_00001", before1}};
  for (const auto& [trial, before] : running) {
    const ExperimentListing info = read_experiment(experiment + "/" + trial);
    ASSERT_FALSE(info.checkpoints.empty()) << trial;
    const int step = std::stoi(info.checkpoints.back().checkpoint.storage().get("step.txt"));
    EXPECT_GE(step, before) << trial;
    paused_at.push_back(step);
  }

  write_file(dir.path() / "may_finish", "");
  ResultGrid grid = Tuner::restore(experiment, preemptible_counter, {}, tune_config()).fit();
  EXPECT_FALSE(grid.preempted());
  ASSERT_EQ(grid.size(), 3u);
  for (std::size_t i = 0; i < grid.size(); ++i) {
    const TrialResult& r = grid[i];
    EXPECT_EQ(r.status, TrialStatus::kTerminated) << r.trial_id << r.error.value_or("");
    // It went on from where it paused to its end, not from scratch.
    const int end = i < paused_at.size() ? std::max(kIters, paused_at[i] + 1) : kIters;
    EXPECT_EQ(r.metrics.at("step"), end) << r.trial_id;
  }
  // The paused trials went on from their preemption checkpoints.
  EXPECT_EQ(logged(log0, "start"), (std::vector<int>{0, paused_at[0]}));
  EXPECT_EQ(logged(log1, "start"), (std::vector<int>{0, paused_at[1]}));
  EXPECT_EQ(logged(dir.path() / "trial_00002.txt", "start"), (std::vector<int>{0}));
  testing::expect_no_children();
}

// Reports step 1 with a checkpoint, then, while <log>/stall exists, takes
// a minute before its next report: a loop that would not answer a notice in
// time.
void stalls_after_its_first_step(const nlohmann::json& config) {
  const fs::path dir = config.at("log").get<std::string>();
  int step = 0;
  if (std::optional<Checkpoint> c = train::get_checkpoint()) {
    step = std::stoi(slurp(c->as_directory().path() / "step.txt"));
  }
  append_line(dir / "stall.txt", fmt::format("start {}", step));
  while (step < 3) {
    ++step;
    if (step == 2 && fs::exists(dir / "stall")) {
      std::this_thread::sleep_for(std::chrono::seconds(60));
    }
    append_line(dir / "stall.txt", fmt::format("step {}", step));
    train::TemporaryDirectory tmp;
    write_file(fs::path(tmp.path()) / "step.txt", std::to_string(step));
    train::report({{"step", step}, {"score", step}}, Checkpoint::from_directory(tmp.path()));
  }
}

TEST(TunerPreemption, ATrialThatDoesNotCheckpointWithinTheGraceIsStoppedAndResumesFromItsLatest) {
  TempDir dir;
  RunConfig run;
  run.name = "grace";
  run.storage_path = dir.str();
  run.failure_config.preemption_grace_s = 1;
  const std::string experiment = (dir.path() / "grace").string();
  write_file(dir.path() / "stall", "");
  const pid_t driver = fork_driver(dir.path(), [&] {
    return Tuner(stalls_after_its_first_step, {{"log", dir.str()}}, {}, run).fit();
  });
  // SIGTERM once step 1's checkpoint is committed: the trial is then in
  // (or on its way to) its minute-long stall.
  ASSERT_TRUE(wait_until([&] {
    try {
      return !read_experiment(experiment + "/trial_00000").checkpoints.empty();
    } catch (const Error&) {  // not created yet
      return false;
    }
  })) << "the trial never checkpointed";
  ASSERT_TRUE(sigterm_and_reap(driver));
  EXPECT_EQ(slurp(dir.path() / "grid.txt"), "preempted\ntrial_00000 PAUSED\n");
  // Stopped after the grace: it never got past its stall.
  EXPECT_EQ(logged(dir.path() / "stall.txt", "step"), (std::vector<int>{1}));

  fs::remove(dir.path() / "stall");
  ResultGrid grid = Tuner::restore(experiment, stalls_after_its_first_step).fit();
  ASSERT_EQ(grid.size(), 1u);
  EXPECT_EQ(grid[0].status, TrialStatus::kTerminated) << grid[0].error.value_or("");
  EXPECT_EQ(grid[0].metrics.at("step"), 3);
  EXPECT_EQ(logged(dir.path() / "stall.txt", "start"), (std::vector<int>{0, 1}));
  testing::expect_no_children();
}

}  // namespace
}  // namespace cairn::tune
