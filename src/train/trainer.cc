#include <cstdlib>

#include <fmt/format.h>

#include "cairn/error.h"
#include "cairn/train.h"
#include "experiment/layout.h"
#include "experiment/location.h"
#include "experiment/results.h"
#include "experiment/trainer_state.h"
#include "manager/memory_tier.h"
#include "train/control/driver.h"
#include "train/control/group.h"
#include "train/env_launch.h"
#include "train/job_boot.h"
#include "train/mpi.h"
#include "util/json.h"
#include "util/log.h"
#include "util/settings.h"

namespace cairn {

void FailureConfig::validate() const {
  if (max_failures < -1) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("FailureConfig::max_failures is {}; use -1 (unlimited) or >= 0", max_failures));
  }
  if (!(report_timeout_s > 0)) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("FailureConfig::report_timeout_s is {}; it must be > 0", report_timeout_s));
  }
  if (!(preemption_grace_s >= 0)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("FailureConfig::preemption_grace_s is {}; it must be >= 0",
                            preemption_grace_s));
  }
}

void RunConfig::validate() const {
  checkpoint_config.validate();
  failure_config.validate();
  // Stored in trainer_state.json, which is JSON: it cannot hold other bytes.
  if (!is_valid_utf8(storage_path)) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("RunConfig::storage_path \"{}\" is not valid UTF-8", printable(storage_path)));
  }
  if (name.empty()) return;  // a default name is made by fit()
  experiment::check_experiment_name(name, "RunConfig::name");
  try {
    validate_key(name);
  } catch (const Error& e) {
    throw with_context(e, "RunConfig::name");
  }
}

void ScalingConfig::validate() const {
  if (num_workers < 0 || (num_workers == 0 && launcher == Launcher::kLocal)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("ScalingConfig::num_workers is {}; it must be >= 1", num_workers));
  }
  if (min_workers < 0 || (min_workers > 0 && num_workers > 0 && min_workers > num_workers)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("ScalingConfig::min_workers is {}; it must be 0 (a fixed group) or "
                            "between 1 and num_workers ({})",
                            min_workers, num_workers));
  }
  if (min_workers > 0 && num_workers == 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("ScalingConfig::min_workers is {} but num_workers is 0; an elastic "
                            "group needs its largest size in num_workers",
                            min_workers));
  }
}

std::optional<std::string> train::environment_value(std::string_view name) {
  return Environment::process().get(name);
}

Trainer::Trainer(TrainFn train_fn, nlohmann::json train_loop_config, ScalingConfig scaling_config,
                 RunConfig run_config, std::optional<Checkpoint> resume_from_checkpoint)
    : train_fn_(std::move(train_fn)),
      train_loop_config_(std::move(train_loop_config)),
      scaling_config_(scaling_config),
      run_config_(std::move(run_config)),
      resume_from_checkpoint_(std::move(resume_from_checkpoint)) {
  if (!train_fn_) throw Error(ErrorCode::kInvalidArgument, "Trainer: train_fn is empty");
  scaling_config_.validate();
  run_config_.validate();
  train_internal::refuse_class_trainable_triggers(run_config_.checkpoint_config, "Trainer");
  // Stored with the experiment for Trainer::restore, and sent to every worker.
  check_storable_json(train_loop_config_, "Trainer: train_loop_config");
}

Result Trainer::fit() {
  train_internal::DriverSpec spec;
  spec.train_fn = train_fn_;
  spec.train_loop_config = train_loop_config_;
  spec.run = run_config_;
  spec.resume_from_checkpoint = resume_from_checkpoint_;
  spec.restoring = restoring_;

  const bool mpi =
      scaling_config_.launcher == Launcher::kMpi ||
      (scaling_config_.launcher == Launcher::kAuto && train_internal::launched_by_mpi());
  if (mpi) return train_internal::fit_mpi(spec, scaling_config_);
  if (scaling_config_.launcher == Launcher::kEnv || scaling_config_.launcher == Launcher::kAuto) {
    const Settings settings = Settings::from(Environment::process());
    if (auto env = train_internal::env_launch_from(settings)) {
      return train_internal::fit_env(spec, scaling_config_, *env);
    }
    if (scaling_config_.launcher == Launcher::kEnv)
      throw train_internal::env_launch_missing(settings);
  }

  if (scaling_config_.num_workers < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                "ScalingConfig::num_workers must be >= 1 for the local launcher");
  }
  spec.world_size = scaling_config_.num_workers;
  spec.min_world_size = scaling_config_.min_workers;  // no rank is lost here; stored for restore
  auto loc = experiment::locate_experiment(run_config_.storage_path, run_config_.name);
  spec.run.name = loc.name;
  spec.run.storage_path = loc.storage_path;
  spec.experiment_uri = loc.uri;
  spec.experiment_path = loc.path;
  return train_internal::run_driver(spec, train_internal::start_local_group);
}

