// Trial schedulers: the part of a tuning run that decides, from the results
// trials report, whether each trial goes on, pauses or stops, and which
// waiting trial runs next (Ray Tune's TrialScheduler). Pure logic: a
// scheduler starts no process and touches no storage; the Tuner (tune.h)
// carries out what it decides. docs/tune.md is the guide.
//
// Results are the rows a trial reports (its metrics plus training_iteration,
// time_total_s, timestamp...; docs/train.md, "The run's result files").
// A scheduler's time attribute (default "training_iteration") must be a
// number in every result it is shown (kInvalidArgument naming the trial and
// the attribute otherwise); its metric may be missing, not a number or NaN in
// a result, which then does not count toward any decision. Scores are
// compared as "higher is better" (negated for mode "min").
//
// Determinism: every random choice draws from a tune::Rng seeded at
// construction; save() holds the generator's state, so a restored scheduler
// makes the same choices the saved one would have.
//
// Thread-safety: a scheduler is used by one thread at a time (the Tuner's
// driver).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cairn/tune.h"

namespace cairn::tune {

enum class TrialStatus { kPending, kRunning, kPaused, kTerminated, kError };
// "PENDING", "RUNNING", "PAUSED", "TERMINATED", "ERROR" (as Ray names them).
std::string_view to_string(TrialStatus status);
// The inverse of to_string; kInvalidArgument for any other text.
TrialStatus trial_status_from_string(std::string_view text);

// What a scheduler is told about a trial.
struct TrialView {
  std::string trial_id;
  nlohmann::json config;
  TrialStatus status = TrialStatus::kPending;
  nlohmann::json last_result;   // null before its first result
  bool has_checkpoint = false;  // the trial has a committed checkpoint to resume or clone from
};

struct SchedulerDecision {
  enum Action {
    kContinue,  // keep running
    kPause,     // checkpoint, free the slot, resume later (choose_trial_to_run)
    kStop,      // end the trial now; it is TERMINATED
  };
  Action action = kContinue;
  // Population Based Training's exploit: restart this trial from the latest
  // checkpoint of trial `clone_from` with `new_config`. The Tuner copies that
  // checkpoint at once (so the source's retention cannot take it away),
  // stops the trial and resumes it from the copy in a new process (a class
  // trainable takes it in place: Trainable::reset_config). Only with
  // kContinue.
  std::optional<std::string> clone_from;
  nlohmann::json new_config;
};

class TrialScheduler {
 public:
  virtual ~TrialScheduler() = default;

