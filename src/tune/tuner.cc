// The Tuner's driver (tuner.h): one thread, one event loop.
//   1. While a slot is free, add a trial the searcher suggests and start the
//      trial the scheduler chooses: fork a trial runner (trial_runner.h).
//   2. Answer each round a runner reports (stop criteria, callbacks,
//      scheduler), and take each runner's end.
//   3. Save the experiment state (tuner_state.json) periodically. A
//      checkpoint the saved state names is deleted only after a save that
//      no longer names it (retention defers it until then).
// Restore rebuilds the trials from the saved state, then reconciles each
// with its own folder (whose trainer_state.json says how its last run ended),
// since the state may be older than what the trials did after it.
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
#include "train/channel.h"
#include "train/driver.h"
#include "train/history.h"
#include "train/scratch.h"
#include "tune/domain.h"
#include "tune/trial_runner.h"
#include "util/fs.h"
#include "util/json.h"
#include "util/log.h"
#include "util/settings.h"

namespace cairn::tune {

using internal::check_mode;

namespace {

constexpr std::string_view kStateKey = "tuner_state.json";
constexpr std::string_view kLockKey = ".cairn.lock";
constexpr std::string_view kClonesFolder = ".cairn_clones";
constexpr std::string_view kParamsKey = "params.json";

double monotonic_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string trial_id_for(std::size_t index) { return fmt::format("trial_{:05d}", index); }

std::optional<double> number_at(const nlohmann::json& result, const std::string& key) {
  if (!result.is_object()) return std::nullopt;
  auto it = result.find(key);
  if (it == result.end() || !it->is_number()) return std::nullopt;
  const double v = it->get<double>();
  if (std::isnan(v)) return std::nullopt;
  return v;
}

nlohmann::json failure_config_json(const FailureConfig& f) {
  return {{"max_failures", f.max_failures},
          {"report_timeout_s", f.report_timeout_s},
          {"preemption_grace_s", f.preemption_grace_s}};
}

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
  // While running:
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
};

TrialView view_of(const Trial& t) {
  return {t.info.trial_id, t.info.config, t.info.status, t.info.last_result,
          t.info.latest_checkpoint.has_value() || t.clone.has_value()};
}

nlohmann::json trial_to_json(const Trial& t) {
  nlohmann::json j = {
      {"trial_id", t.info.trial_id},
      {"dir", t.info.trial_id},
      {"index", t.info.index},
      {"status", std::string(to_string(t.info.status))},
      {"config", t.info.config},
      {"last_result", t.info.last_result},
      {"metric_analysis", t.metric_analysis},
      {"num_failures", t.info.num_failures},
      {"error", t.info.error ? nlohmann::json(*t.info.error) : nullptr},
      {"latest_checkpoint",
       t.info.latest_checkpoint ? nlohmann::json(*t.info.latest_checkpoint) : nullptr},
      {"checkpoints", t.kept},
      {"restart_from_scratch", t.restart_from_scratch},
      {"searcher_told", t.searcher_told},
      {"expected_driver_starts", t.expected_starts}};
  if (t.clone) {
    j["clone"] = {
        {"source", t.clone->source}, {"staged", t.clone->staged}, {"metrics", t.clone->metrics}};
  } else {
    j["clone"] = nullptr;
  }
  return j;
}

Trial trial_from_json(const nlohmann::json& j) {
  Trial t;
  t.info.trial_id = j.at("trial_id").get<std::string>();
  t.info.index = j.at("index").get<std::size_t>();
  t.info.status = trial_status_from_string(j.at("status").get<std::string>());
  t.info.config = j.at("config");
  t.info.last_result = j.value("last_result", nlohmann::json());
  t.metric_analysis = j.value("metric_analysis", nlohmann::json::object());
  t.info.num_failures = j.value("num_failures", 0);
  if (j.contains("error") && j["error"].is_string()) t.info.error = j["error"].get<std::string>();
  if (j.contains("latest_checkpoint") && j["latest_checkpoint"].is_string()) {
    t.info.latest_checkpoint = j["latest_checkpoint"].get<std::string>();
  }
  t.kept = j.value("checkpoints", std::vector<std::string>());
  t.restart_from_scratch = j.value("restart_from_scratch", false);
  t.searcher_told = j.value("searcher_told", false);
  t.expected_starts = j.value("expected_driver_starts", 0);
  if (j.contains("clone") && j["clone"].is_object()) {
    t.clone = Clone{j["clone"].at("source").get<std::string>(),
                    j["clone"].at("staged").get<std::string>(),
                    j["clone"].value("metrics", nlohmann::json::object())};
  }
  return t;
}

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
  };

  explicit Experiment(Spec spec) : spec_(std::move(spec)) {}

  ResultGrid run() {
    const double started = monotonic_seconds();
    open_experiment();
    if (spec_.restore) {
      load_saved_state();
      remove_orphan_clones();
      // The reconciled trials, before any runner's retention can delete what
      // the old state named.
      save_state();
    } else {
      save_state();
    }
    std::exception_ptr failure;
    try {
      loop();
    } catch (...) {
      failure = std::current_exception();
      stop_all_runners();
    }
    save_state();
    if (failure) std::rethrow_exception(failure);
    std::vector<TrialInfo> infos;
    for (const auto& t : trials_) infos.push_back(t.info);
    for (auto& cb : spec_.tune.callbacks) cb->on_experiment_end(infos);
    ResultGrid grid = results();
    stats_.wall_seconds = monotonic_seconds() - started;
    grid.set_stats(stats_);
    return grid;
  }

 private:
  // ---- opening and the state --------------------------------------------

  void open_experiment() {
    train_internal::ExperimentLocation loc = train_internal::locate_experiment(spec_.run);
    spec_.run.name = loc.name;
    spec_.run.storage_path = loc.storage_path;
    uri_ = loc.uri;
    path_ = loc.path;
    storage_ = open_storage(uri_);
    lock_ = storage_->try_lock(kLockKey);
    if (!spec_.restore && storage_->exists(kStateKey)) {
      throw Error(ErrorCode::kAlreadyExists,
                  fmt::format("{}: a Tuner experiment already exists here; continue it with "
                              "Tuner::restore(\"{}\", trainable) or choose another "
                              "RunConfig::name",
                              path_, path_));
    }
    searcher_ = spec_.tune.search_alg;
    if (!searcher_) {
      searcher_ = std::make_shared<BasicVariantGenerator>(
          ParamSpace(spec_.param_space), static_cast<std::size_t>(spec_.tune.num_samples),
          spec_.tune.seed);
    }
    // Once here, not in every trial's runner.
    for (const auto& p : train_internal::sweep_dead_scratch_dirs()) {
      log::info(fmt::format("removed {}, the scratch folder of a driver that died", p.string()));
    }
    scheduler_ = spec_.tune.scheduler;
    if (!scheduler_) scheduler_ = std::make_shared<FIFOScheduler>();
    scheduler_->set_search_properties(spec_.tune.metric, spec_.tune.mode);
    max_concurrent_ = spec_.tune.max_concurrent_trials;
    if (max_concurrent_ <= 0) {
      const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
      max_concurrent_ = std::max(1, static_cast<int>(cores) / std::max(1, spec_.num_workers));
    }
    if (const std::string env = Settings::from(Environment::process()).tune_state_period_s;
        !env.empty()) {
      char* end = nullptr;
      const double v = std::strtod(env.c_str(), &end);
      if (end == env.c_str() || *end != '\0' || !(v >= 0)) {
        throw Error(
            ErrorCode::kInvalidArgument,
            fmt::format("CAIRN_TUNE_STATE_PERIOD_S=\"{}\" is not a number of seconds >= 0", env));
      }
      fixed_period_ = v;
    }
  }

  void load_saved_state() {
    const nlohmann::json& s = spec_.saved;
    const std::string where = storage_->uri_of(kStateKey);
    try {
      next_index_ = s.at("next_trial_index").get<std::size_t>();
      searcher_->restore(s.at("searcher"));
      const nlohmann::json& sched = s.at("scheduler");
      if (sched.at("name").get<std::string>() != scheduler_->name()) {
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("the experiment was run with the \"{}\" scheduler; pass one of "
                                "that kind to Tuner::restore (TuneConfig::scheduler), not \"{}\"",
                                sched.at("name").get<std::string>(), scheduler_->name()));
      }
      scheduler_->restore(sched.at("state"));
      for (const auto& j : s.at("trials")) trials_.push_back(trial_from_json(j));
    } catch (const nlohmann::json::exception& e) {
      throw Error(ErrorCode::kCorruption, fmt::format("{}: {}", where, e.what()));
    }
    for (auto& t : trials_) {
      t.info.path = trial_path(t.info.trial_id);
      reconcile(t);
      // Ended after the state was saved: the searcher did not hear it then.
      if (t.info.status == TrialStatus::kTerminated || t.info.status == TrialStatus::kError) {
        tell_searcher(t, t.info.status == TrialStatus::kError);
      }
    }
  }

  // Brings a restored trial up to what its own folder says happened after
  // the state was saved, and applies RestoreOptions.
  void reconcile(Trial& t) {
    const RestoreOptions& o = *spec_.restore;
    auto trial_storage = storage_->child(t.info.trial_id);
    nlohmann::json ts = train_internal::read_trainer_state(trial_storage->uri());
    const std::string status = ts.is_object() ? ts.value("status", "") : "";
    refresh_checkpoints(t);
    // trainer_state.json speaks for the runner started last only once that
    // runner's driver has begun (counted in driver_starts); before that it
    // still tells how an earlier runner ended (stopped for a clone, paused).
    const int starts = ts.is_object() ? ts.value("driver_starts", 0) : 0;
    if (t.info.status == TrialStatus::kRunning && starts < t.expected_starts) {
      t.info.status = TrialStatus::kPaused;
    }
    if (t.info.status == TrialStatus::kRunning) {
      if (status == "finished" || (status == "stopped" && !t.clone)) {
        t.info.status = TrialStatus::kTerminated;
      } else if (status == "errored") {
        t.info.status = TrialStatus::kError;
        if (ts["error"].is_string()) t.info.error = ts["error"].get<std::string>();
      } else {
        // Interrupted by the driver's death, paused, or cloned: it goes on.
        t.info.status = TrialStatus::kPaused;
      }
    }
    // A result the driver died before judging may already meet the stop
    // criteria: the trial is done, not resumed for one more.
    if (t.info.status == TrialStatus::kPaused && !t.clone) {
      const std::vector<nlohmann::json> rows = train_internal::read_result_history(*trial_storage);
      if (!rows.empty()) {
        t.info.last_result = rows.back();
        if (meets_stop_criteria(rows.back())) t.info.status = TrialStatus::kTerminated;
      }
    }
    // A clone whose copy is gone was committed into the trial before the
    // driver died (the copy is removed only after the state says so).
    if (t.clone && read_experiment(storage_->child(t.clone->staged)->uri()).checkpoints.empty()) {
      t.clone.reset();
    }
    if (t.info.status == TrialStatus::kPaused || t.info.status == TrialStatus::kPending) {
      if (!o.resume_unfinished) t.info.status = TrialStatus::kTerminated;
    } else if (t.info.status == TrialStatus::kError) {
      if (o.restart_errored) {
        t.info.status = TrialStatus::kPending;
        t.restart_from_scratch = true;
        t.info.error.reset();
        t.info.num_failures = 0;
      } else if (o.resume_errored) {
        t.info.status = TrialStatus::kPaused;
        t.info.error.reset();
        t.info.num_failures = 0;
      }
    }
  }

  void refresh_checkpoints(Trial& t) {
    auto trial_storage = storage_->child(t.info.trial_id);
    ExperimentListing listing = read_experiment(trial_storage->uri());
    t.kept.clear();
    for (const auto& r : listing.checkpoints) t.kept.push_back(r.name);
    if (!t.kept.empty()) t.info.latest_checkpoint = t.kept.back();
  }

  // The state as text. A trial that has ended (TERMINATED, ERROR) does not
  // change until it is resumed, so its JSON is kept as text and spliced in:
  // the cost of a save grows with the trials that are still going, not with
  // the experiment's length.
  std::string state_text() {
    nlohmann::json cc = spec_.run.checkpoint_config.to_json();
    cc["checkpoint_frequency"] = spec_.run.checkpoint_config.checkpoint_frequency;
    cc["checkpoint_at_end"] = spec_.run.checkpoint_config.checkpoint_at_end;
    const nlohmann::json head = {
        {"format", "cairn-tuner-state"},
        {"version", 1},
        {"name", spec_.run.name},
        {"storage_path", spec_.run.storage_path},
        {"updated_at", wall_seconds()},
        {"metric", spec_.tune.metric},
        {"mode", spec_.tune.mode},
        {"num_samples", spec_.tune.num_samples},
        {"max_concurrent_trials", spec_.tune.max_concurrent_trials},
        {"seed", std::to_string(spec_.tune.seed)},
        {"stop", spec_.tune.stop},
        {"param_space", spec_.param_space},
        {"trainable", spec_.class_trainable ? "class" : "function"},
        {"num_workers", spec_.num_workers},
        {"checkpoint_config", cc},
        {"failure_config", failure_config_json(spec_.run.failure_config)},
        {"searcher", searcher_->save()},
        {"scheduler", {{"name", scheduler_->name()}, {"state", scheduler_->save()}}},
        {"next_trial_index", next_index_}};
    std::string text = head.dump();
    text.pop_back();  // the closing '}'
    text += ",\"trials\":[";
    bool first = true;
    for (auto& t : trials_) {
      const bool ended =
          t.info.status == TrialStatus::kTerminated || t.info.status == TrialStatus::kError;
      if (!ended) t.text.clear();
      if (!first) text += ',';
      first = false;
      if (!t.text.empty()) {
        text += t.text;
        continue;
      }
      std::string part = trial_to_json(t).dump();
      text += part;
      if (ended) t.text = std::move(part);
    }
    text += "]}";
    return text;
  }

  void save_state() {
    const double t0 = monotonic_seconds();
    const std::string text = state_text();
    storage_->put(kStateKey, text);
    const double t1 = monotonic_seconds();
    last_save_ = t1;
    last_save_duration_ = t1 - t0;
    ++stats_.state_saves;
    stats_.state_save_seconds += last_save_duration_;
    stats_.last_state_save_seconds = last_save_duration_;
    stats_.last_state_bytes = text.size();
    for (const auto& t : trials_) saved_refs_[t.info.trial_id] = t.kept;
    dirty_ = false;
  }

  // The automatic period keeps periodic saving under 1% of the wall time.
  double save_period() const {
    return fixed_period_ ? *fixed_period_ : std::max(1.0, 100 * last_save_duration_);
  }

  void maybe_save_state(double now) {
    if (!dirty_) return;
    if (now - last_save_ >= save_period()) save_state();
  }

  // ---- the loop -----------------------------------------------------------

  void loop() {
    while (true) {
      if (!stop_experiment_) fill_slots();
      if (running_count() == 0) {
        if (stop_experiment_ || !has_runnable()) break;
        // Nothing runs and nothing could be started: waiting would be forever.
        throw Error(ErrorCode::kFailedPrecondition,
                    fmt::format("{}: no trial is running and none can start: the {} scheduler "
                                "chose none of the waiting trials, or the searcher has no "
                                "configuration to suggest now although it is not finished",
                                path_, scheduler_->name()));
      }
      wait_for_runners(100);
      reap_runners();
      maybe_save_state(monotonic_seconds());
    }
  }

  int running_count() const {
    int n = 0;
    for (const auto& t : trials_) n += t.pid > 0 ? 1 : 0;
    return n;
  }

  bool has_runnable() {
    for (const auto& t : trials_) {
      if (t.info.status == TrialStatus::kPending || t.info.status == TrialStatus::kPaused) {
        return true;
      }
    }
    return !searcher_->finished();
  }

  void fill_slots() {
    while (running_count() < max_concurrent_) {
      bool have_pending = false;
      for (const auto& t : trials_) have_pending |= t.info.status == TrialStatus::kPending;
      if (!have_pending && !searcher_->finished()) add_suggested_trial();
      std::vector<TrialView> candidates;
      for (const auto& t : trials_) {
        if (t.pid < 0 &&
            (t.info.status == TrialStatus::kPending || t.info.status == TrialStatus::kPaused)) {
          candidates.push_back(view_of(t));
        }
      }
      if (candidates.empty()) return;
      std::optional<std::string> chosen = scheduler_->choose_trial_to_run(candidates);
      if (!chosen) return;
      Trial* t = find(*chosen);
      if (t == nullptr || t->pid > 0) {
        throw Error(ErrorCode::kInternal,
                    fmt::format("the {} scheduler chose \"{}\", which is not a waiting trial",
                                scheduler_->name(), *chosen));
      }
      start(*t);
    }
  }

  void add_suggested_trial() {
    const std::size_t index = next_index_;
    const std::string id = trial_id_for(index);
    std::optional<nlohmann::json> config = searcher_->suggest(id);
    if (!config) return;
    ++next_index_;
    Trial t;
    t.info.trial_id = id;
    t.info.index = index;
    t.info.config = *config;
    t.info.path = trial_path(id);
    // A folder the saved state did not know yet (the driver died after the
    // trial started, before the next save) is that trial: it goes on, with
    // the configuration it ran with.
    auto trial_storage = storage_->child(id);
    if (trial_storage->exists(kParamsKey)) {
      t.info.config = parse_json(trial_storage->get(kParamsKey), trial_storage->uri_of(kParamsKey));
      refresh_checkpoints(t);
    }
    check_storable_json(t.info.config, fmt::format("trial {}: config", id));
    scheduler_->on_trial_add(view_of(t));
    trials_.push_back(std::move(t));
    dirty_ = true;
  }

  Trial* find(const std::string& id) {
    for (auto& t : trials_) {
      if (t.info.trial_id == id) return &t;
    }
    return nullptr;
  }

  std::string trial_path(const std::string& id) const {
    // A plain path for local storage (as the Trainer shows it), else the URI.
    return path_ == uri_ ? storage_->child(id)->uri() : path_ + "/" + id;
  }

  void start(Trial& t) {
    auto trial_storage = storage_->child(t.info.trial_id);
    if (t.restart_from_scratch) {
      trial_storage->remove_prefix("");
      t.kept.clear();
      t.info.latest_checkpoint.reset();
      t.info.last_result = nullptr;
      t.metric_analysis = nlohmann::json::object();
      t.restart_from_scratch = false;
    }
    trial_storage->put(kParamsKey, t.info.config.dump(2));
    if (t.clone) import_clone(t);
    const nlohmann::json before = train_internal::read_trainer_state(trial_storage->uri());
    t.expected_starts = (before.is_object() ? before.value("driver_starts", 0) : 0) + 1;

    tune_internal::RunnerSpec rs;
    rs.train_fn = spec_.train_fn;
    rs.config = t.info.config;
    rs.num_workers = spec_.num_workers;
    rs.run = spec_.run;
    rs.run.name = t.info.trial_id;
    rs.run.storage_path = uri_;
    // One failure budget per trial, however many runners it takes.
    if (rs.run.failure_config.max_failures >= 0) {
      rs.run.failure_config.max_failures =
          std::max(0, rs.run.failure_config.max_failures - t.info.num_failures);
    }
    rs.run.checkpoint_config.checkpoint_frequency = 0;
    rs.run.checkpoint_config.checkpoint_at_end = false;
    rs.trial_uri = trial_storage->uri();
    rs.trial_path = t.info.path;

    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      throw Error(ErrorCode::kIO, fmt::format("socketpair for trial {}: {}", t.info.trial_id,
                                              std::strerror(errno)));
    }
    std::fflush(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
      const int err = errno;
      ::close(sv[0]);
      ::close(sv[1]);
      throw Error(ErrorCode::kIO,
                  fmt::format("fork for trial {}: {}", t.info.trial_id, std::strerror(err)));
    }
    if (pid == 0) {
      // The runner: dies with the driver; keeps only its own channel.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      if (tune_internal::runner_started_hook != nullptr) tune_internal::runner_started_hook();
      // Only its channel (as fd 3) and stdio: no other trial's channel, and
      // not the experiment's lock (a flock lives while any copy of its
      // descriptor does), as the Trainer's workers do.
      if (sv[1] != 3) {
        ::dup2(sv[1], 3);
      }
      ::close_range(4, ~0u, 0);
      ::_exit(tune_internal::run_trial(rs, 3));
    }
    ::close(sv[1]);
    t.pid = pid;
    t.channel = std::make_unique<train_internal::Channel>(UniqueFd(sv[0]),
                                                          fmt::format("trial {}", t.info.trial_id));
    t.ended = false;
    t.end = nullptr;
    t.ending.reset();
    t.reset_sent = false;
    t.started_at = monotonic_seconds();
    t.first_result_seen = false;
    ++stats_.trial_starts;
    t.info.status = TrialStatus::kRunning;
    dirty_ = true;
    for (auto& cb : spec_.tune.callbacks) cb->on_trial_start(t.info);
  }

  // Copies the source's latest checkpoint into the staging folder now, so
  // that the source's retention cannot delete it before the clone resumes.
  // Retries when the source commits (and deletes) while the copy runs.
  std::optional<Clone> stage_clone(const Trial& target, const std::string& source_id) {
    Trial* source = find(source_id);
    if (source == nullptr) return std::nullopt;
    const std::string staged =
        fmt::format("{}/{}_{}", kClonesFolder, target.info.trial_id, ++clone_counter_);
    auto staging = storage_->child(staged);
    for (int attempt = 0; attempt < 5; ++attempt) {
      ExperimentListing listing = read_experiment(storage_->child(source_id)->uri());
      if (listing.checkpoints.empty()) return std::nullopt;
      const CheckpointRecord& latest = listing.checkpoints.back();
      try {
        const Manifest source_manifest = latest.checkpoint.manifest();
        staging->remove_prefix("");
        CheckpointManager m(staging->uri(), CheckpointConfig{});
        CheckpointRecord copy = m.register_checkpoint(latest.metrics, latest.checkpoint);
        // The copy must be the committed checkpoint, byte for byte.
        const Manifest copied = copy.checkpoint.manifest();
        if (copied.files.size() != source_manifest.files.size()) throw_changed(source_id);
        for (size_t i = 0; i < copied.files.size(); ++i) {
          if (copied.files[i].path != source_manifest.files[i].path ||
              copied.files[i].xxh3 != source_manifest.files[i].xxh3) {
            throw_changed(source_id);
          }
        }
        return Clone{source_id, staged, latest.metrics};
      } catch (const Error& e) {
        log::info(
            fmt::format("PBT: copying trial {}'s {} for trial {} failed ({}); retrying "
                        "with its newest checkpoint",
                        source_id, latest.name, target.info.trial_id, e.what()));
      }
    }
    staging->remove_prefix("");
    storage_->remove_empty_folder(staged);
    return std::nullopt;
  }

  // Copies under .cairn_clones/ that no trial waits for: what a driver that
  // died while copying left behind.
  void remove_orphan_clones() {
    std::set<std::string> wanted;
    for (const auto& t : trials_) {
      if (t.clone) wanted.insert(t.clone->staged);
    }
    std::set<std::string> orphans;
    for (const auto& o : storage_->child(kClonesFolder)->list("")) {
      const std::string folder =
          fmt::format("{}/{}", kClonesFolder, o.key.substr(0, o.key.find('/')));
      if (!wanted.count(folder)) orphans.insert(folder);
    }
    for (const auto& folder : orphans) {
      storage_->child(folder)->remove_prefix("");
      storage_->remove_empty_folder(folder);
    }
  }

  [[noreturn]] static void throw_changed(const std::string& source_id) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("trial {}'s checkpoint changed while it was copied", source_id));
  }

  // Makes the staged copy the trial's latest checkpoint (no runner holds the
  // trial's folder now) and removes the staging folder.
  void import_clone(Trial& t) {
    auto staging = storage_->child(t.clone->staged);
    ExperimentListing listing = read_experiment(staging->uri());
    if (listing.checkpoints.empty()) {
      throw Error(ErrorCode::kNotFound,
                  fmt::format("trial {}: the copy of trial {}'s checkpoint at {} is gone",
                              t.info.trial_id, t.clone->source, staging->uri()));
    }
    {
      ManagerOptions options;
      options.before_delete = [this, &t](const std::vector<std::string>& doomed,
                                         const std::vector<std::string>& kept) {
        return retire(t, doomed, kept, /*may_defer=*/false);
      };
      // A runner of a driver that died may still hold the trial's lock.
      std::unique_ptr<CheckpointManager> opened = tune_internal::retry_while_locked([&] {
        return std::make_unique<CheckpointManager>(storage_->child(t.info.trial_id)->uri(),
                                                   spec_.run.checkpoint_config, options);
      });
      CheckpointManager& m = *opened;
      CheckpointRecord r = m.register_checkpoint(listing.checkpoints.back().metrics,
                                                 listing.checkpoints.back().checkpoint);
      t.kept.clear();
      for (const auto& h : m.history()) t.kept.push_back(h.name);
      t.info.latest_checkpoint = r.name;
    }
    const std::string staged = t.clone->staged;
    t.clone.reset();
    // The state must stop naming the copy before the copy goes (a restore
    // would otherwise look for it).
    save_state();
    staging->remove_prefix("");
    storage_->remove_empty_folder(staged);
  }

  // ---- runners ------------------------------------------------------------

  void wait_for_runners(int timeout_ms) {
    std::vector<pollfd> fds;
    for (const auto& t : trials_) {
      if (t.channel) fds.push_back({t.channel->fd(), POLLIN, 0});
    }
    if (fds.empty()) return;
    const int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n <= 0) return;
    for (auto& t : trials_) {
      if (!t.channel) continue;
      std::vector<nlohmann::json> messages;
      const bool open = t.channel->read_available(messages);
      for (const auto& m : messages) handle_message(t, m);
      if (!open) t.channel.reset();
    }
  }

  void handle_message(Trial& t, const nlohmann::json& m) {
    const std::string type = m.value("t", "");
    if (type == "end") {
      t.ended = true;
      t.end = m;
      return;
    }
    if (type == "retire") {
      reply(t, {{"defer", retire(t, m.at("doomed").get<std::vector<std::string>>(),
                                 m.at("kept").get<std::vector<std::string>>(),
                                 /*may_defer=*/true)}});
      return;
    }
    if (type != "round") {
      throw Error(ErrorCode::kInternal,
                  fmt::format("trial {} sent an unknown message: {}", t.info.trial_id, m.dump()));
    }
    ++stats_.results;
    if (!t.first_result_seen) {
      t.first_result_seen = true;
      stats_.trial_start_seconds += monotonic_seconds() - t.started_at;
      ++stats_.trial_starts_timed;
    }
    reply(t, on_round(t, m));
  }

  void reply(Trial& t, const nlohmann::json& message) {
    try {
      t.channel->send(message);
    } catch (const Error& e) {
      // ignore-error: the runner died; its exit is counted in reap_runners
      log::warn(fmt::format("trial {}: {}", t.info.trial_id, e.what()));
    }
  }

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
                                  const std::vector<std::string>& kept, bool may_defer) {
    t.kept = kept;
    if (!kept.empty()) t.info.latest_checkpoint = kept.back();
    dirty_ = true;
    const auto& refs = saved_refs_[t.info.trial_id];
    std::vector<std::string> named;
    for (const auto& name : doomed) {
      if (std::find(refs.begin(), refs.end(), name) != refs.end()) named.push_back(name);
    }
    if (!named.empty() && (!may_defer || monotonic_seconds() - last_save_ >= save_period())) {
      save_state();
      named.clear();
    }
    t.deferred = named;
    return named;
  }

  // Deletes what retention deferred while the trial's runner ran (see
  // retire), now that none will commit again: opening the trial's manager
  // applies its retention.
  void apply_deferred_retention(Trial& t) {
    if (t.deferred.empty()) return;
    ManagerOptions options;
    options.before_delete = [this, &t](const std::vector<std::string>& doomed,
                                       const std::vector<std::string>& kept) {
      return retire(t, doomed, kept, /*may_defer=*/false);
    };
    try {
      tune_internal::retry_while_locked([&] {
        return std::make_unique<CheckpointManager>(storage_->child(t.info.trial_id)->uri(),
                                                   spec_.run.checkpoint_config, options);
      });
    } catch (const Error& e) {
      // ignore-error: the checkpoints stay committed (and kept out of the
      // state); the trial's next open applies retention again.
      log::warn(fmt::format("trial {}: applying retention after its runner ended: {}",
                            t.info.trial_id, e.what()));
    }
    t.deferred.clear();
  }

  // The staged copy of a clone the trial no longer needs.
  void drop_clone(Trial& t) {
    const std::string staged = t.clone->staged;
    t.clone.reset();
    t.reset_sent = false;
    dirty_ = true;
    storage_->child(staged)->remove_prefix("");
    storage_->remove_empty_folder(staged);
  }

  nlohmann::json on_round(Trial& t, const nlohmann::json& m) {
    if (t.reset_sent && t.clone) {
      // The runner took the clone in place: its config is the trial's now.
      drop_clone(t);
      storage_->child(t.info.trial_id)->put(kParamsKey, t.info.config.dump(2));
    }
    nlohmann::json kept = m.value("kept", nlohmann::json::array());
    t.kept = kept.get<std::vector<std::string>>();
    std::erase_if(t.kept, [&](const std::string& name) {
      return std::find(t.deferred.begin(), t.deferred.end(), name) != t.deferred.end();
    });
    if (!t.kept.empty()) t.info.latest_checkpoint = t.kept.back();
    if (m["checkpoint"].is_string()) {
      for (auto& cb : spec_.tune.callbacks) {
        cb->on_checkpoint(t.info, m["checkpoint"].get<std::string>());
      }
    }
    nlohmann::json row = m.value("row", nlohmann::json());
    // A checkpoint attached to the previous result, or a round after the
    // driver already decided this trial's end: nothing more to decide.
    if (!row.is_object() || t.ending) return {{"save", false}, {"stop", false}};
    dirty_ = true;
    for (auto& cb : spec_.tune.callbacks) cb->on_trial_result(t.info, row);
    const bool want_checkpoint = row.value("should_checkpoint", false) == true;
    row.erase("should_checkpoint");
    t.info.last_result = row;
    for (auto it = row.begin(); it != row.end(); ++it) {
      if (!it->is_number()) continue;
      const double v = it->get<double>();
      nlohmann::json& a = t.metric_analysis[it.key()];
      if (!a.is_object()) a = {{"min", v}, {"max", v}};
      a["min"] = std::min(a["min"].get<double>(), v);
      a["max"] = std::max(a["max"].get<double>(), v);
      a["last"] = v;
    }

    // Stopper::stop_all() ends every running trial at its next result.
    bool stop = stop_experiment_ || meets_stop_criteria(row);
    if (!stop && spec_.tune.stopper) {
      stop = (*spec_.tune.stopper)(t.info.trial_id, row);
      if (spec_.tune.stopper->stop_all()) {
        stop_experiment_ = true;
        stop = true;
      }
    }
    SchedulerDecision d;
    if (!stop) d = scheduler_->on_trial_result(view_of(t), row);
    if (stop || d.action == SchedulerDecision::kStop) {
      t.ending = TrialStatus::kTerminated;
      const bool save = spec_.class_trainable && spec_.run.checkpoint_config.checkpoint_at_end;
      return {{"save", save}, {"stop", true}};
    }
    if (d.action == SchedulerDecision::kPause) {
      t.ending = TrialStatus::kPaused;
      return {{"save", true}, {"stop", true}};
    }
    if (d.clone_from) {
      std::optional<Clone> c = stage_clone(t, *d.clone_from);
      if (c && spec_.class_trainable) {
        // In place: the runner commits the copy into the trial and the
        // trainable adopts the config (Trainable::reset_config). Until the
        // next round shows it did, the copy stays, and a restart of the
        // trial commits it instead.
        log::info(fmt::format("PBT: trial {} continues in place from trial {}'s checkpoint with {}",
                              t.info.trial_id, *d.clone_from, d.new_config.dump()));
        const std::string from =
            read_experiment(storage_->child(c->staged)->uri()).checkpoints.back().checkpoint.uri();
        nlohmann::json reset = {
            {"config", d.new_config}, {"checkpoint", from}, {"metrics", c->metrics}};
        t.clone = std::move(c);
        t.config_before_reset = t.info.config;
        t.info.config = d.new_config;
        t.reset_sent = true;
        save_state();
        return {{"save", false}, {"stop", false}, {"reset", reset}};
      }
      if (c) {
        log::info(fmt::format("PBT: trial {} continues from trial {}'s checkpoint with {}",
                              t.info.trial_id, *d.clone_from, d.new_config.dump()));
        t.clone = std::move(c);
        t.info.config = d.new_config;
        t.ending = TrialStatus::kPaused;
        save_state();  // the clone must survive a driver crash
        return {{"save", false}, {"stop", true}};
      }
      log::warn(fmt::format("PBT: trial {} has no checkpoint to clone; trial {} goes on",
                            *d.clone_from, t.info.trial_id));
    }
    return {{"save", want_checkpoint}, {"stop", false}};
  }

  bool meets_stop_criteria(const nlohmann::json& row) const {
    for (auto it = spec_.tune.stop.begin(); it != spec_.tune.stop.end(); ++it) {
      std::optional<double> v = number_at(row, it.key());
      if (v && *v >= it->get<double>()) return true;
    }
    return false;
  }

  void reap_runners() {
    for (auto& t : trials_) {
      if (t.pid < 0) continue;
      int status = 0;
      const pid_t r = ::waitpid(t.pid, &status, WNOHANG);
      if (r == 0) continue;
      if (r < 0 && errno == EINTR) continue;
      // Messages sent before the exit are still in the socket.
      if (t.channel) {
        std::vector<nlohmann::json> messages;
        t.channel->read_available(messages);
        for (const auto& m : messages) handle_message(t, m);
      }
      t.channel.reset();
      t.pid = -1;
      finish(t, status);
    }
  }

  void finish(Trial& t, int wait_status) {
    dirty_ = true;
    // Rounds and retention tell the kept checkpoints as they change; a
    // runner that died may have committed one it could not tell.
    if (!t.ended) refresh_checkpoints(t);
    apply_deferred_retention(t);
    const std::string end_status = t.ended ? t.end.value("status", "") : "";
    // The runner's Trainer counted the group failures it restarted from.
    if (t.ended && t.end.contains("failures") && t.end["failures"].is_number_integer()) {
      t.info.num_failures += t.end["failures"].get<int>();
    }
    if (!t.ended || end_status == "errored") {
      std::string why =
          t.ended && t.end["error"].is_string()
              ? t.end["error"].get<std::string>()
              : fmt::format("its runner process {}",
                            WIFSIGNALED(wait_status)
                                ? fmt::format("was killed by signal {}", WTERMSIG(wait_status))
                                : fmt::format("exited with status {} before it "
                                              "ended",
                                              WEXITSTATUS(wait_status)));
      // The Trainer inside the runner already retried worker failures; a
      // runner that died is retried here, on the same budget.
      const int budget = spec_.run.failure_config.max_failures;
      if (!t.ended) {
        ++t.info.num_failures;
        if (budget < 0 || t.info.num_failures <= budget) {
          log::warn(fmt::format("trial {}: {}; resuming it from its latest checkpoint",
                                t.info.trial_id, why));
          t.info.status = TrialStatus::kPaused;
          return;
        }
      }
      t.info.status = TrialStatus::kError;
      t.info.error = why;
      scheduler_->on_trial_error(view_of(t));
      tell_searcher(t, true);
      for (auto& cb : spec_.tune.callbacks) cb->on_trial_error(t.info);
      save_state();
      return;
    }
    if (end_status == "preempted" || (t.ending && *t.ending == TrialStatus::kPaused)) {
      if (t.ending && *t.ending == TrialStatus::kTerminated) {
        complete(t);  // stopped after its checkpoint_at_end checkpoint
        return;
      }
      t.info.status = TrialStatus::kPaused;
      return;
    }
    complete(t);
  }

  void complete(Trial& t) {
    // Ended before it took a clone sent in place: the clone is moot, and
    // the trial ran with its config before.
    if (t.reset_sent && t.clone) {
      t.info.config = t.config_before_reset;
      drop_clone(t);
    }
    t.info.status = TrialStatus::kTerminated;
    scheduler_->on_trial_complete(view_of(t), t.info.last_result);
    tell_searcher(t, false);
    for (auto& cb : spec_.tune.callbacks) cb->on_trial_complete(t.info);
  }

  // A trial completes once for the searcher, however often it is resumed.
  void tell_searcher(Trial& t, bool error) {
    if (t.searcher_told) return;
    t.searcher_told = true;
    searcher_->on_trial_complete(t.info.trial_id, t.info.last_result, error);
  }

  void stop_all_runners() {
    for (auto& t : trials_) {
      if (t.pid < 0) continue;
      ::kill(t.pid, SIGKILL);
      int status = 0;
      ::waitpid(t.pid, &status, 0);
      t.pid = -1;
      t.channel.reset();
    }
  }

  ResultGrid results() {
    std::vector<TrialResult> out;
    for (const auto& t : trials_) {
      TrialResult r;
      try {
        static_cast<Result&>(r) = Result::from_path(storage_->child(t.info.trial_id)->uri());
      } catch (const Error& e) {
        if (e.code() != ErrorCode::kNotFound) throw;  // a trial that never ran
      }
      r.path = t.info.path;
      r.trial_id = t.info.trial_id;
      r.config = t.info.config;
      r.status = t.info.status;
      if (t.info.status == TrialStatus::kError) r.error = t.info.error;
      if (r.metrics.is_null() || r.metrics.empty()) {
        r.metrics = t.info.last_result.is_object() ? t.info.last_result : nlohmann::json::object();
      }
      out.push_back(std::move(r));
    }
    return ResultGrid(std::move(out), spec_.tune.metric, spec_.tune.mode, path_);
  }

  Spec spec_;
  std::string uri_;
  std::string path_;
  std::shared_ptr<Storage> storage_;
  std::unique_ptr<Lock> lock_;
  std::shared_ptr<Searcher> searcher_;
  std::shared_ptr<TrialScheduler> scheduler_;
  std::vector<Trial> trials_;
  std::size_t next_index_ = 0;
  int max_concurrent_ = 1;
  bool stop_experiment_ = false;
  // State saving.
  bool dirty_ = true;
  double last_save_ = 0;
  double last_save_duration_ = 0;
  std::optional<double> fixed_period_;
  std::map<std::string, std::vector<std::string>> saved_refs_;  // trial -> kept when saved
  std::uint64_t clone_counter_ = 0;
  ExperimentStats stats_;
};

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
  if (scaling_.launcher == Launcher::kMpi) {
    throw Error(ErrorCode::kInvalidArgument,
                "Tuner: trials run with the local launcher; ScalingConfig::launcher is kMpi");
  }
  if (scaling_.num_workers < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("Tuner: ScalingConfig::num_workers must be >= 1, got {}",
                            scaling_.num_workers));
  }
  // Validates the space (naming the key path) before anything starts.
  if (!tune_config_.search_alg) ParamSpace space(param_space_);
  check_storable_json(param_space_, "Tuner: param_space");
  check_storable_json(tune_config_.stop, "TuneConfig::stop");
}

