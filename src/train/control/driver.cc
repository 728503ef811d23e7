// The driver loop. One attempt:
//   1. Start the group; every rank gets the checkpoint to resume from: the
//      latest committed one, else resume_from_checkpoint.
//   2. Feed what the ranks say and when they exit into a ReportRound
//      (collective.h) and carry out what it answers: reserve a location and
//      send it to the uploaders, commit with CheckpointManager::commit_reserved
//      once every uploader's files are durable, release the ranks.
//   3. On a failure stop the whole group, remove the reserved location if a
//      round was uploading, and restart while FailureConfig allows.
// trainer_state.json in the experiment folder (atomic Storage::put) records
// the configuration needed by Trainer::restore, the failure count and how
// the run ended; every released round is added to the run's history
// (history.h: result.json, progress.csv, the TensorBoard event file).
#include "train/control/driver.h"
#include "train/control/entry_message.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cairn/commit.h"
#include "cairn/error.h"
#include "cairn/manager.h"
#include "experiment/layout.h"
#include "experiment/location.h"
#include "experiment/results.h"
#include "experiment/trainer_state.h"
#include "train/control/collective.h"
#include "train/control/net.h"
#include "train/control/preemption.h"
#include "train/control/scratch.h"
#include "train/control/sigterm.h"
#include "util/fs.h"
#include "util/json.h"
#include "util/log.h"
#include "util/settings.h"

namespace cairn::train_internal {

namespace {

// How long a failed attempt waits for its other ranks' exits before it
// stops them (Driver: failures at the same time are named together).
constexpr double kConcurrentFailureWindowS = 1.0;

double monotonic_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// "checkpoint_000003" of ".../exp/checkpoint_000003" (or ".../checkpoint_000003/").
std::string last_component(std::string_view uri) {
  while (uri.size() > 1 && uri.back() == '/') uri.remove_suffix(1);
  return std::string(uri.substr(uri.rfind('/') + 1));
}

struct Outcome {
  bool finished = false;
  bool preempted = false;  // stopped for preemption (finished or not)
  std::optional<Failure> failure;
  std::string stderr_tail;
};

class Driver {
 public:
  Driver(const DriverSpec& spec, const GroupFactory& start_group)
      : spec_(spec), start_group_(start_group) {}

  Result run() {
    SigtermNotice sigterm;
    sigterm_ = &sigterm;
    open_experiment();
    Result result;
    result.path = spec_.experiment_path;
    const int failures = run_attempts(result);
    release_memory_tier();
    finish(result, failures);
    return result;
  }

