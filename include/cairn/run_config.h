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

  void validate() const;
};

struct RunConfig {
  // The experiment's name: its folder under storage_path. Empty: a name is
  // made from the current time ("cairn_train_2024-05-01_12-00-00").
  std::string name;
  // Where experiments are stored: a local path, file:// URI or any URI that
  // cairn::open_storage accepts. Empty: $CAIRN_STORAGE_PATH, else
  // ~/cairn_results. Multi-node runs need storage every node can reach.
  std::string storage_path;
  CheckpointConfig checkpoint_config;
  FailureConfig failure_config;

  void validate() const;
};

}  // namespace cairn
