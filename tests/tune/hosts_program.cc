// A tuning program for the tests of trials on several hosts
// (tests/tune/hosts_test.cc), started by a shell loop with torchrun's
// variables, by mpirun or by srun. Every process calls Tuner::fit() and writes what
// it returned or threw to OUT/process-<rank>.json, and its pid to
// OUT/pid-<rank>. Each process's place is $CAIRN_TEST_PLACE (the test sets
// it per process); every trial reports the place and host it ran on.
//
//   tune_hosts_program SCENARIO STORAGE_PATH OUT_DIR
//
// Scenarios: spread (6 trials of 3 checkpointed steps), gpus (4 trials of one
// fake GPU each, 2 per host), lose (2 trials of 4 steps, max_failures 0; a
// trial on place 1 stops before its step 2 until OUT/go exists, for a test
// that kills that place's process), drain (the same, for a test that sends
// SIGTERM to that place's process), rejoin (3 trials of 4 steps, one per
// host at a time; trials on places 0 and 1 stop before step 2 until OUT/go
// exists, for a test that kills place 1's process and starts another).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cairn/error.h"
#include "cairn/tune_schedulers.h"
#include "cairn/tuner.h"
#include "support/files.h"

namespace fs = std::filesystem;
using namespace cairn;
using namespace cairn::tune;

namespace {

using cairn::testing::read_file;
using cairn::testing::write_file_atomically;

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

std::string host() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

double steady_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Steps with a checkpoint each, resuming from the latest.
void stepping(const nlohmann::json& config) {
  const fs::path out = config.at("out").get<std::string>();
  const std::string place = env_or("CAIRN_TEST_PLACE", "?");
  int start = 0;
  if (auto c = train::get_checkpoint())
    start = std::stoi(read_file(c->as_directory().path() / "step.txt"));
  const int steps = config.at("steps").get<int>();
  for (int step = start + 1; step <= steps; ++step) {
    const nlohmann::json hold = config.value("hold", nlohmann::json::array());
    if (step == 2 && std::find(hold.begin(), hold.end(), place) != hold.end()) {
      // The test kills this place's process now.
      write_file_atomically(out / fmt::format("held-{}", train::get_context().experiment_name),
                            place);
      for (int i = 0; i < 600 && !fs::exists(out / "go"); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
    train::TemporaryDirectory tmp;
    write_file_atomically(fs::path(tmp.path()) / "step.txt", std::to_string(step));
    train::report({{"step", step},
                   {"loss", config.at("x").get<double>() / step},
                   {"place", place},
                   {"host", host()},
                   {"resumed_from", start}},
                  Checkpoint::from_directory(tmp.path()));
  }
}

// Holds its fake GPU for a while and says which, where and when.
void gpu_recorder(const nlohmann::json&) {
  const double start = steady_now();
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  train::report({{"gpus", env_or("CUDA_VISIBLE_DEVICES", "<unset>")},
                 {"place", env_or("CAIRN_TEST_PLACE", "?")},
                 {"host", host()},
                 {"start", start},
                 {"end", steady_now()}});
}

nlohmann::json grid_json(const ResultGrid& grid) {
  nlohmann::json trials = nlohmann::json::array();
  for (const TrialResult& r : grid) {
    trials.push_back({{"id", r.trial_id},
                      {"status", std::string(to_string(r.status))},
                      {"metrics", r.metrics},
                      {"error", r.error ? nlohmann::json(*r.error) : nlohmann::json()},
                      {"path", r.path}});
  }
  return {{"trials", trials}, {"path", grid.experiment_path()}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s SCENARIO STORAGE_PATH OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string scenario = argv[1];
  const fs::path out = argv[3];
  const std::string rank =
      env_or("RANK", env_or("OMPI_COMM_WORLD_RANK", env_or("SLURM_PROCID", "0").c_str()).c_str());
  write_file_atomically(out / fmt::format("pid-{}", rank), std::to_string(::getpid()));
  nlohmann::json result;
  try {
    RunConfig run;
    run.name = "hosts_exp";
    run.storage_path = argv[2];
    TuneConfig tc;
    tc.metric = "loss";
    tc.mode = "min";
    TrainFn fn = stepping;
    nlohmann::json space = {{"out", out.string()}, {"steps", 3}};
    if (scenario == "spread" || scenario == "memory_tier") {
      tc.resources_per_trial.cpu = 0.5;
      space["x"] = tune::grid_search({1, 2, 3, 4, 5, 6});
      run.checkpoint_config.memory_tier.enabled = scenario == "memory_tier";
    } else if (scenario == "gpus") {
      tc.metric = "";
      tc.mode = "";
      tc.resources_per_trial.cpu = 0.25;
      tc.resources_per_trial.gpu = 1;
      tc.gpu_ids = {"0", "1"};
      fn = gpu_recorder;
      space = {{"x", tune::grid_search({1, 2, 3, 4})}};
    } else if (scenario == "lose" || scenario == "drain") {
      tc.resources_per_trial.cpu = 0.5;
      run.failure_config.max_failures = 0;
      space["steps"] = 4;
      space["hold"] = {"1"};
      space["x"] = tune::grid_search({1, 2});
    } else if (scenario == "rejoin") {
      // One trial per host at a time: the host's cores per trial.
      tc.resources_per_trial.cpu = std::max(1u, std::thread::hardware_concurrency());
      run.failure_config.max_failures = 0;
      space["steps"] = 4;
      space["hold"] = {"0", "1"};
      space["x"] = tune::grid_search({1, 2, 3});
    } else {
      std::fprintf(stderr, "unknown scenario %s\n", scenario.c_str());
      return 2;
    }
    result = grid_json(Tuner(fn, space, tc, run).fit());
  } catch (const Error& e) {
    result = {{"threw", e.what()}, {"code", std::string(error_code_name(e.code()))}};
  }
  write_file_atomically(out / fmt::format("process-{}.json", rank), result.dump(2));
  return result.contains("threw") ? 1 : 0;
}