 private:
  // Opens and locks the experiment, refuses one this run may not continue,
  // and records in trainer_state.json that the run is running.
  void open_experiment() {
    storage_ = open_storage(spec_.experiment_uri);
    continuing_ = spec_.restoring;
    // Before the manager opens the experiment: opening removes leftovers and
    // applies this run's retention, which must not happen to an experiment
    // this run has no business continuing.
    if (!spec_.restoring) check_new_experiment();
    ManagerOptions manager_options;
    manager_options.before_delete = spec_.before_retention;
    manager_ = std::make_unique<CheckpointManager>(spec_.experiment_uri,
                                                   spec_.run.checkpoint_config, manager_options);
    if (spec_.tier_hosts) spec_.tier_hosts->opened(*manager_);
    // Another new run may have started the experiment between the check and
    // the lock; the lock makes this second look exact.
    if (!continuing_ && storage_->exists(experiment::kTrainerStateKey)) throw already_exists();
    state_ = continuing_ ? experiment::read_trainer_state(spec_.experiment_uri) : nlohmann::json();
    if (!state_.is_object()) state_ = nlohmann::json::object();
    state_["format"] = std::string(experiment::kTrainerStateFormat);
    state_["version"] = experiment::kTrainerStateVersion;
    state_["name"] = spec_.run.name;
    state_["storage_path"] = spec_.run.storage_path;
    state_["num_workers"] =
        spec_.stored_num_workers > 0 ? spec_.stored_num_workers : spec_.world_size;
    state_["min_workers"] = spec_.min_world_size;
    config_ = spec_.train_loop_config;
    state_["train_loop_config"] = config_;
    state_["checkpoint_config"] = spec_.run.checkpoint_config.to_json();
    state_["failure_config"] = {
        {"max_failures", spec_.run.failure_config.max_failures},
        {"report_timeout_s", spec_.run.failure_config.report_timeout_s},
        {"preemption_grace_s", spec_.run.failure_config.preemption_grace_s}};
    if (spec_.resume_from_checkpoint) {
      state_["resume_from_checkpoint"] = spec_.resume_from_checkpoint->uri();
    } else if (!state_.contains("resume_from_checkpoint")) {
      state_["resume_from_checkpoint"] = nullptr;
    }
    state_["status"] = "running";
    state_["driver_starts"] = state_.value("driver_starts", 0) + 1;  // checked: an integer
    state_["error"] = nullptr;
    // Before the state says "running": a damaged result.json refuses the run
    // (kCorruption naming it) with nothing changed.
    history_ = std::make_unique<experiment::RunResults>(storage_, wall_seconds);
    if (continuing_) {
      history_->backfill(manager_->history(), spec_.iteration_from_checkpoint,
                         spec_.experiment_uri);
    }
    save_state();
    if (spec_.before_start) spec_.before_start();
    if (spec_.sweep_scratch) {
      for (const auto& p : sweep_dead_scratch_dirs()) {
        log::info(fmt::format("removed {}, the scratch folder of a driver that died", p.string()));
      }
    }
  }

  // Runs attempts until one finishes, is preempted, or a failure is not to
  // be restarted from; fills `result`'s preemption and error. Returns the
  // number of group failures.
  int run_attempts(Result& result) {
    std::optional<std::string> resume;
    if (state_["resume_from_checkpoint"].is_string()) {
      resume = state_["resume_from_checkpoint"].get<std::string>();
    }
    int failures = 0;
    for (int attempt = 0;; ++attempt) {
      if (!size_attempt(result, attempt)) break;
      std::optional<std::string> from = resume;
      // A restart, or a restored run, resumes from what this experiment
      // committed: a copy in this host's memory is verified first, and a
      // damaged one dropped for the next copy. (Across hosts each host holds
      // only its ranks' files: that tier is not checked here.)
      std::vector<std::string> damaged;
      if (attempt > 0 || continuing_) {
        std::optional<CheckpointRecord> latest =
            spec_.tier_hosts ? manager_->latest() : manager_->latest_intact(&damaged);
        if (latest) from = latest->checkpoint.uri();
      }
      if (spec_.iteration_from_checkpoint) iteration_ = iteration_at(manager_->latest(), from);
      if (from) note_restore(result, attempt, *from, std::move(damaged));
      Outcome out = run_attempt(attempt, from);
      // A notice that came with a failure (mpirun's SIGTERM after one of its
      // processes died) wins: no group is started again only to be stopped.
      if (!out.preempted && !out.finished && sigterm_ != nullptr && sigterm_->received()) {
        preemption_.note("the driver received SIGTERM", monotonic_seconds());
      }
      if (preemption_.ended_as_asked()) {
        stop_now_ = true;  // the caller's end (RoundDirective::ends_run): no error
        break;
      }
      if (out.preempted || (preemption_.requested() && !out.finished)) {
        end_preempted(result, out);
        break;
      }
      if (out.finished) break;
      ++failures;
      const Failure& f = *out.failure;
      std::string message = f.message;
      if (f.rank >= 0 && !out.stderr_tail.empty()) {
        message +=
            fmt::format("\n--- last lines of rank {}'s stderr ---\n{}", f.rank, out.stderr_tail);
      }
      state_["failures"] = failures;
      state_["last_failure"] = message;
      const int budget = spec_.run.failure_config.max_failures;
      if (!should_restart(f, failures, budget)) {
        std::string why = !is_retryable(f.kind)
                              ? std::string("not retried: a restart would repeat it")
                          : budget < 0 ? std::string("")
                                       : fmt::format("max_failures={} spent", budget);
        result.error = fmt::format("training failed ({}{}{}) after {} attempt(s): {}",
                                   failure_kind_name(f.kind), why.empty() ? "" : "; ", why,
                                   attempt + 1, message);
        break;
      }
      log::warn(
          fmt::format("training group failed (attempt {}; restarting, {} of {} failures "
                      "used): {}",
                      attempt + 1, failures,
                      budget < 0 ? std::string("unlimited") : std::to_string(budget), message));
      save_state();
    }
    return failures;
  }