bool Trainer::can_restore(std::string_view path) {
  return experiment::read_trainer_state(path).is_object();
}

Trainer Trainer::restore(std::string_view path, TrainFn train_fn,
                         std::optional<nlohmann::json> train_loop_config) {
  nlohmann::json state = experiment::read_trainer_state(path);
  if (!state.is_object()) {
    throw Error(
        ErrorCode::kNotFound,
        fmt::format("{}: no trainer state here (trainer_state.json); nothing to restore", path));
  }
  // The experiment is the one at `path`, wherever it was when it ran: the
  // stored name and storage path are only where it used to be.
  const experiment::ExperimentParts where = experiment::split_experiment_path(path);
  RunConfig run;
  run.name = where.name;
  run.storage_path = where.storage_path;
  ScalingConfig scaling;
  std::optional<Checkpoint> resume;
  try {
    run.checkpoint_config =
        CheckpointConfig::from_json(state.value("checkpoint_config", nlohmann::json::object()));
    const nlohmann::json fc = state.value("failure_config", nlohmann::json::object());
    run.failure_config.max_failures = fc.value("max_failures", 0);
    run.failure_config.report_timeout_s = fc.value("report_timeout_s", 1800.0);
    run.failure_config.preemption_grace_s = fc.value("preemption_grace_s", 120.0);
    scaling.num_workers = state.value("num_workers", 1);
    scaling.min_workers = state.value("min_workers", 0);
    if (state.contains("resume_from_checkpoint") && state["resume_from_checkpoint"].is_string()) {
      resume = Checkpoint::from_directory(state["resume_from_checkpoint"].get<std::string>());
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("{}/{}: a stored setting has the wrong type: {}", path,
                            experiment::kTrainerStateKey, e.what()));
  }
  Trainer t(std::move(train_fn),
            train_loop_config ? *train_loop_config
                              : state.value("train_loop_config", nlohmann::json::object()),
            scaling, run, resume);
  t.restoring_ = true;
  return t;
}

Result Result::from_path(std::string_view path) {
  ExperimentListing listing = read_experiment(path);
  try {
    // A run that died leaves its newest checkpoints in this host's memory tier.
    merge_memory_tier(open_storage(path)->uri(), listing);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kCorruption) throw;
    log::warn(fmt::format("{}: the memory tier is left out: {}", path, e.what()));
  }
  nlohmann::json state = experiment::read_trainer_state(path);
  if (!state.is_object() && listing.checkpoints.empty()) {
    throw Error(
        ErrorCode::kNotFound,
        fmt::format("{}: no experiment here (no trainer_state.json, no checkpoints)", path));
  }
  Result r;
  r.path = std::string(path);
  if (!listing.checkpoints.empty()) r.checkpoint = listing.checkpoints.back().checkpoint;
  for (const auto& rec : rank_checkpoints(listing.checkpoints, listing.config)) {
    r.best_checkpoints.push_back({rec.checkpoint, rec.metrics});
  }
  r.metrics = nlohmann::json::object();
  if (state.is_object() && state["metrics"].is_object()) {
    r.metrics = state["metrics"];
  } else if (!listing.checkpoints.empty() && listing.checkpoints.back().metrics.is_object()) {
    r.metrics = listing.checkpoints.back().metrics;  // a driver that died: the last committed
  }
  if (state.is_object() && state["error"].is_string()) r.error = state["error"].get<std::string>();
  r.preempted = state.is_object() && state.value("status", nlohmann::json()) == "preempted";
  r.metrics_history = experiment::read_result_rows(*open_storage(path));
  return r;
}

}  // namespace cairn