ResultGrid Tuner::fit() {
  Experiment::Spec spec;
  spec.class_trainable = static_cast<bool>(cls_);
  spec.train_fn = cls_ ? tune_internal::class_trainable_loop(
                             cls_, run_config_.checkpoint_config.checkpoint_frequency,
                             run_config_.checkpoint_config.checkpoint_at_end)
                       : fn_;
  spec.param_space = param_space_;
  spec.tune = tune_config_;
  spec.run = run_config_;
  spec.num_workers = scaling_.num_workers;
  spec.restore = restore_;
  spec.saved = restored_state_;
  Experiment e(std::move(spec));
  return e.run();
}

namespace {

nlohmann::json read_tuner_state(std::string_view path) {
  auto storage = open_storage(path);
  if (!storage->exists(kStateKey)) return nullptr;
  const std::string where = storage->uri_of(kStateKey);
  nlohmann::json j = parse_json(storage->get(kStateKey), where);
  if (!j.is_object() || j.value("format", nlohmann::json()) != "cairn-tuner-state") {
    throw Error(ErrorCode::kCorruption, fmt::format("{}: not a Cairn tuner state file", where));
  }
  if (!j.value("version", nlohmann::json()).is_number_integer() || j["version"].get<int>() > 1) {
    throw Error(ErrorCode::kCorruption, fmt::format("{}: unsupported tuner state version {}", where,
                                                    j.value("version", nlohmann::json()).dump()));
  }
  return j;
}

}  // namespace

