// The Tuner's experiment (Tuner::fit): its state and reconciliation
// (experiment_state.cc), PBT's exploit as clones of checkpoints
// (pbt_exploit.cc) and the driver loop that starts, feeds and reaps trial
// runners (experiment_loop.cc). Internal to cairn_tune.
// Thread-safety: none; one thread (fit()'s) owns an Experiment.
// Failure: throws cairn::Error; the loop stops every runner before a
// failure leaves run(). Durability: tuner_state.json is replaced whole
// (experiment/tuner_state.h), periodically and at the end.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cairn/storage.h"
#include "cairn/tuner.h"
#include "experiment/layout.h"
#include "train/control/channel.h"
#include "tune/gpu_pool.h"
#include "tune/trial_hosts.h"

namespace cairn::train_internal {
class SigtermNotice;
}

namespace cairn::tune::tuner_internal {

inline constexpr std::string_view kStateKey = experiment::kTunerStateKey;
using experiment::kClonesFolder;
using experiment::kLockKey;
using experiment::kParamsKey;

double monotonic_seconds();

double wall_seconds();

std::string trial_id_for(std::size_t index);

// The ResultGrid of `trials` (their folders under `storage`, the
// experiment shown as `path`), as fit() returns it.
ResultGrid results_of(const std::vector<TrialInfo>& trials, Storage& storage,
                      const std::string& metric, const std::string& mode, const std::string& path);
// The results of the experiment whose saved state is `saved`, at `uri`
// (shown as `path`), without running it (Tuner::get_results).
ResultGrid saved_results(const nlohmann::json& saved, const std::string& uri,
                         const std::string& path);

// result[key] as a number (not NaN), or nothing; a key "a/b" not found as
// it is reaches result["a"]["b"] (Ray's flattened name of a nested metric).
std::optional<double> number_at(const nlohmann::json& result, const std::string& key);
// `result` with every nested number also under its flattened name ("eval":
// {"loss": 1} adds "eval/loss": 1), as Ray's schedulers see results; keys
// already there are kept.
nlohmann::json with_flat_keys(const nlohmann::json& result);

nlohmann::json failure_config_json(const FailureConfig& f);

// A pending PBT exploit: the copy of the source's checkpoint the trial
// resumes from, with its new config.
struct Clone {
  std::string source;      // trial id
  std::string staged;      // its folder, relative to the experiment: .cairn_clones/<trial>_<n>
  nlohmann::json metrics;  // of the source checkpoint
};

struct Trial {
  TrialInfo info;
  nlohmann::json metric_analysis = nlohmann::json::object();  // key -> {min, max, last}
  std::vector<std::string> kept;                              // checkpoints, oldest first
  // Checkpoints retention deletes once the saved state stops naming them
  // (see retire); still committed meanwhile, but no longer in `kept`.
  std::vector<std::string> deferred;
  std::optional<Clone> clone;
  bool restart_from_scratch = false;  // remove its folder before it starts
  bool searcher_told = false;         // the searcher heard it completed
  int expected_starts = 0;  // its trainer_state's driver_starts once its last runner began
  std::string text;         // its JSON while it has ended (state_text)
  // While running: its place (Experiment::places_; -1 while it does not
  // run); on this process's place its runner's pid and channel.
  int place = -1;
  pid_t pid = -1;
  std::unique_ptr<train_internal::Channel> channel;
  bool ended = false;  // its "end" arrived
  nlohmann::json end;
  // What the driver asked for when it stopped the trial: the status it ends
  // with (PAUSED or TERMINATED) unless it fails.
  std::optional<TrialStatus> ending;
  double started_at = 0;
  bool first_result_seen = false;
  // A class trainable was told to take its clone in place (reset_config);
  // its next round says the runner did, and the staged copy can go.
  bool reset_sent = false;
  nlohmann::json config_before_reset;  // its config if it ends without taking it
  std::vector<std::string> gpu_ids;    // the GPUs its runner holds (TrialResources::gpu)
};

TrialView view_of(const Trial& t);

nlohmann::json trial_to_json(const Trial& t);

Trial trial_from_json(const nlohmann::json& j);

// The experiment's driver.
class Experiment {
 public:
  struct Spec {
    TrainFn train_fn;  // what the runners run (a class trainable's loop included)
    bool class_trainable = false;
    nlohmann::json param_space;
    TuneConfig tune;
    RunConfig run;
    int num_workers = 1;
    std::optional<RestoreOptions> restore;
    nlohmann::json saved;  // the state restore() read
    // The other processes of a launch, which run trials too (places 1..n);
    // null: every trial runs on this process's host.
    TrialHosts* hosts = nullptr;
  };