  // Ends the run as preempted: how the group stopped, where a restore resumes.
  void end_preempted(Result& result, const Outcome& out) {
    result.preempted = true;
    auto latest = manager_->latest();
    result.error = preemption_.error(
        out.finished, out.failure ? std::optional(out.failure->message) : std::nullopt,
        latest ? std::optional(fmt::format("Trainer::restore(\"{}\") resumes from {}",
                                           spec_.experiment_path, latest->checkpoint.uri()))
               : std::nullopt);
  }

  // Sets world_ for `attempt`: every rank, or for an elastic group
  // (DriverSpec::ranks_available) after a failure the ranks that remain.
  // False, with result.error set, when fewer remain than the group may run with.
  bool size_attempt(Result& result, int attempt) {
    const int before = attempt == 0 ? spec_.world_size : world_;
    world_ = spec_.world_size;
    if (spec_.ranks_available) world_ = spec_.ranks_available();
    if (world_ < spec_.min_world_size || world_ < 1) {
      result.error = fmt::format(
          "training failed: only {} of {} rank(s) remain after {} attempt(s), fewer than "
          "ScalingConfig::min_workers ({}); last failure: {}",
          world_, spec_.world_size, attempt, spec_.min_world_size,
          state_.value("last_failure", std::string("none")));
      return false;
    }
    if (world_ != before) {
      log::warn(
          fmt::format("attempt {}: the group restarts with {} rank(s) (it had {}; "
                      "ScalingConfig allows {} to {})",
                      attempt + 1, world_, before, spec_.min_world_size, spec_.world_size));
    }
    state_["world_size"] = world_;
    return true;
  }

  // Records, and logs, which checkpoint and tier an attempt starts from.
  void note_restore(Result& result, int attempt, const std::string& from,
                    std::vector<std::string> damaged) {
    Result::Restore r{attempt, last_component(from), "persistent", world_, {}, std::move(damaged)};
    std::optional<CheckpointRecord> latest = manager_->latest();
    if (latest && latest->checkpoint.uri() == from) {
      r.tier = latest->tier;
      if (spec_.tier_hosts && r.tier == "memory") {
        r.rank_tiers = spec_.tier_hosts->restoring(*latest, world_);
      }
    } else if (!latest || from.rfind(spec_.experiment_uri, 0) != 0) {
      r.tier = "external";  // resume_from_checkpoint outside this experiment
    }
    if (r.rank_tiers.empty()) {
      log::info(fmt::format("attempt {}: every rank restores from {} ({} tier: {})", attempt + 1,
                            r.checkpoint, r.tier, from));
    } else {
      std::vector<std::string> by_rank;
      for (size_t k = 0; k < r.rank_tiers.size(); ++k) {
        by_rank.push_back(fmt::format("rank {} from {}", k, r.rank_tiers[k]));
      }
      log::info(fmt::format("attempt {}: the ranks restore from {} in the memory tier ({}): {}",
                            attempt + 1, r.checkpoint, from, fmt::join(by_rank, ", ")));
    }
    result.restores.push_back(std::move(r));
  }

  // The memory tier's newest checkpoint is persisted and its memory freed
  // once the run ends, however it ended; a failure keeps the tier, so that
  // Trainer::restore resumes from it.
  void release_memory_tier() {
    try {
      if (spec_.tier_hosts) spec_.tier_hosts->release();
      manager_->release_memory_tier();
    } catch (const Error& e) {
      log::warn(fmt::format("{}: the memory tier is kept for Trainer::restore: {}",
                            spec_.experiment_path, e.what()));
    }
  }