namespace {

std::string experiment_uri_of(std::string_view path) {
  const train_internal::ExperimentParts where = train_internal::split_experiment_path(path);
  return open_storage(where.storage_path)->child(where.name)->uri();
}

}  // namespace

bool Tuner::can_restore(std::string_view path) {
  return read_tuner_state(experiment_uri_of(path)).is_object();
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

Tuner Tuner::restore_impl(std::string_view path, TrainFn fn, TrainableFactory cls,
                          RestoreOptions options, TuneConfig code) {
  const train_internal::ExperimentParts where = train_internal::split_experiment_path(path);
  const std::string uri = experiment_uri_of(path);
  nlohmann::json s = read_tuner_state(uri);
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
    tc.seed = std::stoull(s.at("seed").get<std::string>());
    tc.stop = s.at("stop");
    space = s.at("param_space");
    run.name = where.name;
    run.storage_path = where.storage_path;
    const nlohmann::json& cc = s.at("checkpoint_config");
    run.checkpoint_config = CheckpointConfig::from_json(cc);
    run.checkpoint_config.checkpoint_frequency = cc.value("checkpoint_frequency", 0);
    run.checkpoint_config.checkpoint_at_end = cc.value("checkpoint_at_end", false);
    const nlohmann::json& fc = s.at("failure_config");
    run.failure_config.max_failures = fc.value("max_failures", 0);
    run.failure_config.report_timeout_s = fc.value("report_timeout_s", 1800.0);
    run.failure_config.preemption_grace_s = fc.value("preemption_grace_s", 120.0);
    scaling.num_workers = s.at("num_workers").get<int>();
    scaling.launcher = Launcher::kLocal;
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("{}: a stored setting is missing or has the wrong type: {}", state_uri,
                            e.what()));
  } catch (const std::logic_error& e) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("{}: the stored seed is not a number: {}", state_uri, e.what()));
  }
  // The saved scheduler kind is rebuilt when the caller gives none and it
  // needs no code (FIFO); others must be given.
  std::string sched = "fifo";
  if (s.contains("scheduler") && s["scheduler"].is_object() &&
      s["scheduler"].value("name", nlohmann::json()).is_string()) {
    sched = s["scheduler"]["name"].get<std::string>();
  }
  if (!tc.scheduler && sched != "fifo") {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("Tuner::restore({}): the experiment ran the \"{}\" scheduler; pass "
                            "one of that kind in TuneConfig::scheduler (its state is restored "
                            "into it)",
                            path, sched));
  }
  Tuner t = cls ? Tuner(std::move(cls), space, tc, run, scaling)
                : Tuner(std::move(fn), space, tc, run, scaling);
  t.restore_ = options;
  t.restored_state_ = std::move(s);
  return t;
}

}  // namespace cairn::tune
