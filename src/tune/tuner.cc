// The Tuner's public face (cairn/tuner.h): TuneConfig's checks, ResultGrid,
// constructing a Tuner, fit() (which runs a tuner_internal::Experiment,
// tune/experiment.h) and restore() (which reads tuner_state.json through
// experiment/tuner_state.h).
#include "cairn/tuner.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "cairn/error.h"
#include "cairn/manager.h"
#include "cairn/tune_schedulers.h"
#include "experiment/layout.h"
#include "experiment/location.h"
#include "experiment/trainer_state.h"
#include "experiment/tuner_state.h"
#include "train/control/driver.h"
#include "train/job_boot.h"
#include "train/mpi_messages.h"
#include "tune/domain.h"
#include "tune/experiment.h"
#include "tune/gpu_pool.h"
#include "tune/trial_hosts.h"
#include "tune/trial_runner.h"
#include "util/fs.h"
#include "util/json.h"
#include "util/log.h"
#include "util/parse.h"
#include "util/settings.h"

namespace cairn::tune {

using internal::check_mode;

namespace {

using tuner_internal::Experiment;
using tuner_internal::grid_to_json;
using tuner_internal::kStateKey;
using tuner_internal::number_at;
using tuner_internal::refuse_hosts;
using tuner_internal::serve_trials;
using tuner_internal::TrialHosts;

double score_of(const TrialResult& r, const std::string& metric, std::string_view scope) {
  std::vector<double> values;
  for (const auto& row : r.metrics_history) {
    if (auto v = number_at(row, metric)) values.push_back(*v);
  }
  if (values.empty()) {
    if (auto v = number_at(r.metrics, metric)) values.push_back(*v);
  }
  if (values.empty()) return std::nan("");
  if (scope == "last") return values.back();
  size_t from = 0;
  if (scope == "last-5-avg") from = values.size() > 5 ? values.size() - 5 : 0;
  if (scope == "last-10-avg") from = values.size() > 10 ? values.size() - 10 : 0;
  double sum = 0;
  for (size_t i = from; i < values.size(); ++i) sum += values[i];
  return sum / static_cast<double>(values.size() - from);
}

}  // namespace

void TuneConfig::validate() const {
  check_mode(mode, "TuneConfig::mode");
  if (!metric.empty() && mode.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("TuneConfig::metric is \"{}\" but TuneConfig::mode is empty; set it "
                            "to \"max\" or \"min\"",
                            metric));
  }
  if (metric.empty() && !mode.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                "TuneConfig::mode is set but TuneConfig::metric is empty");
  }
  if (num_samples < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("TuneConfig::num_samples must be >= 1, got {}", num_samples));
  }
  if (max_concurrent_trials < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("TuneConfig::max_concurrent_trials must be >= 0 (0: automatic), got {}",
                            max_concurrent_trials));
  }
  if (!(resources_per_trial.cpu >= 0) || !std::isfinite(resources_per_trial.cpu)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("TuneConfig::resources_per_trial.cpu must be a number of cores >= 0, "
                            "got {}",
                            resources_per_trial.cpu));
  }
  tuner_internal::GpuPool::check_form(resources_per_trial.gpu);  // the count when fit() starts
  if (!(time_budget_s >= 0) || !std::isfinite(time_budget_s)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("TuneConfig::time_budget_s must be a number of seconds >= 0 (0: no "
                            "budget), got {}",
                            time_budget_s));
  }
  if (!stop.is_object()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("TuneConfig::stop must be a JSON object of thresholds, got {}",
                            stop.type_name()));
  }
  for (auto it = stop.begin(); it != stop.end(); ++it) {
    if (!it->is_number()) {
      throw Error(
          ErrorCode::kInvalidArgument,
          fmt::format("TuneConfig::stop[\"{}\"] must be a number, got {}", it.key(), it->dump()));
    }
  }
  for (size_t i = 0; i < callbacks.size(); ++i) {
    if (!callbacks[i]) {
      throw Error(ErrorCode::kInvalidArgument, fmt::format("TuneConfig::callbacks[{}] is null", i));
    }
  }
}

ResultGrid::ResultGrid(std::vector<TrialResult> results, std::string metric, std::string mode,
                       std::string experiment_path)
    : results_(std::move(results)),
      metric_(std::move(metric)),
      mode_(std::move(mode)),
      experiment_path_(std::move(experiment_path)) {}

