// The tuning runtime: Ray Tune's Tuner as a native library. A hyperparameter
// search runs many trials; each trial is a training run with its own
// configuration, checkpoints, retention and result history, and the whole
// experiment survives crashes of trials and of the driver. docs/tune.md is
// the guide; this header is the contract.
//
//   cairn::tune::Tuner tuner(train_fn, {{"lr", cairn::tune::loguniform(1e-4, 1e-1)}},
//                            {.metric = "loss", .mode = "min", .num_samples = 8},
//                            cairn::RunConfig{.name = "search", .storage_path = "/results"});
//   cairn::tune::ResultGrid grid = tuner.fit();
//   const auto& best = grid.get_best_result();
//
// Trials are processes. fit() is the experiment's driver: for each running
// trial it forks a trial runner process, which runs the trial exactly as
// Trainer::fit() runs a training (cairn/train.h): `scaling.num_workers`
// worker processes, collective report(), checkpoints committed manifest
// last, the trial's own retention (RunConfig::checkpoint_config) and
// restarts from its latest checkpoint (RunConfig::failure_config). Inside a
// function trainable, train::report(), train::get_checkpoint() and
// train::get_context() work as in the Trainer; get_context().experiment_name
// is the trial id. At most TuneConfig::max_concurrent_trials trials run at
// once. Trial runners and their workers die with the driver (even by
// SIGKILL). As with the Trainer, call fit() from a thread that lives for the
// whole run, without other threads holding locks.
//
// Several hosts. Started on every host by mpirun, srun or a launcher that
// sets torchrun's variables (ScalingConfig::launcher: kAuto finds the
// launch, kMpi/kEnv insist on one), every process calls fit(): process 0
// runs the experiment and trials on its host, every other process runs the
// trials placed on its host (the least loaded host with room and free GPUs;
// per-host GPUs and cores). The storage must be shared (kInvalidArgument
// naming the host that cannot see it, before any trial starts). A host
// that is lost takes its runners with it and its trials resume elsewhere
// from their latest checkpoints, not counted as failures. Every process
// returns the same ResultGrid, or throws the same error.
//
// Layout (any storage URI; RunConfig::storage_path/name):
//   <experiment>/tuner_state.json   the experiment state (below)
//   <experiment>/.cairn.lock        held by the driver while fit() runs
//   <experiment>/trial_00000/       one trial: a Trainer experiment folder
//                                   (trainer_state.json, checkpoint_manager.json,
//                                   checkpoint_NNNNNN/, result.json,
//                                   progress.csv, events.out.tfevents.*)
//                                   plus params.json, the trial's config
//   <experiment>/.cairn_clones/     checkpoints copied for PBT, while pending
//
// Each round a trial reports reaches the driver before the trial's workers
// go on: the stop criteria, the scheduler and the callbacks see it, and the
// trial continues, checkpoints, pauses or stops as they decide.
//
// Experiment state. tuner_state.json (replaced atomically) holds every
// trial's id, status, config, last result, min/max/last of each numeric
// metric, failure count, error, kept checkpoints, plus the searcher's and the
// scheduler's state. It is saved when a PBT clone is decided or a trial
// fails for good, at the end, and otherwise every period while something
// changed: 100 times the last save's duration, at least 1 s (so periodic
// saving takes at most 1% of the wall time), or $CAIRN_TUNE_STATE_PERIOD_S
// seconds. The state never names a deleted checkpoint: a trial's retention
// deletes a checkpoint the saved state names only after the next save (it
// stays committed until then, at most a period longer; whatever the
// checkpoint rate, retention adds no saves). A trial's own folder is
// the truth for its checkpoints and history; the state is the truth for
// statuses, configurations and the search, and restore() reconciles the two.
//
// Iterations. A result's training_iteration counts the trial's results, and
// as in Ray a trial that restarts (a failure, a pause, a driver's crash, a
// PBT clone) goes on from the training_iteration of the checkpoint it resumes
// from (0 without one), so stop criteria and schedulers' budgets count the
// iterations trained, not the rounds repeated; result.json then holds a
// repeated round twice.
//
// Failure. A trial whose workers fail, or whose runner process dies, is
// restarted from its latest committed checkpoint while
// RunConfig::failure_config.max_failures allows (one budget per trial, across
// its runners); then it is ERROR and the experiment goes on. An experiment
// in which nothing runs and nothing can start (a scheduler that chooses no
// waiting trial, a searcher that suggests nothing yet is not finished) fails
// with kFailedPrecondition rather than wait forever. Errors of the
// experiment itself (a malformed space or configuration, storage that cannot
// be used, an experiment locked by another live driver, a name already
// holding an experiment for a new Tuner) throw cairn::Error from the
// constructor or fit() with what is at fault named.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cairn/run_config.h"
#include "cairn/train.h"
#include "cairn/tune.h"
#include "cairn/tune_schedulers.h"