  explicit Experiment(Spec spec) : spec_(std::move(spec)) {}

  ResultGrid run();

 private:
  // ---- opening and the state --------------------------------------------

  void open_experiment();

  void load_saved_state();

  // Brings a restored trial up to what its own folder says happened after
  // the state was saved, and applies RestoreOptions.
  void reconcile(Trial& t);

  void refresh_checkpoints(Trial& t);

  // A trial's checkpoints as its runner sees them: the persistent ones and,
  // with CheckpointConfig::memory_tier, those only this host's memory
  // holds (a running trial's newest, or what a killed runner left).
  ExperimentListing read_trial(const std::string& trial_id) const;
  // Whether this host's memory holds a tier a runner of the trial left.
  bool holds_memory_tier(const Trial& t) const;

  // The state as text. A trial that has ended (TERMINATED, ERROR) does not
  // change until it is resumed, so its JSON is kept as text and spliced in:
  // the cost of a save grows with the trials that are still going, not with
  // the experiment's length.
  std::string state_text();

  void save_state();

  // The automatic period keeps periodic saving under 1% of the wall time.
  double save_period() const;

  void maybe_save_state(double now);

  // The event loop; SIGTERM (`sigterm`) preempts the experiment.
  void loop(const train_internal::SigtermNotice& sigterm);

  int running_count() const;

  bool has_runnable();

  void fill_slots();

  // Adds the trial the searcher suggests next; nullptr when it suggests
  // none now. On a restore the trial may have ended already (its folder
  // says so), so it is not always one to start.
  const Trial* add_suggested_trial();

  Trial* find(const std::string& id);

  std::string trial_path(const std::string& id) const;

  // Starts the trial's runner on its place (t.place, set by fill_slots).
  void start(Trial& t);

  // The trial's runner is gone: its place and GPUs are free again.
  void unplace(Trial& t);

  // What a trial host sent, or its loss.
  void on_host_event(const TrialHosts::Event& e);

  // A trial whose runner is gone with its host (lost, or past a drained
  // host's grace: `why`) resumes on another place from its latest
  // checkpoint; that is not its failure.
  void resume_elsewhere(Trial& t, const std::string& why);

  // Whether the trial runs on a host that is being drained (it received
  // SIGTERM alone): it pauses at its next result.
  bool on_draining_place(const Trial& t) const;

  // Stops the trials still running on a drained host once its grace
  // (FailureConfig::preemption_grace_s) is over; they resume elsewhere.
  void check_draining_places();

  // Copies the source's latest checkpoint into the staging folder now, so
  // that the source's retention cannot delete it before the clone resumes.
  // Retries when the source commits (and deletes) while the copy runs.
  std::optional<Clone> stage_clone(const Trial& target, const std::string& source_id);

  // Copies under .cairn_clones/ that no trial waits for: what a driver that
  // died while copying left behind.
  void remove_orphan_clones();

  [[noreturn]] static void throw_changed(const std::string& source_id);

  // Makes the staged copy the trial's latest checkpoint (no runner holds the
  // trial's folder now) and removes the staging folder.
  void import_clone(Trial& t);

  void wait_for_runners(int timeout_ms);

  void handle_message(Trial& t, const nlohmann::json& m);

  void reply(Trial& t, const nlohmann::json& message);