std::size_t ResultGrid::num_errors() const {
  return static_cast<std::size_t>(
      std::count_if(results_.begin(), results_.end(),
                    [](const auto& r) { return r.status == TrialStatus::kError; }));
}

std::size_t ResultGrid::num_terminated() const {
  return static_cast<std::size_t>(
      std::count_if(results_.begin(), results_.end(),
                    [](const auto& r) { return r.status == TrialStatus::kTerminated; }));
}

const TrialResult& ResultGrid::get_best_result(std::string metric, std::string mode,
                                               std::string_view scope) const {
  if (metric.empty()) metric = metric_;
  if (mode.empty()) mode = mode_;
  if (metric.empty() || mode.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                "get_best_result needs a metric and a mode (here or in TuneConfig)");
  }
  check_mode(mode, "get_best_result: mode");
  if (scope != "last" && scope != "all" && scope != "avg" && scope != "last-5-avg" &&
      scope != "last-10-avg") {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("get_best_result: unknown scope \"{}\" (last, all, avg, last-5-avg, "
                            "last-10-avg)",
                            scope));
  }
  const bool max = mode == "max";
  const TrialResult* best = nullptr;
  double best_score = 0;
  for (int pass = 0; pass < 2 && best == nullptr; ++pass) {
    for (const auto& r : results_) {
      if (pass == 0 && r.status == TrialStatus::kError) continue;
      double s;
      if (scope == "all") {
        s = std::nan("");
        for (const auto& row : r.metrics_history) {
          if (auto v = number_at(row, metric)) {
            if (std::isnan(s) || (max ? *v > s : *v < s)) s = *v;
          }
        }
        if (std::isnan(s)) s = score_of(r, metric, "last");
      } else {
        s = score_of(r, metric, scope);
      }
      if (std::isnan(s)) continue;
      if (best == nullptr || (max ? s > best_score : s < best_score)) {
        best = &r;
        best_score = s;
      }
    }
  }
  if (best == nullptr) {
    throw Error(ErrorCode::kNotFound,
                fmt::format("no trial of {} reported the metric \"{}\"", experiment_path_, metric));
  }
  return *best;
}

Tuner::Tuner(TrainFn trainable, nlohmann::json param_space, TuneConfig tune_config,
             RunConfig run_config, ScalingConfig scaling)
    : fn_(std::move(trainable)),
      param_space_(std::move(param_space)),
      tune_config_(std::move(tune_config)),
      run_config_(std::move(run_config)),
      scaling_(scaling) {
  if (!fn_) throw Error(ErrorCode::kInvalidArgument, "Tuner: the trainable is empty");
  train_internal::refuse_class_trainable_triggers(run_config_.checkpoint_config,
                                                  "Tuner (a function trainable)");
  check();
}

Tuner::Tuner(TrainableFactory trainable, nlohmann::json param_space, TuneConfig tune_config,
             RunConfig run_config, ScalingConfig scaling)
    : cls_(std::move(trainable)),
      param_space_(std::move(param_space)),
      tune_config_(std::move(tune_config)),
      run_config_(std::move(run_config)),
      scaling_(scaling) {
  if (!cls_) throw Error(ErrorCode::kInvalidArgument, "Tuner: the trainable factory is empty");
  if (scaling_.num_workers != 1) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("Tuner: a class trainable runs in one worker; "
                            "ScalingConfig::num_workers is {}",
                            scaling_.num_workers));
  }
  check();
}

void Tuner::check() {
  tune_config_.validate();
  run_config_.validate();
  scaling_.validate();
  if (scaling_.min_workers > 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "Tuner: ScalingConfig::min_workers (an elastic group) is for the Trainer; a trial "
                "runs with a fixed number of workers");
  }
  if (scaling_.num_workers < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("Tuner: ScalingConfig::num_workers must be >= 1, got {}",
                            scaling_.num_workers));
  }
  // Validates the space (naming the key path) before anything starts.
  if (!tune_config_.search_alg) {
    ParamSpace(param_space_, tune_config_.sample_functions).require_functions();
  }
  check_storable_json(param_space_, "Tuner: param_space");
  check_storable_json(tune_config_.stop, "TuneConfig::stop");
}