namespace cairn::tune {

// A class trainable (Ray's tune.Trainable). One instance per trial process:
// setup(config), then load_checkpoint(dir) if the trial resumes, then step()
// until the trial stops; save_checkpoint(dir) whenever a checkpoint is due
// (CheckpointConfig::checkpoint_frequency / checkpoint_at_end, a step's
// "should_checkpoint", a callback, a pause); cleanup() at a clean end. Runs
// with one worker.
class Trainable {
 public:
  virtual ~Trainable() = default;
  virtual void setup(const nlohmann::json& config) { (void)config; }
  // One training iteration's result: a JSON object of metrics. Reserved
  // keys: "done": true ends the trial after this result; "should_checkpoint":
  // true saves a checkpoint with it (the key is removed from the result).
  virtual nlohmann::json step() = 0;
  // Write the state into `checkpoint_dir` (an empty local directory).
  virtual void save_checkpoint(const std::string& checkpoint_dir) = 0;
  // Read back what save_checkpoint wrote (a local directory).
  virtual void load_checkpoint(const std::string& checkpoint_dir) = 0;
  virtual void cleanup() {}
  // PBT's exploit in place: adopt `new_config` and return true, and the
  // trial goes on in this process with load_checkpoint() of the cloned
  // checkpoint next; return false (the default) and this instance is
  // cleaned up and replaced by a fresh one (setup(new_config), then
  // load_checkpoint) in the same process.
  virtual bool reset_config(const nlohmann::json& new_config) {
    (void)new_config;
    return false;
  }
};

using TrainableFactory = std::function<std::unique_ptr<Trainable>()>;

// What the driver knows of a trial (callbacks, stoppers, results).
struct TrialInfo {
  std::string trial_id;  // "trial_00003": also its folder name
  std::size_t index = 0;
  nlohmann::json config;
  TrialStatus status = TrialStatus::kPending;
  nlohmann::json last_result;  // null before the first
  std::string path;            // the trial's folder, as a path or URI
  int num_failures = 0;
  std::optional<std::string> error;
  std::optional<std::string> latest_checkpoint;  // folder name in the trial's folder
};

// Ray's Stopper: asked after every result of every trial.
class Stopper {
 public:
  virtual ~Stopper() = default;
  // True ends this trial (TERMINATED).
  virtual bool operator()(const std::string& trial_id, const nlohmann::json& result) = 0;
  // True ends the whole experiment: running trials are stopped at their next
  // result, pending ones never start. Asked after every result and between
  // results (the driver's loop, about every 100 ms), on the driver's thread.
  virtual bool stop_all() { return false; }
};

// Hooks called on the driver's thread; an exception from one fails fit().
class Callback {
 public:
  virtual ~Callback() = default;
  virtual void on_trial_start(const TrialInfo& trial) { (void)trial; }
  // May change `result` before the stop criteria, the scheduler and the
  // state see it; setting result["should_checkpoint"] = true asks a class
  // trainable for a checkpoint before its next step (a function trainable
  // decides in its own loop when to checkpoint, so there it changes nothing).
  virtual void on_trial_result(const TrialInfo& trial, nlohmann::json& result) {
    (void)trial;
    (void)result;
  }
  virtual void on_trial_complete(const TrialInfo& trial) { (void)trial; }
  virtual void on_trial_error(const TrialInfo& trial) { (void)trial; }
  // A checkpoint of `trial` was committed (its folder name in the trial's folder).
  virtual void on_checkpoint(const TrialInfo& trial, const std::string& checkpoint) {
    (void)trial;
    (void)checkpoint;
  }
  virtual void on_experiment_end(const std::vector<TrialInfo>& trials) { (void)trials; }
};

// What one trial needs (Ray's tune.with_resources).
struct TrialResources {
  // Cores. With max_concurrent_trials 0, the trials that run at once are the
  // machine's cores divided by this (0: by ScalingConfig::num_workers).
  double cpu = 0;
  // GPUs: a whole number of them, which no other trial holds any share of,
  // or a fraction of one (0.5: two such trials share a GPU), shared with
  // other fractional trials up to a whole. A trial waits until its GPUs are
  // free, and its runner and workers see only those: CUDA_VISIBLE_DEVICES is
  // set to their ids. 0: the trial's environment is left as it is.
  double gpu = 0;
};

struct TuneConfig {
  std::string metric;  // what get_best_result and the schedulers rank by
  std::string mode;    // "max" or "min" (required with a metric)
  // Repetitions of the search space's grid (BasicVariantGenerator); >= 1.
  int num_samples = 1;
  // Trials running at once; 0: the CPU cores divided by the workers per
  // trial (at least 1).
  int max_concurrent_trials = 0;
  std::shared_ptr<TrialScheduler> scheduler;  // null: FIFOScheduler
  std::shared_ptr<Searcher> search_alg;       // null: BasicVariantGenerator over the space
  std::uint64_t seed = 0;                     // for the default searcher
  // Stop criteria (Ray's RunConfig(stop={...})): a trial stops at the first
  // result in which any of these keys holds a number >= the given value,
  // e.g. {"training_iteration": 10, "accuracy": 0.95}.
  nlohmann::json stop = nlohmann::json::object();
  std::shared_ptr<Stopper> stopper;  // also asked, after `stop`
  // Ray's time_budget_s: > 0 ends the experiment once it has run this many
  // seconds (the time of every fit() of it, restores included, as Ray
  // counts it): no trial starts after that, and each running trial is
  // stopped (TERMINATED) at its next result, as by a Stopper whose
  // stop_all() turned true; a trial is not cut off between two results.
  // Trials that never started stay PENDING (a restore with a budget left
  // runs them). 0: no budget.
  double time_budget_s = 0;
  TrialResources resources_per_trial;
  // The GPUs trials may be given, as CUDA_VISIBLE_DEVICES names them; empty:
  // this process's CUDA_VISIBLE_DEVICES when set, else the machine's GPUs
  // (/proc/driver/nvidia/gpus). A trial asking more than there are is
  // refused when fit() starts (kInvalidArgument), since it could never run.
  std::vector<std::string> gpu_ids;
  std::vector<std::shared_ptr<Callback>> callbacks;
  // The functions of the space's sample_from domains, by name (see
  // cairn/tune.h); every one the space names must be here. Code, so given
  // again to restore() while trials remain to be drawn.
  SampleFunctions sample_functions;