  // Fills the rest of `result` and records how the run ended.
  void finish(Result& result, int failures) {
    result.metrics = last_metrics_;
    result.metrics_history = history_->rows();
    if (auto latest = manager_->latest()) result.checkpoint = latest->checkpoint;
    for (const auto& r : manager_->best())
      result.best_checkpoints.push_back({r.checkpoint, r.metrics});
    state_["status"] = result.preempted ? "preempted"
                       : result.error   ? "errored"
                       : stop_now_      ? "stopped"
                                        : "finished";
    state_["error"] = result.error ? nlohmann::json(*result.error) : nlohmann::json(nullptr);
    state_["metrics"] = last_metrics_;
    save_state();
    if (spec_.outcome != nullptr) {
      spec_.outcome->status = state_["status"].get<std::string>();
      spec_.outcome->failures = failures;
    }
  }

  // A new run (not Trainer::restore) refuses a name that already holds an
  // experiment unless RunConfig::resume_existing says to continue it, and a
  // storage_path that is itself an experiment (the new one would nest in it).
  void check_new_experiment() {
    auto parent = open_storage(spec_.run.storage_path);
    for (std::string_view marker : {experiment::kTrainerStateKey, experiment::kManagerHistoryKey}) {
      if (parent->exists(marker)) {
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("RunConfig::storage_path {} is itself an experiment folder (it "
                                "holds {}); experiment {} would nest inside it. Use the folder "
                                "that holds the experiments, e.g. its parent",
                                spec_.run.storage_path, marker, spec_.run.name));
      }
    }
    if (!experiment::holds_experiment(*storage_)) return;
    if (!spec_.run.resume_existing) {
      // A live driver holds the experiment's lock: say that rather than "exists".
      std::unique_ptr<Lock> probe = storage_->try_lock(experiment::kLockKey);
      throw already_exists();
    }
    continuing_ = true;
    log::info(fmt::format("continuing the experiment at {} (RunConfig::resume_existing)",
                          spec_.experiment_path));
  }

  Error already_exists() const {
    return Error(ErrorCode::kAlreadyExists,
                 fmt::format("{}: an experiment already exists here; continue it with "
                             "Trainer::restore(\"{}\", train_fn) (Trainer::can_restore tells "
                             "whether it can), set RunConfig::resume_existing to continue it with "
                             "this Trainer's configuration, or choose another RunConfig::name",
                             spec_.experiment_path, spec_.experiment_path));
  }

  void save_state() {
    state_["updated_at"] = wall_seconds();
    experiment::write_trainer_state(*storage_, state_);
  }