ResultGrid Tuner::fit() {
  Experiment::Spec spec;
  spec.class_trainable = static_cast<bool>(cls_);
  spec.train_fn = cls_ ? tune_internal::class_trainable_loop(
                             cls_, run_config_.checkpoint_config.checkpoint_frequency,
                             run_config_.checkpoint_config.checkpoint_at_end.value_or(true))
                       : fn_;
  spec.param_space = param_space_;
  spec.tune = tune_config_;
  spec.run = run_config_;
  spec.num_workers = scaling_.num_workers;
  spec.restore = restore_;
  spec.saved = restored_state_;
  std::optional<train_internal::JobBoot> boot = train_internal::boot_launch(scaling_.launcher);
  if (!boot) return Experiment(std::move(spec)).run();

  // A launch: process 0 runs the experiment, every other process is a
  // trial host (tune/trial_hosts.h).
  if (boot->world.rank != 0) {
    tune_internal::RunnerSpec local;
    local.train_fn = spec.train_fn;
    local.num_workers = spec.num_workers;
    local.run = spec.run;
    return serve_trials(*boot, spec.tune, local);
  }
  // The name is fixed now, so that the probe and the experiment agree.
  experiment::ExperimentLocation loc;
  try {
    if (spec.run.checkpoint_config.memory_tier.enabled) {
      // A trial's tier is in the memory of the host that runs it, where
      // PBT's exploit and a restore on this host cannot read it.
      throw Error(ErrorCode::kInvalidArgument,
                  "Tuner: CheckpointConfig.memory_tier is for a Tuner on one host; with trial "
                  "hosts (ScalingConfig::launcher) trials save to persistent storage");
    }
    loc = experiment::locate_experiment(spec.run.storage_path, spec.run.name);
  } catch (const Error& e) {
    refuse_hosts(*boot, e);
    throw;
  }
  spec.run.name = loc.name;
  spec.run.storage_path = loc.storage_path;
  // Tells the hosts when it fails.
  auto hosts = std::make_unique<TrialHosts>(*boot, loc.uri, loc.path);
  spec.hosts = hosts.get();
  try {
    ResultGrid grid = Experiment(std::move(spec)).run();
    hosts->end({{"t", "end"}, {"grid", grid_to_json(grid)}});
    return grid;
  } catch (const Error& e) {
    hosts->end({{"t", "end"}, {"error", train_internal::error_to_json(e.code(), e.what())}});
    throw;
  } catch (const std::exception& e) {
    hosts->end(
        {{"t", "end"}, {"error", train_internal::error_to_json(ErrorCode::kInternal, e.what())}});
    throw;
  }
}

namespace {

// The saved state of the experiment at `uri` (its whole document); null
// when it has none.
nlohmann::json saved_tuner_state(const std::string& uri) {
  std::optional<experiment::TunerState> s = experiment::find_tuner_state(*open_storage(uri));
  return s ? std::move(s->doc) : nlohmann::json();
}

}  // namespace

namespace {

std::string experiment_uri_of(std::string_view path) { return experiment::experiment_uri_of(path); }

}  // namespace

bool Tuner::can_restore(std::string_view path) {
  return saved_tuner_state(experiment_uri_of(path)).is_object();
}

Tuner Tuner::restore(std::string_view path, TrainFn trainable, RestoreOptions options,
                     TuneConfig code) {
  if (!trainable)
    throw Error(ErrorCode::kInvalidArgument, "Tuner::restore: the trainable is empty");
  return restore_impl(path, std::move(trainable), nullptr, options, std::move(code));
}

Tuner Tuner::restore(std::string_view path, TrainableFactory trainable, RestoreOptions options,
                     TuneConfig code) {
  if (!trainable) {
    throw Error(ErrorCode::kInvalidArgument, "Tuner::restore: the trainable factory is empty");
  }
  return restore_impl(path, nullptr, std::move(trainable), options, std::move(code));
}