  void validate() const;  // kInvalidArgument naming the field
};

// One trial's outcome: the Trainer's Result (metrics, checkpoint,
// best_checkpoints, path, error, metrics_history) plus the trial's identity.
struct TrialResult : Result {
  std::string trial_id;
  nlohmann::json config;
  TrialStatus status = TrialStatus::kPending;
};

// What running the experiment cost the driver (ResultGrid::stats()).
struct ExperimentStats {
  double wall_seconds = 0;        // fit() from start to end
  std::size_t state_saves = 0;    // tuner_state.json writes
  double state_save_seconds = 0;  // time spent writing them
  double last_state_save_seconds = 0;
  std::size_t last_state_bytes = 0;  // size of the last state written
  std::size_t trial_starts = 0;      // runner processes started (resumes included)
  // From forking a trial's runner to the trial's first report reaching the
  // driver (its trainable's first step included), summed over the starts
  // that reported.
  double trial_start_seconds = 0;
  std::size_t trial_starts_timed = 0;
  std::size_t results = 0;  // report rounds received
};

class ResultGrid {
 public:
  ResultGrid() = default;
  ResultGrid(std::vector<TrialResult> results, std::string metric, std::string mode,
             std::string experiment_path);

  std::size_t size() const { return results_.size(); }
  const TrialResult& operator[](std::size_t i) const { return results_.at(i); }
  std::vector<TrialResult>::const_iterator begin() const { return results_.begin(); }
  std::vector<TrialResult>::const_iterator end() const { return results_.end(); }
  std::size_t num_errors() const;
  std::size_t num_terminated() const;
  const std::string& experiment_path() const { return experiment_path_; }
  // TuneConfig's metric and mode, get_best_result()'s defaults.
  const std::string& metric() const { return metric_; }
  const std::string& mode() const { return mode_; }
  const ExperimentStats& stats() const { return stats_; }
  void set_stats(const ExperimentStats& stats) { stats_ = stats; }
  // Whether fit() ended early on SIGTERM (Tuner::fit): the running trials
  // were paused with a checkpoint where they made one in time, and
  // Tuner::restore(experiment_path(), ...).fit() goes on from there.
  bool preempted() const { return preempted_; }
  void set_preempted(bool preempted) { preempted_ = preempted; }