  Outcome run_attempt(int attempt, const std::optional<std::string>& from) {
    attempt_ = attempt;
    LaunchSpec launch;
    launch.train_fn = spec_.train_fn;
    launch.train_loop_config = config_;
    launch.context.world_size = world_;
    launch.context.local_world_size = world_;
    launch.context.experiment_name = spec_.run.name;
    launch.context.storage_path = spec_.run.storage_path;
    launch.context.experiment_path = spec_.experiment_path;
    launch.context.attempt = attempt;
    // A fresh rendezvous port per attempt, held until this attempt's group is
    // gone (declared before it, so destroyed after it).
    PortReservation rendezvous(spec_.rendezvous_bind);
    launch.context.master_addr = spec_.rendezvous_address;
    launch.context.master_port = rendezvous.port();
    launch.checkpoint_uri = from;
    failure_.reset();
    finished_ = false;
    timings_.clear();
    // Removed in the background by the next attempt (scratch_remover_),
    // once the group is gone (declared before it): a restart does not wait
    // for the kernel to free what the workers wrote.
    ScratchDir scratch(&scratch_remover_);
    launch.scratch_dir = scratch.path().string();

    ReportRound round(world_, spec_.run.failure_config.report_timeout_s,
                      spec_.run.checkpoint_config.checkpoint_score_attribute);
    // The group may fork: no deleter thread may be inside a storage call
    // (holding its locks) when the children are copied from this process.
    manager_->wait_for_deletes();
    scratch_remover_.start();  // the last attempt's folder, in a child of its own
    std::unique_ptr<Group> group = start_group_(launch);
    std::optional<Checkpoint> reserved;
    Outcome out;
    // Bounded by the training itself: every wait below ends when a worker
    // speaks, exits or a ReportRound deadline passes.
    while (true) {
      std::vector<GroupEvent> events = group->poll(50);
      std::vector<ReportRound::Action> actions;
      const double now = monotonic_seconds();
      for (auto& e : events) actions.push_back(handle_event(round, e, now));
      actions.push_back(round.tick(monotonic_seconds()));
      for (auto& a : actions) {
        if (a.type == ReportRound::Action::kNone) continue;
        perform(round, *group, a, reserved);
        // perform() may fail the round (a commit error) in place.
      }
      if (round.failed()) break;
      if (stop_now_) {
        group->stop();
        if (reserved) discard_reserved(*reserved);
        out.finished = true;
        return out;
      }
      if (finished_) {
        finished_ = false;
        group->wait_all(10000);
        out.finished = true;
        out.preempted = preemption_.requested();
        return out;
      }
      if (preemption_ends_attempt(monotonic_seconds())) {
        group->stop();
        if (reserved) discard_reserved(*reserved);
        out.preempted = true;
        return out;
      }
    }
    // A group failing while it is being preempted (the platform killing a
    // worker) is the preemption, not a failure to restart from.
    if (preemption_.requested()) out.preempted = true;
    // Ranks failing at about the same time are named with the first: a rank
    // killed makes its peers' collectives fail a moment later, and which
    // exit the driver sees first is up to the scheduler. A short wait lets
    // their exits in; it is bounded, and over as soon as no rank runs code
    // of its own (every other rank ended, or waits inside report(): the
    // usual case of a rank that died alone, whose restart it would delay).
    const double until = monotonic_seconds() + kConcurrentFailureWindowS;
    while (!round.none_running() && monotonic_seconds() < until) {
      for (auto& e : group->poll(20)) handle_event(round, e, monotonic_seconds());
    }
    failure_ = round.failure_with_concurrent();  // the loop ends only on a failed round
    out.failure = failure_;
    group->stop();
    if (out.failure->rank >= 0) out.stderr_tail = group->stderr_tail(out.failure->rank);
    if (reserved) discard_reserved(*reserved);
    return out;
  }

  void discard_reserved(const Checkpoint& reserved) {
    try {
      // Removes what was written and forgets the reservation (in either tier).
      manager_->abandon_reserved(reserved);
    } catch (const Error& e) {
      // ignore-error: the next open of the experiment removes it
      log::warn(
          fmt::format("could not remove the interrupted upload {}: {}", reserved.uri(), e.what()));
    }
  }

  // Notes the driver's SIGTERM and says whether the attempt should stop now
  // (Preemption::ends_attempt).
  bool preemption_ends_attempt(double now) {
    if (sigterm_ != nullptr && sigterm_->received())
      preemption_.note("the driver received SIGTERM", now);
    return preemption_.ends_attempt(now);
  }