namespace {

// A restored default searcher that has drawn every trial calls no
// sample_from function again: those not given are filled with one that says
// so, should it ever be called. While trials remain, every function is
// needed and check() names the first missing one.
void give_spent_sample_functions(const nlohmann::json& state, const nlohmann::json& space,
                                 TuneConfig& tc, std::string_view path) {
  const ParamSpace parsed(space);
  if (parsed.function_names().empty()) return;
  const nlohmann::json& searcher = state.value("searcher", nlohmann::json::object());
  const nlohmann::json& next = searcher.value("next", nlohmann::json());
  if (!next.is_number_unsigned() || tc.num_samples < 1 ||
      next.get<std::size_t>() < parsed.grid_size() * static_cast<std::size_t>(tc.num_samples)) {
    return;
  }
  const std::string where(path);
  for (const std::string& name : parsed.function_names()) {
    if (tc.sample_functions.count(name) != 0) continue;
    tc.sample_functions[name] = [where, name](const nlohmann::json&,
                                              Rng&) -> std::optional<nlohmann::json> {
      throw Error(
          ErrorCode::kInvalidArgument,
          fmt::format("Tuner::restore({}): sample_from('{}') was not given again", where, name));
    };
  }
}

// The ASHA or PBT scheduler a saved state was made by, from the options
// saved with it, so that a restore given no scheduler (Ray's
// Tuner.restore takes none) goes on with the same one; null for a state
// saved without them. PBT mutations that are functions (code) cannot be
// rebuilt: kInvalidArgument asking for the scheduler.
std::shared_ptr<TrialScheduler> rebuild_scheduler(const nlohmann::json& saved,
                                                  std::string_view path) {
  if (!saved.is_object()) return nullptr;
  const nlohmann::json o = saved.value("options", nlohmann::json());
  const nlohmann::json kind_field = saved.value("scheduler", nlohmann::json());
  if (!o.is_object() || !kind_field.is_string()) return nullptr;
  const std::string kind = kind_field.get<std::string>();
  try {
    if (kind == "asha") {
      ASHAOptions a;
      a.time_attr = o.at("time_attr").get<std::string>();
      a.max_t = o.at("max_t").get<double>();
      a.grace_period = o.at("grace_period").get<double>();
      a.reduction_factor = o.at("reduction_factor").get<double>();
      a.brackets = o.at("brackets").get<int>();
      return std::make_shared<ASHAScheduler>(a);
    }
    if (kind == "pbt") {
      PBTOptions p;
      p.time_attr = o.at("time_attr").get<std::string>();
      p.perturbation_interval = o.at("perturbation_interval").get<double>();
      p.hyperparam_mutations = o.at("hyperparam_mutations");
      p.quantile_fraction = o.at("quantile_fraction").get<double>();
      p.resample_probability = o.at("resample_probability").get<double>();
      // Saved by newer versions; an older state has the defaults.
      p.burn_in_period = o.value("burn_in_period", p.burn_in_period);
      p.perturbation_factor_up = o.value("perturbation_factor_up", p.perturbation_factor_up);
      p.perturbation_factor_down = o.value("perturbation_factor_down", p.perturbation_factor_down);
      const std::optional<std::uint64_t> seed = parse_decimal(o.at("seed").get<std::string>());
      if (!seed) {
        throw Error(ErrorCode::kCorruption,
                    fmt::format("{}: the saved pbt scheduler's seed is not a 64-bit unsigned "
                                "decimal: {}",
                                path, o.at("seed").dump()));
      }
      p.seed = *seed;
      if (internal::contains_domain(p.hyperparam_mutations, "sample_from")) {
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("Tuner::restore({}): the experiment's PBT mutations hold "
                                "functions (code, not saved); pass the scheduler again in "
                                "TuneConfig::scheduler",
                                path));
      }
      return std::make_shared<PopulationBasedTraining>(p);
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("{}: the saved {} scheduler's options: {}", path, kind, e.what()));
  }
  return nullptr;
}

}  // namespace

ResultGrid Tuner::get_results() const {
  if (!restored_state_.is_object()) {
    throw Error(ErrorCode::kFailedPrecondition,
                "Tuner::get_results: this Tuner was not restored; fit() returns its results");
  }
  const experiment::ExperimentLocation loc =
      experiment::locate_experiment(run_config_.storage_path, run_config_.name);
  return tuner_internal::saved_results(restored_state_, loc.uri, loc.path);
}