  // The trial with the best `metric` (TuneConfig's when empty) in `mode`,
  // judged by `scope`: "last" (its last result), "all" (its best result
  // ever), "avg" (the mean over its results), "last-5-avg", "last-10-avg".
  // Trials without the metric are skipped (errored trials too, unless
  // nothing else has it). kInvalidArgument for a missing metric/mode or an
  // unknown scope; kNotFound if no trial reported the metric.
  const TrialResult& get_best_result(std::string metric = "", std::string mode = "",
                                     std::string_view scope = "last") const;

 private:
  std::vector<TrialResult> results_;
  std::string metric_;
  std::string mode_;
  std::string experiment_path_;
  ExperimentStats stats_;
  bool preempted_ = false;
};

struct RestoreOptions {
  bool resume_unfinished = true;  // RUNNING, PAUSED and PENDING trials go on
  bool resume_errored = false;    // ERROR trials resume from their latest checkpoint
  bool restart_errored = false;   // ERROR trials start again from scratch
};

class Tuner {
 public:
  // Function trainable (as train_fn of a Trainer; its argument is the
  // trial's config) or class trainable. `scaling` is per trial (a class
  // trainable needs num_workers == 1). Validates everything up front:
  // kInvalidArgument naming the field (space, TuneConfig, RunConfig,
  // checkpoint_frequency/checkpoint_at_end with a function trainable).
  Tuner(TrainFn trainable, nlohmann::json param_space, TuneConfig tune_config = {},
        RunConfig run_config = {}, ScalingConfig scaling = {});
  Tuner(TrainableFactory trainable, nlohmann::json param_space, TuneConfig tune_config = {},
        RunConfig run_config = {}, ScalingConfig scaling = {});

  // Runs the experiment to its end (see the top of this file).
  // SIGTERM to the driver while it runs is a preemption notice, not an end
  // (docs/tune.md, "Preemption"): no trial starts any more, each running
  // trial is paused at its next result with a checkpoint (a function
  // trainable sees train::should_checkpoint()), and once none runs, or
  // FailureConfig::preemption_grace_s after the signal, fit() saves the
  // experiment state and returns a ResultGrid whose preempted() is true.
  ResultGrid fit();
  // The results of a restored experiment as its state stands, without
  // running anything (Ray's Tuner.get_results() after Tuner.restore): each
  // trial's status, config and error as last saved, its metrics, history
  // and checkpoints read from its folder. kFailedPrecondition for a Tuner
  // that was not restored (fit() returns its results).
  ResultGrid get_results() const;

  // True if `path` holds a Tuner experiment (tuner_state.json). kCorruption
  // naming the file if that state is damaged.
  static bool can_restore(std::string_view path);
  // The experiment at `path`, to continue with fit(): unfinished trials go
  // on from their latest checkpoints (RUNNING ones were interrupted), errored
  // ones as `options` say, and the searcher goes on without repeating a
  // configuration. The space, TuneConfig's metric/mode/num_samples/seed/
  // max_concurrent_trials/stop/time_budget_s (with the time already used)/
  // resources_per_trial
  // and the RunConfig come from the state; the
  // trainable, scheduler, searcher, stopper and callbacks (which are code) are
  // given again here: a scheduler or searcher given must be of the kind saved
  // (its saved state is restored into it), and when none is given a saved
  // FIFO, ASHA or PBT scheduler (from the options saved with its state; not
  // a PBT whose mutations are functions) or default searcher is rebuilt.
  // The space's sample_from functions are needed again only while the
  // default searcher has trials left to draw (kInvalidArgument naming the
  // key path otherwise). kNotFound without a state at `path`; kCorruption
  // if it is damaged.
  static Tuner restore(std::string_view path, TrainFn trainable, RestoreOptions options = {},
                       TuneConfig code = {});
  static Tuner restore(std::string_view path, TrainableFactory trainable,
                       RestoreOptions options = {}, TuneConfig code = {});

  const RunConfig& run_config() const { return run_config_; }
  const TuneConfig& tune_config() const { return tune_config_; }

 private:
  static Tuner restore_impl(std::string_view path, TrainFn fn, TrainableFactory cls,
                            RestoreOptions options, TuneConfig code);
  void check();

  TrainFn fn_;
  TrainableFactory cls_;
  nlohmann::json param_space_;
  TuneConfig tune_config_;
  RunConfig run_config_;
  ScalingConfig scaling_;
  std::optional<RestoreOptions> restore_;
  nlohmann::json restored_state_;  // the state read by restore()
};

}  // namespace cairn::tune
