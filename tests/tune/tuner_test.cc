// The Tuner with real trial processes: function and class trainables,
// checkpoint triggers, stop criteria, callbacks, failures, pausing, results.
#include "cairn/tuner.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cairn/error.h"
#include "support/errors.h"
#include "support/temp_dir.h"
#include "train/train_support.h"

namespace cairn::tune {
namespace {

namespace fs = std::filesystem;
using testing::slurp;
using testing::TempDir;
using testing::write_file;

RunConfig run_in(const TempDir& dir, std::string name = "search") {
  RunConfig r;
  r.name = std::move(name);
  r.storage_path = dir.str();
  return r;
}

// Reports `iters` results, a checkpoint (the step number) with each, and
// resumes from the latest. loss = x * (something decreasing).
void counting_trainable(const nlohmann::json& config) {
  int start = 0;
  if (auto c = train::get_checkpoint()) {
    start = std::stoi(slurp(c->as_directory().path() / "step.txt"));
  }
  const int iters = config.value("iters", 3);
  for (int step = start + 1; step <= iters; ++step) {
    if (config.value("fail_at", -1) == step && train::get_context().attempt == 0) {
      throw std::runtime_error(fmt::format("intentional failure at step {}", step));
    }
    train::TemporaryDirectory tmp;
    write_file(fs::path(tmp.path()) / "step.txt", std::to_string(step));
    train::report({{"step", step},
                   {"loss", config.at("x").get<double>() / step},
                   {"pid", static_cast<int>(::getpid())},
                   {"resumed_from", start}},
                  Checkpoint::from_directory(tmp.path()));
  }
}

TEST(Tuner, RunsEveryGridPointAsATrialWithItsOwnFolderAndHistory) {
  TempDir dir;
  TuneConfig tc;
  tc.metric = "loss";
  tc.mode = "min";
  tc.max_concurrent_trials = 2;
  Tuner tuner(counting_trainable, {{"x", grid_search({1.0, 2.0, 3.0, 4.0})}}, tc, run_in(dir));
  ResultGrid grid = tuner.fit();
  ASSERT_EQ(grid.size(), 4u);
  EXPECT_EQ(grid.num_errors(), 0u);
  EXPECT_EQ(grid.num_terminated(), 4u);
  std::set<double> xs;
  for (const auto& r : grid) {
    EXPECT_EQ(r.status, TrialStatus::kTerminated);
    xs.insert(r.config.at("x").get<double>());
    ASSERT_EQ(r.metrics_history.size(), 3u) << r.trial_id;
    EXPECT_EQ(r.metrics.at("step"), 3);
    ASSERT_TRUE(r.checkpoint.has_value());
    const fs::path trial = dir / "search" / r.trial_id;
    EXPECT_EQ(nlohmann::json::parse(slurp(trial / "params.json")), r.config);
    EXPECT_EQ(testing::read_json_lines(trial / "result.json").size(), 3u);
    EXPECT_TRUE(fs::exists(trial / "progress.csv"));
    bool events = false;
    for (const auto& e : fs::directory_iterator(trial)) {
      events |= e.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
    }
    EXPECT_TRUE(events) << trial;
  }
  EXPECT_EQ(xs, (std::set<double>{1, 2, 3, 4}));
  const TrialResult& best = grid.get_best_result();
  EXPECT_EQ(best.config.at("x"), 1.0);
  EXPECT_EQ(grid.get_best_result("loss", "max").config.at("x"), 4.0);
  EXPECT_TRUE(Tuner::can_restore((dir / "search").string()));
  const nlohmann::json state = nlohmann::json::parse(slurp(dir / "search" / "tuner_state.json"));
  EXPECT_EQ(state.at("trials").size(), 4u);
  for (const auto& t : state.at("trials")) EXPECT_EQ(t.at("status"), "TERMINATED");
  testing::expect_no_children();
}

// Counts the trials running at once from the callbacks' point of view.
struct Concurrency : Callback {
  int running = 0;
  int most = 0;
  void on_trial_start(const TrialInfo&) override { most = std::max(most, ++running); }
  void on_trial_complete(const TrialInfo&) override { --running; }
  void on_trial_error(const TrialInfo&) override { --running; }
};

TEST(Tuner, MultiWorkerTrialsRunAsTrainerGroupsNeverMoreThanConfiguredAtOnce) {
  TempDir dir;
  auto concurrency = std::make_shared<Concurrency>();
  TuneConfig tc;
  tc.max_concurrent_trials = 2;
  tc.callbacks = {concurrency};
  ScalingConfig scaling;
  scaling.num_workers = 2;
  Tuner tuner(
      [](const nlohmann::json& config) {
        const TrainContext& ctx = train::get_context();
        for (int step = 1; step <= 2; ++step) {
          train::report({{"world_size", ctx.world_size},
                         {"rank", ctx.world_rank},
                         {"x", config.at("x")},
                         {"trial", ctx.experiment_name}});
        }
      },
      {{"x", grid_search({1, 2, 3, 4, 5})}}, tc, run_in(dir), scaling);
  ResultGrid grid = tuner.fit();
  ASSERT_EQ(grid.size(), 5u);
  EXPECT_EQ(grid.num_terminated(), 5u);
  for (const auto& r : grid) {
    EXPECT_EQ(r.metrics.at("world_size"), 2);
    EXPECT_EQ(r.metrics.at("rank"), 0);  // metrics come from rank 0
    EXPECT_EQ(r.metrics.at("trial"), r.trial_id);
  }
  EXPECT_EQ(concurrency->most, 2);
  EXPECT_EQ(concurrency->running, 0);
}

TEST(Tuner, StopCriteriaAndAStopperEndTrialsEarly) {
  TempDir dir;
  struct LossBelow : Stopper {
    bool operator()(const std::string&, const nlohmann::json& r) override {
      return r.at("loss").get<double>() < 0.6;
    }
  };
  TuneConfig tc;
  tc.max_concurrent_trials = 2;
  tc.stop = {{"step", 4}};
  tc.stopper = std::make_shared<LossBelow>();
  Tuner tuner(counting_trainable, {{"x", grid_search({1.0, 100.0})}, {"iters", 10}}, tc,
              run_in(dir));
  ResultGrid grid = tuner.fit();
  ASSERT_EQ(grid.size(), 2u);
  for (const auto& r : grid) {
    EXPECT_EQ(r.status, TrialStatus::kTerminated);
    // x=1: loss 1, 0.5 -> the stopper ends it at step 2; x=100: step 4.
    const int expected = r.config.at("x") == 1.0 ? 2 : 4;
    EXPECT_EQ(r.metrics_history.size(), static_cast<size_t>(expected)) << r.trial_id;
  }
}

// Ends the experiment once any trial reports step 2.
struct StopAllAtStep2 : Stopper {
  bool all = false;
  bool operator()(const std::string&, const nlohmann::json& r) override {
    all = all || r.at("step") == 2;
    return false;
  }
  bool stop_all() override { return all; }
};

TEST(Tuner, StopAllEndsTheRunningTrialsAndStartsNoOther) {
  TempDir dir;
  TuneConfig tc;
  tc.max_concurrent_trials = 2;
  tc.stopper = std::make_shared<StopAllAtStep2>();
  Tuner tuner(counting_trainable, {{"x", grid_search({1.0, 2.0, 3.0, 4.0})}, {"iters", 50}}, tc,
              run_in(dir));
  ResultGrid grid = tuner.fit();
  ASSERT_LE(grid.size(), 3u);  // a third may have been added, never started
  size_t ran = 0;
  for (const auto& r : grid) {
    if (r.metrics_history.empty()) {
      EXPECT_EQ(r.status, TrialStatus::kPending) << r.trial_id;
      continue;
    }
    ++ran;
    EXPECT_EQ(r.status, TrialStatus::kTerminated) << r.trial_id;
    EXPECT_LE(r.metrics_history.size(), 3u) << r.trial_id;
  }
  EXPECT_EQ(ran, 2u);
}

// Reports every 50 ms, up to config["iters"] times, without checkpoints.
void slow_reporter(const nlohmann::json& config) {
  for (int step = 1; step <= config.at("iters").get<int>(); ++step) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    train::report({{"step", step}});
  }
}

// Ray's time_budget_s: the running trial stops at its next result once the
// budget is spent, no other starts, and a restore counts the time already
// used (so a spent budget runs nothing more).
TEST(Tuner, ATimeBudgetStopsTheRunningTrialStartsNoOtherAndCarriesOverARestore) {
  TempDir dir;
  TuneConfig tc;
  tc.max_concurrent_trials = 1;
  tc.time_budget_s = 1.0;
  const int iters = 1200;  // a minute of steps: only the budget ends it sooner
  Tuner tuner(slow_reporter, {{"x", grid_search({1, 2, 3})}, {"iters", iters}}, tc, run_in(dir));
  const auto started = std::chrono::steady_clock::now();
  ResultGrid grid = tuner.fit();
  EXPECT_GE(std::chrono::steady_clock::now() - started, std::chrono::seconds(1));
  ASSERT_GE(grid.size(), 1u);
  EXPECT_EQ(grid[0].status, TrialStatus::kTerminated);
  EXPECT_GE(grid[0].metrics_history.size(), 1u);
  EXPECT_LT(grid[0].metrics_history.size(), static_cast<size_t>(iters));
  for (size_t i = 1; i < grid.size(); ++i) {
    EXPECT_EQ(grid[i].status, TrialStatus::kPending) << grid[i].trial_id;
    EXPECT_TRUE(grid[i].metrics_history.empty()) << grid[i].trial_id;
  }
  const std::string path = (dir / "search").string();
  const nlohmann::json state = nlohmann::json::parse(slurp(fs::path(path) / "tuner_state.json"));
  EXPECT_EQ(state.at("time_budget_s"), 1.0);
  EXPECT_GE(state.at("time_used_s").get<double>(), 1.0);

  ResultGrid again = Tuner::restore(path, slow_reporter).fit();
  ASSERT_EQ(again.size(), grid.size());
  EXPECT_EQ(again[0].metrics_history.size(), grid[0].metrics_history.size());
  for (size_t i = 1; i < again.size(); ++i) {
    EXPECT_EQ(again[i].status, TrialStatus::kPending) << again[i].trial_id;
  }

  tc.time_budget_s = -1;
  testing::expect_invalid_argument([&] { Tuner(slow_reporter, {}, tc, run_in(dir, "bad")); },
                                   "time_budget_s");
}

double steady_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Records the GPUs its trial was given and when it ran (a steady clock every
// process on the machine shares).
void gpu_recorder(const nlohmann::json&) {
  const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
  const double start = steady_now();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  train::report({{"gpus", env ? env : "<unset>"}, {"start", start}, {"end", steady_now()}});
}

// Ray's per-trial GPUs with fake device ids: whole GPUs one trial each,
// fractions shared up to a whole, never a GPU over-booked at any moment;
// a request that could never be served is refused before any trial runs.
TEST(TunerResources, GpusGoWholeOrInSharesToTrialsAndAreNeverOverbooked) {
  for (const double gpu : {1.0, 0.5, 2.0}) {
    SCOPED_TRACE(gpu);
    TempDir dir;
    TuneConfig tc;
    tc.max_concurrent_trials = 4;
    tc.resources_per_trial.gpu = gpu;
    tc.gpu_ids = {"0", "1"};
    ResultGrid grid =
        Tuner(gpu_recorder, {{"x", grid_search({1, 2, 3, 4})}}, tc, run_in(dir)).fit();
    ASSERT_EQ(grid.size(), 4u);
    struct Span {
      double start, end;
      std::vector<std::string> ids;
    };
    std::vector<Span> spans;
    for (const auto& r : grid) {
      ASSERT_EQ(r.status, TrialStatus::kTerminated) << r.trial_id;
      Span s{r.metrics.at("start").get<double>(), r.metrics.at("end").get<double>(), {}};
      std::stringstream in(r.metrics.at("gpus").get<std::string>());
      for (std::string id; std::getline(in, id, ',');) s.ids.push_back(id);
      EXPECT_EQ(s.ids.size(), gpu >= 1 ? static_cast<size_t>(gpu) : 1u) << r.trial_id;
      for (const auto& id : s.ids) EXPECT_TRUE(id == "0" || id == "1") << id;
      spans.push_back(std::move(s));
    }
    // At each trial's start, the shares of every GPU held by the trials
    // running then (whose runners held them, a longer span) add up to <= 1.
    const double share = gpu >= 1 ? 1.0 : gpu;
    for (const Span& a : spans) {
      for (const std::string& id : a.ids) {
        double held = 0;
        for (const Span& b : spans) {
          if (b.start <= a.start && a.start < b.end &&
              std::find(b.ids.begin(), b.ids.end(), id) != b.ids.end()) {
            held += share;
          }
        }
        EXPECT_LE(held, 1.0 + 1e-9) << "GPU " << id << " over-booked at " << a.start;
      }
    }
  }
  TempDir dir;
  TuneConfig tc;
  tc.resources_per_trial.gpu = 3;
  tc.gpu_ids = {"0", "1"};
  testing::expect_invalid_argument(
      [&] {
        Tuner(gpu_recorder, {{"x", grid_search({1})}}, tc, run_in(dir)).fit();
      },
      "resources_per_trial.gpu = 3");
  tc.resources_per_trial.gpu = 1.5;
  testing::expect_invalid_argument([&] { Tuner(gpu_recorder, {}, tc, run_in(dir, "b")); },
                                   "whole number");
}

TEST(Tuner, AnElasticScalingConfigIsRefusedForTrialsNamingIt) {
  TempDir dir;
  testing::expect_invalid_argument(
      [&] {
        Tuner([](const nlohmann::json&) {}, {}, TuneConfig{}, run_in(dir),
              ScalingConfig{.num_workers = 2, .min_workers = 1});
      },
      "ScalingConfig::min_workers");
  EXPECT_FALSE(fs::exists(dir / "search"));
}

TEST(TunerResources, ATrialWithoutGpusKeepsTheDriversEnvironment) {
  TempDir dir;
  TuneConfig tc;
  tc.gpu_ids = {"0"};
  ResultGrid grid = Tuner(gpu_recorder, {{"x", grid_search({1})}}, tc, run_in(dir)).fit();
  ASSERT_EQ(grid.size(), 1u);
  const char* mine = std::getenv("CUDA_VISIBLE_DEVICES");
  EXPECT_EQ(grid[0].metrics.at("gpus"), mine ? mine : "<unset>");
}

TEST(Tuner, SampleFromValuesAreComputedPerTrialSavedAndNeededAgainOnlyWhileTrialsRemain) {
  TempDir dir;
  const nlohmann::json space = {{"x", grid_search({1.0, 2.0, 3.0, 4.0})},
                                {"iters", 3},
                                {"derived", {{"y", sample_from("ten_x")}}}};
  SampleFunctions fns;
  fns["ten_x"] = [](const nlohmann::json& c, Rng&) -> std::optional<nlohmann::json> {
    return c.at("x").get<double>() * 10;
  };
  // Without its function the space is refused up front, naming the key.
  testing::expect_error_naming(ErrorCode::kInvalidArgument, "derived/y",
                               [&] { Tuner(counting_trainable, space, {}, run_in(dir)); });
  TuneConfig tc;
  tc.max_concurrent_trials = 1;
  tc.stopper = std::make_shared<StopAllAtStep2>();
  tc.sample_functions = fns;
  ResultGrid first = Tuner(counting_trainable, space, tc, run_in(dir)).fit();
  ASSERT_LT(first.size(), 4u);  // trials remain to be drawn
  const std::string path = (dir / "search").string();
  // Restoring with trials left to draw needs the function again.
  testing::expect_error_naming(ErrorCode::kInvalidArgument, "derived/y",
                               [&] { Tuner::restore(path, counting_trainable); });
  TuneConfig code;
  code.sample_functions = fns;
  ResultGrid grid = Tuner::restore(path, counting_trainable, {}, code).fit();
  ASSERT_EQ(grid.size(), 4u);
  for (const auto& r : grid) {
    EXPECT_EQ(r.config.at("derived").at("y"), r.config.at("x").get<double>() * 10) << r.trial_id;
    const nlohmann::json params =
        nlohmann::json::parse(slurp(dir / "search" / r.trial_id / "params.json"));
    EXPECT_EQ(params, r.config) << r.trial_id;
  }
  // Every trial drawn: a restore needs no function any more.
  ResultGrid again = Tuner::restore(path, counting_trainable).fit();
  EXPECT_EQ(again.size(), 4u);
}

// A scheduler that decides nothing; the tests' schedulers override what they
// exercise.
class QuietScheduler : public TrialScheduler {
 public:
  void set_search_properties(const std::string&, const std::string&) override {}
  void on_trial_add(const TrialView&) override {}
  SchedulerDecision on_trial_result(const TrialView&, const nlohmann::json&) override { return {}; }
  void on_trial_complete(const TrialView&, const nlohmann::json&) override {}
  void on_trial_error(const TrialView&) override {}
  nlohmann::json save() const override { return nlohmann::json::object(); }
  void restore(const nlohmann::json&) override {}
};

// A scheduler that never lets a waiting trial start.
class ChoosesNothing : public QuietScheduler {
 public:
  std::string name() const override { return "nothing"; }
  std::optional<std::string> choose_trial_to_run(const std::vector<TrialView>&) override {
    return std::nullopt;
  }
};

TEST(Tuner, AnExperimentThatCanMakeNoProgressFailsInsteadOfWaitingForever) {
  TempDir dir;
  TuneConfig tc;
  tc.scheduler = std::make_shared<ChoosesNothing>();
  testing::expect_error_naming(ErrorCode::kFailedPrecondition, "none can start", [&] {
    Tuner(counting_trainable, {{"x", 1.0}}, tc, run_in(dir)).fit();
  });
  EXPECT_TRUE(Tuner::can_restore((dir / "search").string()));  // the state was saved
}

TEST(Tuner, AFailedTrialResumesFromItsLatestCheckpointWithinMaxFailures) {
  TempDir dir;
  RunConfig run = run_in(dir);
  run.failure_config.max_failures = 1;
  TuneConfig tc;
  tc.max_concurrent_trials = 1;
  Tuner tuner(counting_trainable, {{"x", 1.0}, {"iters", 4}, {"fail_at", 3}}, tc, run);
  ResultGrid grid = tuner.fit();
  ASSERT_EQ(grid.size(), 1u);
  EXPECT_EQ(grid[0].status, TrialStatus::kTerminated);
  EXPECT_EQ(grid[0].metrics.at("step"), 4);
  EXPECT_EQ(grid[0].metrics.at("resumed_from"), 2);
}

TEST(Tuner, ATrialOutOfRetriesIsAnErrorAndTheOthersFinish) {
  TempDir dir;
  TuneConfig tc;
  tc.metric = "loss";
  tc.mode = "min";
  tc.max_concurrent_trials = 2;
  Tuner tuner(counting_trainable, {{"x", 1.0}, {"fail_at", grid_search({2, -1})}}, tc, run_in(dir));
  ResultGrid grid = tuner.fit();
  ASSERT_EQ(grid.size(), 2u);
  EXPECT_EQ(grid.num_errors(), 1u);
  for (const auto& r : grid) {
    if (r.config.at("fail_at") == 2) {
      EXPECT_EQ(r.status, TrialStatus::kError);
      ASSERT_TRUE(r.error.has_value());
      EXPECT_NE(r.error->find("intentional failure at step 2"), std::string::npos) << *r.error;
    } else {
      EXPECT_EQ(r.status, TrialStatus::kTerminated);
    }
  }
  EXPECT_EQ(grid.get_best_result().config.at("fail_at"), -1);
}

// A class trainable: state is a counter; checkpoints hold it.
class Counter : public Trainable {
 public:
  void setup(const nlohmann::json& config) override { config_ = config; }
  nlohmann::json step() override {
    ++value_;
    if (config_.value("fail_at", -1) == value_ && train::get_context().attempt == 0) {
      throw std::runtime_error(fmt::format("intentional failure at step {}", value_));
    }
    nlohmann::json r = {{"value", value_}, {"pid", static_cast<int>(::getpid())}};
    if (config_.value("checkpoint_at", -1) == value_) r["should_checkpoint"] = true;
    if (value_ >= config_.value("until", 5)) r["done"] = true;
    return r;
  }
  void save_checkpoint(const std::string& dir) override {
    write_file(fs::path(dir) / "value.txt", std::to_string(value_));
  }
  void load_checkpoint(const std::string& dir) override {
    value_ = std::stoi(slurp(fs::path(dir) / "value.txt"));
  }

 private:
  nlohmann::json config_;
  int value_ = 0;
};

std::vector<int> checkpoint_values(const fs::path& trial) {
  std::vector<int> out;
  for (const auto& rec : read_experiment(trial.string()).checkpoints) {
    out.push_back(std::stoi(slurp(rec.checkpoint.as_directory().path() / "value.txt")));
  }
  return out;
}

TEST(Tuner, ClassTrainableCheckpointsByFrequencyFlagAndAtEnd) {
  TempDir dir;
  RunConfig run = run_in(dir);
  run.checkpoint_config.checkpoint_frequency = 3;
  run.checkpoint_config.checkpoint_at_end = true;
  TuneConfig tc;
  tc.max_concurrent_trials = 1;
  Tuner tuner([] { return std::make_unique<Counter>(); }, {{"until", 7}, {"checkpoint_at", 2}}, tc,
              run);
  ResultGrid grid = tuner.fit();
  ASSERT_EQ(grid.size(), 1u);
  EXPECT_EQ(grid[0].status, TrialStatus::kTerminated);
  EXPECT_EQ(grid[0].metrics_history.size(), 7u);
  EXPECT_EQ(checkpoint_values(dir / "search" / grid[0].trial_id), (std::vector<int>{2, 3, 6, 7}));
  for (const auto& row : grid[0].metrics_history) EXPECT_FALSE(row.contains("should_checkpoint"));
}

// Ray's default: checkpoint_at_end left unset is on for a class trainable.
TEST(Tuner, ClassTrainableCheckpointsAtItsEndUnlessCheckpointAtEndIsFalse) {
  for (const std::optional<bool> at_end : {std::optional<bool>(), std::optional<bool>(false)}) {
    TempDir dir;
    RunConfig run = run_in(dir);
    run.checkpoint_config.checkpoint_at_end = at_end;
    Tuner tuner([] { return std::make_unique<Counter>(); }, {{"until", 5}}, {}, run);
    ResultGrid grid = tuner.fit();
    ASSERT_EQ(grid.size(), 1u);
    EXPECT_EQ(grid[0].status, TrialStatus::kTerminated);
    EXPECT_EQ(checkpoint_values(dir / "search" / grid[0].trial_id),
              at_end ? std::vector<int>{} : std::vector<int>{5});
  }
}

TEST(Tuner, ClassTrainableStoppedByTheTunerSavesAtEndWithoutAnotherStep) {
  TempDir dir;
  RunConfig run = run_in(dir);
  run.checkpoint_config.checkpoint_at_end = true;
  TuneConfig tc;
  tc.stop = {{"value", 4}};
  Tuner tuner([] { return std::make_unique<Counter>(); }, {{"until", 100}}, tc, run);
  ResultGrid grid = tuner.fit();
  ASSERT_EQ(grid.size(), 1u);
  EXPECT_EQ(grid[0].status, TrialStatus::kTerminated);
  EXPECT_EQ(grid[0].metrics_history.size(), 4u);
  EXPECT_EQ(checkpoint_values(dir / "search" / grid[0].trial_id), (std::vector<int>{4}));
  // Its workers were stopped for the final checkpoint (the preemption
  // path): that is the Tuner's doing, not the trial's failure.
  EXPECT_FALSE(grid[0].error.has_value()) << *grid[0].error;
  EXPECT_FALSE(grid[0].preempted);
}

// Reports `step` forever (TuneConfig::stop ends it), a checkpoint every
// second step, and fails once at config["fail_at"] in its first attempt.
void checkpoints_every_second_step(const nlohmann::json& config) {
  int step = 0;
  if (auto c = train::get_checkpoint())
    step = std::stoi(slurp(c->as_directory().path() / "step.txt"));
  while (true) {
    ++step;
    if (config.at("fail_at").get<int>() == step && train::get_context().attempt == 0) {
      throw std::runtime_error(fmt::format("intentional failure at step {}", step));
    }
    if (step % 2 == 0) {
      train::TemporaryDirectory tmp;
      write_file(fs::path(tmp.path()) / "step.txt", std::to_string(step));
      train::report({{"step", step}}, Checkpoint::from_directory(tmp.path()));
    } else {
      train::report({{"step", step}});
    }
  }
}

std::vector<int> column(const std::vector<nlohmann::json>& rows, const std::string& key) {
  std::vector<int> out;
  for (const auto& r : rows) out.push_back(r.at(key).get<int>());
  return out;
}

// As in Ray: a restarted trial takes its training_iteration from the
// checkpoint it resumes from, so the round it repeats is not counted twice
// and stop = {"training_iteration": 6} still trains six iterations.
TEST(Tuner, ARestartedTrialCountsTrainingIterationsFromItsCheckpoint) {
  TempDir dir;
  TuneConfig tc;
  tc.stop = {{"training_iteration", 6}};
  const std::vector<int> expected = {1, 2, 3, 3, 4, 5, 6};  // failed in step 4: back to 2

  RunConfig run = run_in(dir, "class");
  run.checkpoint_config.checkpoint_frequency = 2;
  run.failure_config.max_failures = 1;
  ResultGrid grid =
      Tuner([] { return std::make_unique<Counter>(); }, {{"until", 100}, {"fail_at", 4}}, tc, run)
          .fit();
  ASSERT_EQ(grid.size(), 1u);
  EXPECT_EQ(grid[0].status, TrialStatus::kTerminated) << grid[0].error.value_or("");
  EXPECT_EQ(column(grid[0].metrics_history, "value"), expected);
  EXPECT_EQ(column(grid[0].metrics_history, "training_iteration"), expected);

  run = run_in(dir, "function");
  run.failure_config.max_failures = 1;
  grid = Tuner(checkpoints_every_second_step, {{"fail_at", 4}}, tc, run).fit();
  ASSERT_EQ(grid.size(), 1u);
  EXPECT_EQ(grid[0].status, TrialStatus::kTerminated) << grid[0].error.value_or("");
  EXPECT_EQ(column(grid[0].metrics_history, "step"), expected);
  EXPECT_EQ(column(grid[0].metrics_history, "training_iteration"), expected);
}

TEST(Tuner, FunctionTrainablesRefuseCheckpointFrequencyAndAtEnd) {
  TempDir dir;
  RunConfig run = run_in(dir);
  run.checkpoint_config.checkpoint_frequency = 2;
  testing::expect_error_naming(ErrorCode::kInvalidArgument, "checkpoint_frequency", [&] {
    Tuner t(counting_trainable, {{"x", 1.0}}, {}, run);
  });
  run.checkpoint_config.checkpoint_frequency = 0;
  run.checkpoint_config.checkpoint_at_end = true;
  testing::expect_error_naming(ErrorCode::kInvalidArgument, "checkpoint_at_end", [&] {
    Tuner t(counting_trainable, {{"x", 1.0}}, {}, run);
  });
}

TEST(Tuner, BadConfigurationNamesTheField) {
  TempDir dir;
  TuneConfig tc;
  tc.metric = "loss";
  testing::expect_error_naming(ErrorCode::kInvalidArgument, "TuneConfig::mode", [&] {
    Tuner t(counting_trainable, {{"x", 1.0}}, tc, run_in(dir));
  });
  tc.mode = "min";
  tc.num_samples = 0;
  testing::expect_error_naming(ErrorCode::kInvalidArgument, "TuneConfig::num_samples", [&] {
    Tuner t(counting_trainable, {{"x", 1.0}}, tc, run_in(dir));
  });
  testing::expect_error_naming(ErrorCode::kInvalidArgument, "x", [&] {
    Tuner t(counting_trainable, {{"x", uniform(2, 1)}}, {}, run_in(dir));
  });
}

// Callbacks see every trial start, result, checkpoint and end, in order,
// and a callback's should_checkpoint makes a class trainable save.
struct Recorder : Callback {
  std::vector<std::string> events;
  void on_trial_start(const TrialInfo& t) override { events.push_back("start " + t.trial_id); }
  void on_trial_result(const TrialInfo& t, nlohmann::json& r) override {
    events.push_back(fmt::format("result {} {}", t.trial_id, r.at("value").get<int>()));
    if (r.at("value") == 2) r["should_checkpoint"] = true;
  }
  void on_checkpoint(const TrialInfo& t, const std::string& name) override {
    events.push_back("checkpoint " + t.trial_id + " " + name);
  }
  void on_trial_complete(const TrialInfo& t) override {
    events.push_back("complete " + t.trial_id);
  }
  void on_trial_error(const TrialInfo& t) override { events.push_back("error " + t.trial_id); }
  void on_experiment_end(const std::vector<TrialInfo>& trials) override {
    events.push_back(fmt::format("end {}", trials.size()));
  }
};

TEST(Tuner, CallbacksSeeTheTrialLifecycleAndCanAskForACheckpoint) {
  TempDir dir;
  auto rec = std::make_shared<Recorder>();
  TuneConfig tc;
  tc.callbacks = {rec};
  RunConfig run = run_in(dir);
  run.checkpoint_config.checkpoint_at_end = false;  // only the callback's checkpoint
  Tuner tuner([] { return std::make_unique<Counter>(); }, {{"until", 3}}, tc, run);
  ResultGrid grid = tuner.fit();
  ASSERT_EQ(grid.size(), 1u);
  const std::vector<std::string> expected = {"start trial_00000",
                                             "result trial_00000 1",
                                             "result trial_00000 2",
                                             "checkpoint trial_00000 checkpoint_000000",
                                             "result trial_00000 3",
                                             "complete trial_00000",
                                             "end 1"};
  EXPECT_EQ(rec->events, expected);
  EXPECT_EQ(checkpoint_values(dir / "search" / "trial_00000"), (std::vector<int>{2}));
}

// A scheduler that pauses every trial once at iteration 2 and then lets it
// go on: the paused trial checkpoints, frees its slot, and resumes later in
// a new process from that checkpoint.
class PauseOnce : public QuietScheduler {
 public:
  std::string name() const override { return "pause_once"; }
  SchedulerDecision on_trial_result(const TrialView& t, const nlohmann::json& r) override {
    SchedulerDecision d;
    if (r.at("training_iteration") == 2 && paused_.insert(t.trial_id).second) {
      d.action = SchedulerDecision::kPause;
    }
    return d;
  }
  std::optional<std::string> choose_trial_to_run(const std::vector<TrialView>& c) override {
    for (const auto& t : c) {
      if (t.status == TrialStatus::kPending) return t.trial_id;
    }
    return c.front().trial_id;
  }
  nlohmann::json save() const override { return {{"paused", paused_}}; }
  void restore(const nlohmann::json& s) override {
    paused_ = s.at("paused").get<std::set<std::string>>();
  }

 private:
  std::set<std::string> paused_;
};

TEST(Tuner, APausedTrialCheckpointsFreesItsSlotAndResumesInANewProcess) {
  TempDir dir;
  RunConfig run = run_in(dir);
  TuneConfig tc;
  tc.max_concurrent_trials = 1;
  tc.scheduler = std::make_shared<PauseOnce>();
  auto rec = std::make_shared<Recorder>();
  tc.callbacks = {rec};
  Tuner tuner([] { return std::make_unique<Counter>(); }, {{"until", grid_search({4, 5})}}, tc,
              run);
  ResultGrid grid = tuner.fit();
  ASSERT_EQ(grid.size(), 2u);
  for (const auto& r : grid) {
    EXPECT_EQ(r.status, TrialStatus::kTerminated) << r.trial_id;
    const int until = r.config.at("until").get<int>();
    ASSERT_EQ(r.metrics_history.size(), static_cast<size_t>(until)) << r.trial_id;
    // Values continue from the pause checkpoint (2), in another process.
    std::vector<int> values;
    for (const auto& row : r.metrics_history) values.push_back(row.at("value").get<int>());
    std::vector<int> expected;
    for (int v = 1; v <= until; ++v) expected.push_back(v);
    EXPECT_EQ(values, expected);
    EXPECT_NE(r.metrics_history[1].at("pid"), r.metrics_history[2].at("pid"));
    EXPECT_EQ(checkpoint_values(dir / "search" / r.trial_id)[0], 2);
  }
  // With one slot, trial 1 started while trial 0 was paused, then each resumed.
  const std::vector<std::string> starts = {"start trial_00000", "start trial_00001",
                                           "start trial_00000", "start trial_00001"};
  std::vector<std::string> seen;
  for (const auto& e : rec->events) {
    if (e.rfind("start ", 0) == 0) seen.push_back(e);
  }
  EXPECT_EQ(seen, starts);
}

}  // namespace
}  // namespace cairn::tune