  ReportRound::Action handle_event(ReportRound& round, const GroupEvent& e, double now) {
    if (e.type == GroupEvent::kExit) return round.on_exit(e.rank, e.clean, e.cause);
    const nlohmann::json& m = e.message;
    try {
      const std::string t = m.value("t", "");
      if (t == "report") {
        if (spec_.on_round_timing) {
          RoundTiming& timing = timings_[m.at("round").get<int>()];
          if (timing.first_report == 0) timing.first_report = now;
          timing.last_report = now;
        }
        if (m.value("preempted", false)) {
          preemption_.note(fmt::format("rank {} received SIGTERM", e.rank), now);
        }
        if (e.rank == 0 && m.value("attach", false))
          attach_rounds_.insert(m.at("round").get<int>());
        return round.on_report(e.rank, m.at("round").get<int>(),
                               m.value("metrics", nlohmann::json::object()),
                               m.value("checkpoint", false), now, m.value("notice", false));
      }
      if (t == "uploaded") {
        if (spec_.on_round_timing) timings_[m.at("round").get<int>()].last_uploaded = now;
        std::vector<ManifestEntry> files;
        for (const auto& f : m.at("files")) files.push_back(entry_of_message(f));
        return round.on_uploaded(e.rank, m.at("round").get<int>(), std::move(files),
                                 m.value("metadata", nlohmann::json()), now);
      }
      if (t == "error") return round.on_worker_error(e.rank, m.value("message", ""));
      if (t == "upload_failed") {
        return round.on_upload_failed(e.rank, m.at("round").get<int>(), m.value("message", ""));
      }
      if (t == "invalid_report") return round.on_invalid_report(e.rank, m.value("message", ""));
      if (t == "done") return round.on_done(e.rank, m.at("count").get<int>());
    } catch (const nlohmann::json::exception& ex) {
      return round.fail({FailureKind::kWorkerFailed, e.rank,
                         fmt::format("rank {} sent a malformed message: {}", e.rank, ex.what())});
    }
    return round.fail({FailureKind::kWorkerFailed, e.rank,
                       fmt::format("rank {} sent an unknown message: {}", e.rank, m.dump())});
  }

  void perform(ReportRound& round, Group& group, const ReportRound::Action& a,
               std::optional<Checkpoint>& reserved) {
    using A = ReportRound::Action;
    switch (a.type) {
      case A::kAck: {
        const bool attach = attach_rounds_.erase(a.round) > 0;
        if (!attach) {
          last_metrics_ = a.metrics;
          if (!record_history(round, a.round, std::nullopt)) return;
        }
        round.on_released();
        preemption_.on_release(a.round, false);
        release(round, group, a.round, attach, std::nullopt);
        report_timing(a.round, 0);
        return;
      }
      case A::kBeginUpload:
        try {
          reserved = manager_->reserve_next();
        } catch (const Error& e) {
          record_failure(round.fail(
              {FailureKind::kDriver, -1,
               fmt::format("reserving a checkpoint for report #{}: {}", a.round, e.what())}));
          return;
        }
        for (int r : a.uploaders) {
          group.send(r, {{"t", "upload"}, {"round", a.round}, {"dest", reserved->uri()}});
        }
        if (spec_.on_round_timing) timings_[a.round].upload_begun = monotonic_seconds();
        return;
      case A::kCommit: {
        const bool attach = attach_rounds_.erase(a.round) > 0;
        std::string uri;
        try {
          if (!a.metadata.empty()) {
            nlohmann::json merged = nlohmann::json::object();
            // Lower ranks win a key both set: iterate from the highest rank down.
            for (auto it = a.metadata.rbegin(); it != a.metadata.rend(); ++it) {
              for (auto kv = it->second.begin(); kv != it->second.end(); ++kv) {
                merged[kv.key()] = kv.value();
              }
            }
            reserved->set_metadata(merged);
          }
          // A checkpoint attached to the previous row carries that row's metrics.
          const nlohmann::json ranks = manifest_ranks(a, world_);
          if (spec_.tier_hosts) spec_.tier_hosts->replicate(*reserved, a.files);
          CheckpointRecord rec = manager_->commit_reserved(
              *reserved, checkpoint_metrics(attach ? last_metrics_ : a.metrics, attach), a.files,
              nullptr, nullptr, ranks);
          if (spec_.tier_hosts) spec_.tier_hosts->committed(rec);
          uri = rec.checkpoint.uri();
          if (spec_.on_round_timing) timings_[a.round].committed = monotonic_seconds();
        } catch (const Error& e) {
          record_failure(round.fail(
              {FailureKind::kDriver, -1,
               fmt::format("committing report #{}'s checkpoint: {}", a.round, e.what())}));
          return;
        }
        reserved.reset();
        if (!attach) {
          last_metrics_ = a.metrics;
          if (!record_history(round, a.round, last_component(uri))) return;
        }
        round.on_released();
        preemption_.on_release(a.round, true);
        release(round, group, a.round, attach, uri);
        report_timing(a.round, static_cast<int>(a.uploaders.size()));
        return;
      }
      case A::kFinished:
        finished_ = true;
        return;
      case A::kFailed:
        record_failure(a);
        return;
      case A::kNone:
        return;
    }
  }

