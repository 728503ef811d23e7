// The driver: runs attempts of a group until the training finishes or the
// failure budget is spent, commits distributed checkpoints and keeps the
// trainer's state in the experiment folder.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "cairn/train.h"
#include "train/group.h"

namespace cairn::train_internal {

inline constexpr std::string_view kTrainerStateKey = "trainer_state.json";

using GroupFactory = std::function<std::unique_ptr<Group>(const LaunchSpec&)>;

struct DriverSpec {
  TrainFn train_fn;
  nlohmann::json train_loop_config;
  int world_size = 1;
  RunConfig run;  // name and storage_path resolved
  std::optional<Checkpoint> resume_from_checkpoint;
  bool restoring = false;
  std::string experiment_uri;
  std::string experiment_path;  // as shown to users (a plain path for local storage)
  // Called once the experiment is open and locked, before the first group
  // starts (the MPI launcher checks that every node sees the storage here).
  std::function<void()> before_start;
};

Result run_driver(const DriverSpec& spec, const GroupFactory& start_group);

// Resolves RunConfig's defaults and the experiment's location.
struct ExperimentLocation {
  std::string name;
  std::string storage_path;
  std::string uri;   // normalized URI of the experiment folder
  std::string path;  // a plain path for local storage, else the URI
};
ExperimentLocation locate_experiment(const RunConfig& run);

// The trainer state file, for restore and Result::from_path.
nlohmann::json read_trainer_state(std::string_view experiment_uri);  // null if absent

}  // namespace cairn::train_internal