  // Retention is about to delete `doomed`; returns those to keep for now.
  // The saved state must never point at a deleted checkpoint, even if the
  // driver dies right after, so those it names wait (`deferred`) until a
  // save that no longer names them: the next periodic one, as `kept` (what
  // a save names) leaves them out from now on. Saving before each deletion
  // instead would cost a save per checkpoint, since the saved state names
  // a trial's latest checkpoint, the one its next commit retires. The state
  // is saved here only when a periodic save is due anyway, or when nothing
  // would delete them later (!may_defer: the trial's runner is gone).
  std::vector<std::string> retire(Trial& t, const std::vector<std::string>& doomed,
                                  const std::vector<std::string>& kept, bool may_defer);

  // Deletes what retention deferred while the trial's runner ran (see
  // retire), now that none will commit again: opening the trial's manager
  // applies its retention.
  void apply_deferred_retention(Trial& t);
  // Opens the trial's manager, which applies its retention (the state is
  // saved first if it names a checkpoint to go).
  void apply_retention(Trial& t);
  // Writes the result rows a driver's death lost for the trial whose folder
  // is `trial` (RunResults::backfill), before a restore judges it.
  void backfill_rows(const std::shared_ptr<Storage>& trial);

  // The staged copy of a clone the trial no longer needs.
  void drop_clone(Trial& t);

  nlohmann::json on_round(Trial& t, const nlohmann::json& m);

  bool meets_stop_criteria(const nlohmann::json& row) const;

  void reap_runners();

  void finish(Trial& t, int wait_status);

  void complete(Trial& t);

  // A trial completes once for the searcher, however often it is resumed.
  void tell_searcher(Trial& t, bool error);

  void stop_all_runners();

  ResultGrid results();

  Spec spec_;
  std::string uri_;
  std::string path_;
  std::shared_ptr<Storage> storage_;
  std::unique_ptr<Lock> lock_;
  std::shared_ptr<Searcher> searcher_;
  std::shared_ptr<TrialScheduler> scheduler_;
  std::vector<Trial> trials_;
  std::size_t next_index_ = 0;
  int max_concurrent_ = 1;  // trials at once, over every place
  bool stop_experiment_ = false;
  // SIGTERM (Tuner::fit): every running trial pauses at its next result;
  // after the grace time what still runs is stopped.
  bool preempted_ = false;
  double preempt_deadline_ = 0;
  void check_preemption(bool notice);
  // Where trials run: place 0 is this process's host, place i > 0 the
  // launch's process i (spec_.hosts's i - 1).
  struct Place {
    std::string name;
    int limit = 1;  // trials at once here (INT_MAX: only max_concurrent_ bounds it)
    int running = 0;
    bool gone = false;
    // Its process received SIGTERM alone (TrialHosts::Event::kPreempted): no
    // trial starts there; those running pause, by drain_deadline at the latest.
    bool draining = false;
    double drain_deadline = 0;
    // Whether new trials may start here.
    bool open() const { return !gone && !draining; }
    std::unique_ptr<GpuPool> gpus;  // TuneConfig::resources_per_trial.gpu
  };
  std::vector<Place> places_;
  // The places from the offers (open_experiment).
  void make_places();
  // Place i as `offer` makes it, empty and not gone.
  void set_up_place(std::size_t i, const PlaceOffer& offer);
  // Every place's offer, shared out between processes on one host.
  std::vector<PlaceOffer> place_offers() const;
  // What a place with `offer` holds at once (Place::limit).
  int place_limit(const PlaceOffer& offer) const;
  // max_concurrent_ from the places' limits.
  void count_slots();
  // Hosts that come back get trials again.
  void take_returning_hosts();
  // TuneConfig::time_budget_s: the time earlier fit()s of the experiment
  // ran (from the saved state), and when this one started.
  double time_used_before_ = 0;
  double fit_started_ = 0;
  double time_used() const;
  // Ends the experiment when its time budget is spent (once; logs it).
  void check_time_budget();
  // State saving.
  bool dirty_ = true;
  double last_save_ = 0;
  double last_save_duration_ = 0;
  std::optional<double> fixed_period_;
  std::map<std::string, std::vector<std::string>> saved_refs_;  // trial -> kept when saved
  std::uint64_t clone_counter_ = 0;
  ExperimentStats stats_;
};

}  // namespace cairn::tune::tuner_internal