namespace cairn::tune {
namespace {

// Fails at step 2 while the file named by config["fail_flag"] exists.
void flaky_counter(const nlohmann::json& config) {
  int start = 0;
  if (auto c = train::get_checkpoint()) {
    start = std::stoi(slurp(c->as_directory().path() / "step.txt"));
  }
  for (int step = start + 1; step <= 4; ++step) {
    if (step == 2 && fs::exists(config.at("fail_flag").get<std::string>())) {
      throw std::runtime_error("flag set: failing at step 2");
    }
    train::TemporaryDirectory tmp;
    write_file(fs::path(tmp.path()) / "step.txt", std::to_string(step));
    train::report({{"step", step}, {"resumed_from", start}},
                  Checkpoint::from_directory(tmp.path()));
  }
}

TEST(TunerRestore, ErroredTrialsResumeOrRestartAsAskedAndFinishedOnesStayDone) {
  for (const bool restart : {false, true}) {
    SCOPED_TRACE(restart ? "restart_errored" : "resume_errored");
    TempDir dir;
    const std::string flag = (dir / "fail.flag").string();
    write_file(flag, "x");
    TuneConfig tc;
    tc.max_concurrent_trials = 2;
    Tuner(flaky_counter, {{"fail_flag", grid_search({flag, (dir / "never").string()})}}, tc,
          run_in(dir))
        .fit();
    fs::remove(flag);
    const std::string path = (dir / "search").string();
    ASSERT_TRUE(Tuner::can_restore(path));
    // Without options, an errored trial stays errored and nothing runs again.
    ResultGrid same = Tuner::restore(path, flaky_counter).fit();
    EXPECT_EQ(same.num_errors(), 1u);
    RestoreOptions o;
    o.resume_errored = !restart;
    o.restart_errored = restart;
    ResultGrid grid = Tuner::restore(path, flaky_counter, o).fit();
    ASSERT_EQ(grid.size(), 2u);
    EXPECT_EQ(grid.num_errors(), 0u);
    for (const auto& r : grid) {
      EXPECT_EQ(r.status, TrialStatus::kTerminated);
      EXPECT_EQ(r.metrics.at("step"), 4);
    }
    // The errored trial (the first): resumed from step 1's checkpoint, or
    // restarted from scratch with a fresh history; the finished one ran once.
    EXPECT_EQ(grid[0].metrics.at("resumed_from"), restart ? 0 : 1);
    EXPECT_EQ(grid[0].metrics_history.size(), 4u);
    EXPECT_EQ(grid[1].metrics_history.size(), 4u);
  }
}

TEST(TunerRestore, RefusesAMissingOrDamagedStateAndAnotherTrainableKind) {
  TempDir dir;
  testing::expect_error_naming(ErrorCode::kNotFound, "tuner_state.json", [&] {
    Tuner::restore((dir / "nothing").string(), counting_trainable);
  });
  fs::create_directories(dir / "bad");
  write_file(dir / "bad" / "tuner_state.json", "{not json");
  testing::expect_error_naming(ErrorCode::kCorruption, "tuner_state.json",
                               [&] { Tuner::can_restore((dir / "bad").string()); });
  Tuner(counting_trainable, {{"x", 1.0}, {"iters", 1}}, {}, run_in(dir)).fit();
  testing::expect_error_naming(ErrorCode::kInvalidArgument, "function trainable", [&] {
    Tuner::restore((dir / "search").string(), [] { return std::make_unique<Counter>(); });
  });
  // A new Tuner refuses a name that already holds an experiment.
  testing::expect_error_naming(ErrorCode::kAlreadyExists, "Tuner::restore", [&] {
    Tuner(counting_trainable, {{"x", 1.0}}, {}, run_in(dir)).fit();
  });
  // A stored seed with trailing junk is damage, not the number before it.
  const fs::path state = dir / "search" / "tuner_state.json";
  nlohmann::json saved = nlohmann::json::parse(slurp(state));
  saved["seed"] = "12abc";
  write_file(state, saved.dump());
  testing::expect_error_naming(ErrorCode::kCorruption, "seed", [&] {
    Tuner::restore((dir / "search").string(), counting_trainable);
  });
}

TEST(TunerRestore, RemovesCopiesADriverLeftWhileCloningThatNoTrialWaitsFor) {
  TempDir dir;
  Tuner(counting_trainable, {{"x", 1.0}, {"iters", 1}}, {}, run_in(dir)).fit();
  const fs::path orphan = dir / "search" / ".cairn_clones" / "trial_00007_3";
  write_file(orphan / "checkpoint_000000" / "step.txt", "1");
  Tuner::restore((dir / "search").string(), counting_trainable).fit();
  EXPECT_FALSE(fs::exists(orphan));
  EXPECT_FALSE(fs::exists(dir / "search" / ".cairn_clones"));
}

TEST(TunerSchedulers, AshaStopsWeakTrialsEarlyAndLetsTheBestRunToMaxT) {
  TempDir dir;
  TuneConfig tc;
  tc.metric = "loss";
  tc.mode = "min";
  tc.max_concurrent_trials = 2;
  ASHAOptions o;
  o.max_t = 9;
  o.grace_period = 1;
  o.reduction_factor = 3;
  tc.scheduler = std::make_shared<ASHAScheduler>(o);
  Tuner tuner(counting_trainable,
              {{"x", grid_search({1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0})}, {"iters", 20}}, tc,
              run_in(dir));
  ResultGrid grid = tuner.fit();
  ASSERT_EQ(grid.size(), 8u);
  EXPECT_EQ(grid.num_terminated(), 8u);
  size_t early = 0;
  for (const auto& r : grid) {
    EXPECT_LE(r.metrics_history.size(), 9u) << r.trial_id;
    early += r.metrics_history.size() < 9 ? 1 : 0;
  }
  EXPECT_GE(early, 3u);
  const TrialResult& best = grid.get_best_result();
  EXPECT_EQ(best.config.at("x"), 1.0);
  EXPECT_EQ(best.metrics_history.size(), 9u);
}

// Ray's Tuner.restore takes no scheduler: the saved ASHA or PBT is rebuilt
// from the options saved with its state, unless its mutations are code.
TEST(TunerRestore, RebuildsTheSavedAshaOrPbtSchedulerWhenNoneIsGiven) {
  TempDir dir;
  TuneConfig tc;
  tc.metric = "loss";
  tc.mode = "min";
  tc.max_concurrent_trials = 1;
  tc.stopper = std::make_shared<StopAllAtStep2>();
  ASHAOptions o;
  o.max_t = 9;
  o.reduction_factor = 3;
  tc.scheduler = std::make_shared<ASHAScheduler>(o);
  const nlohmann::json space = {{"x", grid_search({1.0, 2.0, 3.0, 4.0})}, {"iters", 20}};
  ResultGrid first = Tuner(counting_trainable, space, tc, run_in(dir)).fit();
  ASSERT_LT(first.num_terminated(), 4u);
  const std::string path = (dir / "search").string();
  const fs::path state_file = dir / "search" / "tuner_state.json";
  const std::string saved = slurp(state_file);
  // No scheduler given: the ASHA saved goes on, its milestones included.
  ResultGrid grid = Tuner::restore(path, counting_trainable).fit();
  ASSERT_EQ(grid.size(), 4u);
  EXPECT_EQ(grid.num_terminated(), 4u);
  for (const auto& r : grid) EXPECT_LE(r.metrics.at("step"), 9) << r.trial_id;  // max_t
  const nlohmann::json state = nlohmann::json::parse(slurp(state_file));
  EXPECT_EQ(state.at("scheduler").at("name"), "asha");
  EXPECT_EQ(state.at("scheduler").at("state").at("options").at("max_t"), 9.0);

  // A state saved without options (an older version) still asks for one.
  nlohmann::json old = nlohmann::json::parse(saved);
  old["scheduler"]["state"].erase("options");
  write_file(state_file, old.dump());
  testing::expect_error_naming(ErrorCode::kInvalidArgument, "\"asha\" scheduler",
                               [&] { Tuner::restore(path, counting_trainable); });

  // PBT mutations that are functions cannot be rebuilt: the scheduler is asked for.
  PBTOptions p;
  p.perturbation_interval = 1;
  p.hyperparam_mutations = {{"x", sample_from("x")}};
  p.sample_functions["x"] = [](const nlohmann::json&, Rng&) -> std::optional<nlohmann::json> {
    return 1.0;
  };
  TuneConfig pc;
  pc.metric = "loss";
  pc.mode = "min";
  pc.scheduler = std::make_shared<PopulationBasedTraining>(p);
  Tuner(counting_trainable, {{"x", 1.0}, {"iters", 2}}, pc, run_in(dir, "pbt")).fit();
  const std::string pbt_path = (dir / "pbt").string();
  testing::expect_error_naming(ErrorCode::kInvalidArgument, "pass the scheduler again",
                               [&] { Tuner::restore(pbt_path, counting_trainable); });
  TuneConfig code;
  code.scheduler = std::make_shared<PopulationBasedTraining>(p);
  EXPECT_EQ(Tuner::restore(pbt_path, counting_trainable, {}, code).fit().num_terminated(), 1u);
}

}  // namespace
}  // namespace cairn::tune