  // "fifo", "asha", "pbt", ...: stored with the experiment state, checked on
  // restore.
  virtual std::string name() const = 0;
  // Called once by the Tuner before any trial is added, with TuneConfig's
  // metric and mode ("max" or "min"; either may be empty). A scheduler that
  // was built with its own metric/mode keeps them; one that needs a metric
  // and has none throws kInvalidArgument saying so.
  virtual void set_search_properties(const std::string& metric, const std::string& mode) = 0;
  // Adding a trial the scheduler already knows (a restored Tuner re-adding
  // its trials) keeps what the scheduler holds for it.
  virtual void on_trial_add(const TrialView& trial) = 0;
  // kInvalidArgument for a trial never added.
  virtual SchedulerDecision on_trial_result(const TrialView& trial,
                                            const nlohmann::json& result) = 0;
  // The trial finished on its own or was stopped (TERMINATED).
  virtual void on_trial_complete(const TrialView& trial, const nlohmann::json& result) = 0;
  // The trial failed for good (ERROR).
  virtual void on_trial_error(const TrialView& trial) = 0;
  // Of `candidates` (PENDING or PAUSED trials, in trial order), the one to
  // run next, or nothing to leave the free slot empty for now.
  virtual std::optional<std::string> choose_trial_to_run(
      const std::vector<TrialView>& candidates) = 0;
  // The whole state as JSON; restore(save()) on a scheduler built with the
  // same arguments continues exactly where the saved one stood.
  // kInvalidArgument (scheduler unchanged) for a state of another kind.
  virtual nlohmann::json save() const = 0;
  virtual void restore(const nlohmann::json& state) = 0;
};

// Runs trials in order, never pauses or stops one. choose_trial_to_run takes
// the first PENDING candidate, else the first PAUSED one.
class FIFOScheduler final : public TrialScheduler {
 public:
  std::string name() const override { return "fifo"; }
  void set_search_properties(const std::string&, const std::string&) override {}
  void on_trial_add(const TrialView&) override {}
  SchedulerDecision on_trial_result(const TrialView&, const nlohmann::json&) override { return {}; }
  void on_trial_complete(const TrialView&, const nlohmann::json&) override {}
  void on_trial_error(const TrialView&) override {}
  std::optional<std::string> choose_trial_to_run(const std::vector<TrialView>& candidates) override;
  nlohmann::json save() const override;
  void restore(const nlohmann::json& state) override;
};

// Asynchronous successive halving (ASHA, Li et al. 2018; Ray's
// ASHAScheduler). Rungs at time_attr = grace_period * reduction_factor^k
// below max_t. When a trial reaches a rung, its metric joins that rung's
// recorded values; it is stopped unless it is within the top
// 1/reduction_factor of them (the first value a rung records goes on). A trial whose time attribute
// reaches max_t is stopped (it is done). Uses the metric of the first result at or past the rung (a
// trial skipping a rung milestone is judged at the next result past it, once per rung).
//
// Exactly: on a result with t < max_t and a usable metric, the rung that
// judges is the highest one with milestone <= t; if the trial already has a
// value there it goes on (rungs it skipped get no value from it). Otherwise
// its score s is judged against the rung's values v recorded before it (n
// of them; none: it goes on), then joins them. The cutoff is their
// (1 - 1/reduction_factor) quantile by linear interpolation between closest
// ranks (numpy's default, as Ray 2.x's ASHA): with v sorted ascending,
// p = (1 - 1/rf) * (n - 1), cutoff = v[floor(p)] + frac(p) *
// (v[floor(p) + 1] - v[floor(p)]); the trial stops when s < cutoff. Bracket b (0-based) has the
// rungs with k >= b; trials go to brackets in the order they are added, round-robin. Rung values
// stay when a trial completes or fails: they still set the bar.
struct ASHAOptions {
  std::string time_attr = "training_iteration";
  std::string metric;  // empty: TuneConfig's
  std::string mode;    // "max" or "min"; empty: TuneConfig's
  double max_t = 100;
  double grace_period = 1;
  double reduction_factor = 4;
  int brackets = 1;  // >= 1; trials go to brackets round-robin
};

class ASHAScheduler final : public TrialScheduler {
 public:
  // kInvalidArgument naming the field: max_t <= 0, grace_period <= 0 or >
  // max_t, reduction_factor <= 1, brackets < 1, mode not max/min/empty.
  explicit ASHAScheduler(ASHAOptions options = {});

  std::string name() const override { return "asha"; }
  void set_search_properties(const std::string& metric, const std::string& mode) override;
  void on_trial_add(const TrialView& trial) override;
  SchedulerDecision on_trial_result(const TrialView& trial, const nlohmann::json& result) override;
  void on_trial_complete(const TrialView& trial, const nlohmann::json& result) override;
  void on_trial_error(const TrialView& trial) override;
  std::optional<std::string> choose_trial_to_run(const std::vector<TrialView>& candidates) override;
  nlohmann::json save() const override;
  void restore(const nlohmann::json& state) override;

  // The rung milestones of bracket `b`, highest first (for tests and docs).
  std::vector<double> rungs(int bracket) const;