  // Asks DriverSpec::on_round what to do after a round, then releases the
  // ranks (with a save request or a stop notice as it says) or, for a stop
  // without a save, leaves them waiting: the attempt ends and stops them.
  void release(ReportRound& round, Group& group, int round_no, bool attach,
               const std::optional<std::string>& uri) {
    RoundDirective d;
    if (spec_.on_round) {
      RoundInfo info;
      if (!attach) info.row = history_->rows().back();
      if (uri) info.checkpoint = last_component(*uri);
      for (const auto& r : manager_->history()) info.kept.push_back(r.name);
      try {
        d = spec_.on_round(info);
      } catch (const Error& e) {
        record_failure(round.fail(
            {FailureKind::kDriver, -1, fmt::format("after report #{}: {}", round_no, e.what())}));
        return;
      }
    }
    if (d.stop && !d.save) {
      stop_now_ = true;
      return;
    }
    nlohmann::json reset = nullptr;
    if (d.reset) {
      try {
        const Checkpoint from =
            Checkpoint::from_directory(d.reset->at("checkpoint").get<std::string>());
        CheckpointRecord rec = manager_->register_checkpoint(
            d.reset->value("metrics", nlohmann::json::object()), from);
        config_ = d.reset->at("config");
        if (spec_.iteration_from_checkpoint) iteration_ = iteration_at(rec, rec.checkpoint.uri());
        state_["train_loop_config"] = config_;
        save_state();
        reset = {{"config", config_}, {"checkpoint", rec.checkpoint.uri()}};
      } catch (const std::exception& e) {
        record_failure(round.fail(
            {FailureKind::kDriver, -1,
             fmt::format("after report #{}: taking the tuner's clone: {}", round_no, e.what())}));
        return;
      }
    }
    if (d.stop) {
      if (d.save && d.ends_run) preemption_.set_ends_run();
      preemption_.note("the tuner asked for a final checkpoint", monotonic_seconds(),
                       "the tuner's request for a final checkpoint");
      // This release carries the notice: a checkpoint committed in a later
      // round ends the attempt.
      preemption_.carried_by(round_no);
    }
    for (int r = 0; r < world_; ++r) {
      group.send(r, {{"t", "release"},
                     {"round", round_no},
                     {"checkpoint", uri ? nlohmann::json(*uri) : nlohmann::json(nullptr)},
                     {"preempt", preemption_.requested()},
                     {"save", d.save},
                     {"reset", reset}});
    }
  }

  // The metrics a checkpoint is committed with: the round's, plus (for
  // DriverSpec::iteration_from_checkpoint) the training_iteration it is
  // taken at: the round's row, or for an attached checkpoint the row before.
  nlohmann::json checkpoint_metrics(const nlohmann::json& metrics, bool attach) const {
    if (!spec_.iteration_from_checkpoint) return metrics;
    nlohmann::json m = metrics.is_object() ? metrics : nlohmann::json::object();
    m["training_iteration"] = attach ? iteration_ : iteration_ + 1;
    return m;
  }

  // The training_iteration an attempt resuming from `from` goes on from (see
  // DriverSpec::iteration_from_checkpoint): `latest`'s when it is `from`
  // (its metrics, or the history row that committed it), else 0.
  int64_t iteration_at(const std::optional<CheckpointRecord>& latest,
                       const std::optional<std::string>& from) const {
    if (!latest || !from || latest->checkpoint.uri() != *from) return 0;
    const nlohmann::json& m = latest->metrics;
    if (m.is_object() && m.contains("training_iteration") &&
        m["training_iteration"].is_number_integer()) {
      return m["training_iteration"].get<int64_t>();
    }
    // Committed before its metrics carried the iteration.
    const auto& rows = history_->rows();
    for (auto it = rows.rbegin(); it != rows.rend(); ++it) {
      if (it->value("checkpoint_dir_name", nlohmann::json()) == latest->name) {
        return it->value("training_iteration", int64_t{0});
      }
    }
    return static_cast<int64_t>(rows.size());
  }