namespace cairn::tune {
namespace {

// The trainable kills its own trial runner (its parent) once, after writing
// a checkpoint's files and before reporting it: the runner dies mid-checkpoint
// and its worker with it. The Tuner counts a failure and resumes the trial
// from its latest committed checkpoint in a new runner.
void kills_its_runner(const nlohmann::json& config) {
  int start = 0;
  if (auto c = train::get_checkpoint()) {
    start = std::stoi(slurp(c->as_directory().path() / "step.txt"));
  }
  const fs::path marker = config.at("marker").get<std::string>();
  for (int step = start + 1; step <= 4; ++step) {
    train::TemporaryDirectory tmp;
    write_file(fs::path(tmp.path()) / "step.txt", std::to_string(step));
    if (step == 3 && !fs::exists(marker)) {
      write_file(marker, "killed");
      ::kill(::getppid(), SIGKILL);
      ::pause();
    }
    train::report({{"step", step}, {"resumed_from", start}},
                  Checkpoint::from_directory(tmp.path()));
  }
}

TEST(Tuner, ATrialWhoseRunnerIsKilledMidCheckpointResumesFromItsLatestCommitted) {
  TempDir dir;
  RunConfig run = run_in(dir);
  run.failure_config.max_failures = 1;
  ResultGrid grid = Tuner(kills_its_runner, {{"marker", (dir / "killed").string()}}, {}, run).fit();
  ASSERT_EQ(grid.size(), 1u);
  EXPECT_EQ(grid[0].status, TrialStatus::kTerminated);
  EXPECT_EQ(grid[0].metrics.at("step"), 4);
  EXPECT_EQ(grid[0].metrics.at("resumed_from"), 2);
  const nlohmann::json state = nlohmann::json::parse(slurp(dir / "search" / "tuner_state.json"));
  EXPECT_EQ(state.at("trials")[0].at("num_failures"), 1);
  testing::expect_all_verify((dir / "search" / grid[0].trial_id).string());
}

TEST(Tuner, ARunnerKilledWithNoRetriesLeftIsAnErrorNamingHowItDied) {
  TempDir dir;
  ResultGrid grid =
      Tuner(kills_its_runner, {{"marker", (dir / "killed").string()}}, {}, run_in(dir)).fit();
  ASSERT_EQ(grid.size(), 1u);
  EXPECT_EQ(grid[0].status, TrialStatus::kError);
  ASSERT_TRUE(grid[0].error.has_value());
  EXPECT_NE(grid[0].error->find("killed by signal 9"), std::string::npos) << *grid[0].error;
}

TEST(Tuner, AMalformedStatePeriodIsRefusedNamingTheVariable) {
  TempDir dir;
  ::setenv("CAIRN_TUNE_STATE_PERIOD_S", "soon", 1);
  testing::expect_error_naming(ErrorCode::kInvalidArgument, "CAIRN_TUNE_STATE_PERIOD_S", [&] {
    Tuner(counting_trainable, {{"x", 1.0}}, {}, run_in(dir)).fit();
  });
  ::setenv("CAIRN_TUNE_STATE_PERIOD_S", "0", 1);  // save whenever something changed
  ResultGrid grid =
      Tuner(counting_trainable, {{"x", grid_search({1.0, 2.0})}}, {}, run_in(dir, "every_change"))
          .fit();
  ::unsetenv("CAIRN_TUNE_STATE_PERIOD_S");
  EXPECT_GE(grid.stats().state_saves, 4u);
  EXPECT_EQ(grid.num_terminated(), 2u);
}

// A checkpoint with every result, num_to_keep = 1, fails once at
// config["fail_at"] (a marker file says it did).
void checkpoint_per_result(const nlohmann::json& config) {
  int step = 0;
  if (auto c = train::get_checkpoint())
    step = std::stoi(slurp(c->as_directory().path() / "step.txt"));
  const fs::path marker = config.at("marker").get<std::string>();
  while (++step <= config.at("iters").get<int>()) {
    if (step == config.at("fail_at").get<int>() && !fs::exists(marker)) {
      write_file(marker, "failed");
      throw std::runtime_error("intentional failure");
    }
    train::TemporaryDirectory tmp;
    write_file(fs::path(tmp.path()) / "step.txt", std::to_string(step));
    train::report({{"step", step}}, Checkpoint::from_directory(tmp.path()));
  }
}

// Retention deletes a checkpoint with every result here, and the saved state
// always names the latest one: a save before each deletion would cost one
// save per checkpoint. Deletions of checkpoints the saved state names wait
// for the next periodic save instead (none comes in this run: the period is
// long), and those still waiting when the trial ends are done then.
TEST(Tuner, RetentionDoesNotForceAStateSavePerCheckpoint) {
  TempDir dir;
  RunConfig run = run_in(dir);
  run.checkpoint_config.num_to_keep = 1;
  const nlohmann::json space = {
      {"iters", 40}, {"fail_at", 3}, {"marker", (dir / "failed").string()}};
  // The trial fails at step 3; the state saved then names its checkpoint.
  ResultGrid grid = Tuner(checkpoint_per_result, space, {}, run).fit();
  ASSERT_EQ(grid[0].status, TrialStatus::kError);
  const std::string experiment = (dir / "search").string();
  ::setenv("CAIRN_TUNE_STATE_PERIOD_S", "100000", 1);
  RestoreOptions resume;
  resume.resume_errored = true;
  grid = Tuner::restore(experiment, checkpoint_per_result, resume).fit();
  ::unsetenv("CAIRN_TUNE_STATE_PERIOD_S");
  ASSERT_EQ(grid.size(), 1u);
  EXPECT_EQ(grid[0].status, TrialStatus::kTerminated) << grid[0].error.value_or("");
  EXPECT_EQ(grid[0].metrics.at("step"), 40);
  // 38 checkpoints committed and 38 deleted. The saves: the reconciled state
  // at the start, one when the trial ended (retention's last deletion, of
  // the checkpoint the first save names) and the final one.
  EXPECT_LE(grid.stats().state_saves, 3u);
  const fs::path trial = dir / "search" / grid[0].trial_id;
  EXPECT_EQ(read_experiment(trial.string()).checkpoints.size(), 1u);
  const nlohmann::json state = nlohmann::json::parse(slurp(dir / "search" / "tuner_state.json"));
  for (const auto& name : state.at("trials")[0].at("checkpoints")) {
    EXPECT_TRUE(fs::exists(trial / name.get<std::string>() / ".cairn" / "manifest.json")) << name;
  }
}

}  // namespace
}  // namespace cairn::tune
