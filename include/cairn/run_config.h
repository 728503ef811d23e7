// Run configuration shared by the training runtime (train.h) and, later, the
// tuning runtime: where an experiment lives, how its checkpoints are kept and
// how failures are handled. Plain values; validate() throws cairn::Error
// (kInvalidArgument) naming the field at fault.
#pragma once

#include <string>

#include "cairn/manager.h"

namespace cairn {

struct FailureConfig {
  // How many times the worker group may fail and be restarted from the latest
  // committed checkpoint. 0: never restart; -1: unlimited.
  int max_failures = 0;
  // Collective-report watchdog, in seconds: once one rank has called
  // report() for the n-th time, every other rank must call it (or upload its
  // checkpoint files) within this time, or the group fails with a kTimeout
  // error naming the ranks that did not arrive. It bounds skew between ranks,
  // not the length of an epoch.
  double report_timeout_s = 1800.0;
  // Preemption (SIGTERM to the driver or a worker): how long, in seconds
  // from the signal, the workers have to save an emergency checkpoint
  // before the group is stopped (docs/train.md, "Preemption").
  double preemption_grace_s = 120.0;

  void validate() const;
};

struct RunConfig {
  // The experiment's name: its folder directly under storage_path, so one
  // folder name: not "", "." or "..", without '/', '\\' or NUL
  // (kInvalidArgument naming RunConfig::name). Empty: a unique name is made
  // from the current time and a random suffix
  // ("cairn_train_2024-05-01_12-00-00.123456_1a2b3c").
  std::string name;
  // Where experiments are stored: a local path, file:// URI or any URI that
  // cairn::open_storage accepts. A leading "~" is the home directory, as in a
  // shell. Empty: $CAIRN_STORAGE_PATH, else ~/cairn_results. Multi-node runs
  // need storage every node can reach. It must not be an experiment folder
  // itself.
  std::string storage_path;
  // What Trainer::fit() does when storage_path/name already holds an
  // experiment (a trainer_state.json, a checkpoint history or checkpoints):
  //   false (default): fit() throws kAlreadyExists, pointing to
  //     Trainer::restore, and changes nothing there;
  //   true: fit() continues that experiment with this Trainer's
  //     configuration: the first get_checkpoint() is its latest committed
  //     checkpoint, numbering and retention history continue (as Ray Train v2
  //     does when a run reuses a name). A name that holds nothing starts a new
  //     experiment either way, so one program can both start and resume.
  bool resume_existing = false;
  CheckpointConfig checkpoint_config;
  FailureConfig failure_config;

  void validate() const;
};

}  // namespace cairn