  // Appends a released round to the run's history before its ranks go on,
  // so that a report() that returned is in result.json. A write that fails
  // fails the round like a commit that fails.
  bool record_history(ReportRound& round, int round_no, const std::optional<std::string>& dir) {
    try {
      if (!spec_.iteration_from_checkpoint) {
        history_->record(last_metrics_, dir, attempt_);
        return true;
      }
      history_->record(last_metrics_, dir, attempt_, iteration_ + 1);
      ++iteration_;
      return true;
    } catch (const Error& e) {
      record_failure(round.fail(
          {FailureKind::kDriver, -1,
           fmt::format("recording report #{} in the run's history: {}", round_no, e.what())}));
      return false;
    }
  }

  // DriverSpec::on_round_timing, once the round is released.
  void report_timing(int round_no, int uploaders) {
    if (!spec_.on_round_timing) return;
    auto it = timings_.find(round_no);
    if (it == timings_.end()) return;
    RoundTiming t = it->second;
    timings_.erase(it);
    t.attempt = attempt_;
    t.round = round_no;
    t.uploaders = uploaders;
    t.released = monotonic_seconds();
    if (uploaders == 0) {
      t.upload_begun = t.last_uploaded = t.last_report;
      t.committed = t.released;
    }
    spec_.on_round_timing(t);
  }

  void record_failure(const ReportRound::Action& a) {
    if (a.type == ReportRound::Action::kFailed && !failure_) failure_ = a.failure;
  }

  const DriverSpec& spec_;
  const GroupFactory& start_group_;
  BackgroundRemover scratch_remover_;  // outlives every attempt's ScratchDir
  std::unique_ptr<CheckpointManager> manager_;
  std::shared_ptr<Storage> storage_;
  nlohmann::json state_;
  nlohmann::json last_metrics_ = nlohmann::json::object();
  nlohmann::json config_;  // train_loop_config, as a tuner's reset left it
  std::unique_ptr<experiment::RunResults> history_;
  int attempt_ = 0;
  int world_ = 1;          // the ranks of the running attempt (elastic groups vary it)
  int64_t iteration_ = 0;  // the last row's training_iteration (iteration_from_checkpoint)
  std::optional<Failure> failure_;
  bool finished_ = false;
  bool stop_now_ = false;               // DriverSpec::on_round said stop
  std::set<int> attach_rounds_;         // rounds rank 0 reported with report_checkpoint()
  std::map<int, RoundTiming> timings_;  // rounds not yet released (on_round_timing)
  bool continuing_ = false;  // Trainer::restore, or resume_existing on an existing experiment
  const SigtermNotice* sigterm_ = nullptr;  // while run() runs
  Preemption preemption_{spec_.run.failure_config.preemption_grace_s};
};

}  // namespace

Result run_driver(const DriverSpec& spec, const GroupFactory& start_group) {
  Driver d(spec, start_group);
  return d.run();
}

void refuse_class_trainable_triggers(const CheckpointConfig& config, std::string_view who) {
  if (config.checkpoint_frequency == 0 && !config.checkpoint_at_end.value_or(false)) return;
  throw Error(
      ErrorCode::kInvalidArgument,
      fmt::format("{}: CheckpointConfig.{} is for class trainables of a Tuner; a "
                  "train_fn decides in its own loop when to checkpoint (pass a "
                  "checkpoint to train::report())",
                  who,
                  config.checkpoint_frequency != 0 ? "checkpoint_frequency" : "checkpoint_at_end"));
}

}  // namespace cairn::train_internal