 private:
  struct Rung {
    double milestone = 0;
    std::map<std::string, double> recorded;  // trial id -> metric at the rung
  };
  ASHAOptions options_;
  std::vector<std::vector<Rung>> brackets_;
  std::map<std::string, int> trial_bracket_;
  int next_bracket_ = 0;
};

// Population Based Training (Jaderberg et al. 2017; Ray's
// PopulationBasedTraining, asynchronous form). When a trial's time attribute
// has advanced by at least perturbation_interval since its last perturbation,
// the trials with a result are ranked by metric: a trial in the bottom
// `quantile_fraction` clones a trial chosen uniformly from the top
// `quantile_fraction` that has a checkpoint (exploit) and perturbs that
// trial's config (explore); a trial in the top, or with no eligible source,
// goes on. Explore, per key of hyperparam_mutations (a search space whose
// leaves are domains or arrays of values): with probability
// resample_probability, or when the value is not a number or not in the
// list, resample it from the domain (or pick from the list); otherwise
// multiply a number by 0.8 or 1.2 (chosen at random; ints stay ints), or, for
// a list, move to the neighbouring entry below/above (clamped). Keys of the
// config not in hyperparam_mutations are kept. A trial is never its own
// source. Uses the pause path: choose_trial_to_run prefers PAUSED trials
// (clones waiting to resume) over PENDING ones.
//
// Exactly:
// - A result whose metric is not usable changes nothing. Otherwise, at a
//   perturbation, the trial's score and last perturbation time (= t) are
//   updated, and the n trials with a score that have not completed or failed
//   are ranked; equal scores rank the greater trial id lower. Each quantile
//   holds k = ceil(n * quantile_fraction) trials, at most floor(n / 2), and
//   none when n <= 1 (Ray's rule).
// - Exploit: the sources are the top k trials with has_checkpoint (as the
//   latest view of each said), the trial itself excluded, in trial id order;
//   one is drawn with draw_below. The decision is kContinue with clone_from
//   and new_config = explore(source's config); the scheduler holds
//   new_config as the trial's config from then on, and the trial takes the
//   source's last perturbation time (it resumes from the source's
//   checkpoint).
// - Explore: a choice domain acts as its list of values; grid_search is
//   refused; a sample_from leaf is resampled by calling its function (from
//   PBTOptions::sample_functions) with the config explored so far, or its
//   number perturbed as a numeric domain's is. Nested objects of
//   hyperparam_mutations mutate nested keys; a key missing from the config
//   is added, resampled. Perturbed numbers are not clamped to their domain;
//   ints round to the nearest.
// - Draw order (what a seed fixes): mutation keys in sorted order, depth
//   first. Per leaf whose value can be perturbed, one draw_unit() (below
//   resample_probability: resample), then, unless resampling, one
//   draw_below(2): 0 is x0.8 or the entry below, 1 is x1.2 or the entry
//   above. A resample makes the domain's own draws (or one draw_below(list
//   size)).
struct PBTOptions {
  std::string time_attr = "training_iteration";
  std::string metric;                // empty: TuneConfig's
  std::string mode;                  // empty: TuneConfig's
  double perturbation_interval = 5;  // > 0
  // A non-empty object (see above).
  nlohmann::json hyperparam_mutations = nlohmann::json::object();
  double quantile_fraction = 0.25;     // in (0, 0.5]
  double resample_probability = 0.25;  // in [0, 1]
  // No perturbation while time_attr is below this (Ray's burn_in_period).
  double burn_in_period = 0;  // finite, >= 0
  // A perturbed number is multiplied by one of these (Ray's
  // perturbation_factors): draw 1 takes the first, draw 0 the second.
  double perturbation_factor_up = 1.2;    // finite, > 0
  double perturbation_factor_down = 0.8;  // finite, > 0
  std::uint64_t seed = 0;
  // The functions of sample_from leaves of hyperparam_mutations, by name
  // (Ray's callables as mutations); each must return a value. Code: given
  // again with the scheduler to Tuner::restore.
  SampleFunctions sample_functions;
};

class PopulationBasedTraining final : public TrialScheduler {
 public:
  // kInvalidArgument naming the field for values outside the ranges above or
  // a malformed hyperparam_mutations (key path named).
  explicit PopulationBasedTraining(PBTOptions options);

  std::string name() const override { return "pbt"; }
  void set_search_properties(const std::string& metric, const std::string& mode) override;
  void on_trial_add(const TrialView& trial) override;
  SchedulerDecision on_trial_result(const TrialView& trial, const nlohmann::json& result) override;
  void on_trial_complete(const TrialView& trial, const nlohmann::json& result) override;
  void on_trial_error(const TrialView& trial) override;
  std::optional<std::string> choose_trial_to_run(const std::vector<TrialView>& candidates) override;
  nlohmann::json save() const override;
  void restore(const nlohmann::json& state) override;

  // The explore step alone (for tests): `config` perturbed as described above.
  nlohmann::json explore(const nlohmann::json& config);

 private:
  struct TrialState {
    double last_perturbation_time = 0;
    std::optional<double> last_score;  // metric as "higher is better"
    nlohmann::json config;
    bool has_checkpoint = false;
    bool done = false;  // completed or failed: out of the ranking
  };
  PBTOptions options_;
  Rng rng_;
  std::map<std::string, TrialState> trials_;
  std::uint64_t num_perturbations_ = 0;
};

}  // namespace cairn::tune
