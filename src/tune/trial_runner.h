// The trial runner: the process the Tuner forks for each running trial. It
// runs the trial as a Trainer run (train/control/driver.h) in the trial's folder and
// asks the Tuner, over a channel, what to do after every report round.
//
//   runner -> tuner  {"t":"round","row":{...}|null,"checkpoint":name|null,"kept":[names]}
//   tuner -> runner  {"save":bool,"stop":bool,"end":bool}   (RoundDirective)
//   runner -> tuner  {"t":"retire","doomed":[names],"kept":[names]}  before
//                    retention deletes checkpoints
//   tuner -> runner  {"defer":[names]}   those to keep until the Tuner's next save
//   runner -> tuner  {"t":"end","status":"finished"|"stopped"|"preempted"|"errored",
//                     "error":text|null,"failures":n}
//
// A runner that exits without "end" died (a crash, or a kill): the Tuner
// counts a failure. A runner that finds the Tuner gone (its channel closed)
// dies at once with SIGKILL, as its death signal would kill it, leaving its
// trial's trainer_state.json "running": the trial was interrupted, not
// failed, and Tuner::restore resumes it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cairn/error.h"
#include "cairn/run_config.h"
#include "cairn/train.h"
#include "cairn/tuner.h"
#include "util/fs.h"

namespace cairn::tune_internal {

struct RunnerSpec {
  TrainFn train_fn;  // the function trainable, or the class trainable's loop
  nlohmann::json config;
  int num_workers = 1;
  RunConfig run;  // name = the trial id, storage_path = the experiment's URI
  std::string trial_uri;
  std::string trial_path;  // as shown to users
  // What the trial asked for (TuneConfig::resources_per_trial; 0: not
  // given), exported to its processes as CAIRN_TRIAL_RESOURCES.
  tune::TrialResources resources;
};

// Runs `open` (something that takes a trial's lock) again while it throws
// kLocked, for at most about 30 s: after a driver crash the trial's lock may
// still be held by a runner of that driver that is dying (a file lock goes
// with the process, an S3 lease only when it expires).
template <class Open>
auto retry_while_locked(Open&& open) -> decltype(open()) {
  for (int attempt = 0;; ++attempt) {
    try {
      return open();
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kLocked || attempt >= 300) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

// For tests: when set, every trial runner calls it right after it asked the
// kernel to kill it with the driver (PR_SET_PDEATHSIG). A test that clears
// that request there forces the interleaving in which a runner sees the
// Tuner's channel close before any death signal arrives.
extern void (*runner_started_hook)();

// Runs in the forked child; returns its exit status. `fd` is its end of the
// channel to the Tuner.
int run_trial(const RunnerSpec& spec, int fd);

// Forks the runner of trial `trial_id`: it dies with this process
// (PR_SET_PDEATHSIG), sees only `gpu_ids` as CUDA_VISIBLE_DEVICES when
// given, and keeps only its end of the channel (as fd 3) and stdio: no other
// trial's channel and no lock of this process (a flock lives while any copy
// of its descriptor does). Returns its pid and this side's end of the
// channel; throws kIO naming the trial.
struct ForkedRunner {
  pid_t pid = -1;
  UniqueFd channel;
};
ForkedRunner fork_runner(const RunnerSpec& spec, const std::vector<std::string>& gpu_ids,
                         const std::string& trial_id);

// The train_fn that drives a class trainable (see tuner.h, Trainable).
TrainFn class_trainable_loop(tune::TrainableFactory factory, int checkpoint_frequency,
                             bool checkpoint_at_end);

}  // namespace cairn::tune_internal