Tuner Tuner::restore_impl(std::string_view path, TrainFn fn, TrainableFactory cls,
                          RestoreOptions options, TuneConfig code) {
  const experiment::ExperimentParts where = experiment::split_experiment_path(path);
  const std::string uri = experiment_uri_of(path);
  nlohmann::json s = saved_tuner_state(uri);
  if (!s.is_object()) {
    throw Error(
        ErrorCode::kNotFound,
        fmt::format("{}: no tuner state here (tuner_state.json); nothing to restore", path));
  }
  const std::string state_uri = open_storage(uri)->uri_of(kStateKey);
  TuneConfig tc = std::move(code);
  RunConfig run;
  ScalingConfig scaling;
  nlohmann::json space;
  try {
    const bool saved_class = s.at("trainable").get<std::string>() == "class";
    if (saved_class != static_cast<bool>(cls)) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("Tuner::restore({}): the experiment ran a {} trainable; pass one "
                              "of that kind",
                              path, saved_class ? "class" : "function"));
    }
    tc.metric = s.at("metric").get<std::string>();
    tc.mode = s.at("mode").get<std::string>();
    tc.num_samples = s.at("num_samples").get<int>();
    tc.max_concurrent_trials = s.at("max_concurrent_trials").get<int>();
    const std::optional<std::uint64_t> seed = parse_decimal(s.at("seed").get<std::string>());
    if (!seed) {
      throw Error(ErrorCode::kCorruption,
                  fmt::format("{}: the stored seed is not a 64-bit unsigned decimal: {}", state_uri,
                              s.at("seed").dump()));
    }
    tc.seed = *seed;
    tc.stop = s.at("stop");
    tc.time_budget_s = s.value("time_budget_s", 0.0);  // absent before it existed
    const nlohmann::json res = s.value("resources_per_trial", nlohmann::json::object());
    tc.resources_per_trial.cpu = res.value("cpu", 0.0);
    tc.resources_per_trial.gpu = res.value("gpu", 0.0);
    space = s.at("param_space");
    run.name = where.name;
    run.storage_path = where.storage_path;
    const nlohmann::json& cc = s.at("checkpoint_config");
    run.checkpoint_config = CheckpointConfig::from_json(cc);
    run.checkpoint_config.checkpoint_frequency = cc.value("checkpoint_frequency", 0);
    // null: unset (Ray's default for the trainable's kind).
    if (const auto at_end = cc.find("checkpoint_at_end");
        at_end != cc.end() && !at_end->is_null()) {
      run.checkpoint_config.checkpoint_at_end = at_end->get<bool>();
    }
    const nlohmann::json& fc = s.at("failure_config");
    run.failure_config.max_failures = fc.value("max_failures", 0);
    run.failure_config.report_timeout_s = fc.value("report_timeout_s", 1800.0);
    run.failure_config.preemption_grace_s = fc.value("preemption_grace_s", 120.0);
    scaling.num_workers = s.at("num_workers").get<int>();
    scaling.launcher = Launcher::kAuto;  // a launch places trials on its hosts again
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("{}: a stored setting is missing or has the wrong type: {}", state_uri,
                            e.what()));
  }
  // The saved scheduler kind is rebuilt when the caller gives none and it
  // needs no code (FIFO); others must be given.
  std::string sched = "fifo";
  if (s.contains("scheduler") && s["scheduler"].is_object() &&
      s["scheduler"].value("name", nlohmann::json()).is_string()) {
    sched = s["scheduler"]["name"].get<std::string>();
  }
  if (!tc.scheduler && sched != "fifo") {
    tc.scheduler = rebuild_scheduler(s["scheduler"].value("state", nlohmann::json()), path);
  }
  if (!tc.scheduler && sched != "fifo") {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("Tuner::restore({}): the experiment ran the \"{}\" scheduler; pass "
                            "one of that kind in TuneConfig::scheduler (its state is restored "
                            "into it)",
                            path, sched));
  }
  if (!tc.search_alg) give_spent_sample_functions(s, space, tc, path);
  Tuner t = cls ? Tuner(std::move(cls), space, tc, run, scaling)
                : Tuner(std::move(fn), space, tc, run, scaling);
  t.restore_ = options;
  t.restored_state_ = std::move(s);
  return t;
}

}  // namespace cairn::tune
