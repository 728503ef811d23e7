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
#include "tune/experiment.h"

#include <poll.h>
#include <signal.h>
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
#include <fmt/ranges.h>

#include "cairn/error.h"
#include "cairn/manager.h"
#include "experiment/layout.h"
#include "experiment/location.h"
#include "experiment/results.h"
#include "experiment/trainer_state.h"
#include "experiment/tuner_state.h"
#include "train/control/channel.h"
#include "train/control/sigterm.h"
#include "tune/domain.h"
#include "tune/trial_runner.h"
#include "util/fs.h"
#include "util/json.h"
#include "util/log.h"
#include "util/settings.h"

namespace cairn::tune::tuner_internal {

using internal::check_mode;

ResultGrid Experiment::run() {
  const double started = monotonic_seconds();
  fit_started_ = started;
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
    train_internal::SigtermNotice sigterm;
    loop(sigterm);
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
  grid.set_preempted(preempted_);
  return grid;
}

void Experiment::loop(const train_internal::SigtermNotice& sigterm) {
  while (true) {
    check_preemption(sigterm.received());
    check_draining_places();
    check_time_budget();
    // A stopper may end the experiment between results too (a time out, a
    // trial's error seen by a callback): no trial starts after that.
    if (!stop_experiment_ && spec_.tune.stopper && spec_.tune.stopper->stop_all()) {
      stop_experiment_ = true;
      dirty_ = true;
      log::info(
          fmt::format("{}: the stopper ended the experiment; no trial starts any more", path_));
    }
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
    take_returning_hosts();
    maybe_save_state(monotonic_seconds());
  }
}

int Experiment::running_count() const {
  int n = 0;
  for (const auto& t : trials_) n += t.place >= 0 ? 1 : 0;
  return n;
}

bool Experiment::has_runnable() {
  for (const auto& t : trials_) {
    if (t.info.status == TrialStatus::kPending || t.info.status == TrialStatus::kPaused) {
      return true;
    }
  }
  return !searcher_->finished();
}

void Experiment::fill_slots() {
  while (running_count() < max_concurrent_) {
    bool have_pending = false;
    for (const auto& t : trials_) have_pending |= t.info.status == TrialStatus::kPending;
    // A suggestion found ended on storage (a restore) is not one to start:
    // ask for the next.
    while (!have_pending && !searcher_->finished()) {
      const Trial* added = add_suggested_trial();
      if (added == nullptr) break;
      have_pending =
          added->info.status == TrialStatus::kPending || added->info.status == TrialStatus::kPaused;
    }
    std::vector<TrialView> candidates;
    for (const auto& t : trials_) {
      if (t.place < 0 &&
          (t.info.status == TrialStatus::kPending || t.info.status == TrialStatus::kPaused)) {
        candidates.push_back(view_of(t));
      }
    }
    if (candidates.empty()) return;
    // The least loaded place with room and, when the trials ask for GPUs,
    // free GPUs (every trial asks the same).
    const double gpu = spec_.tune.resources_per_trial.gpu;
    std::vector<int> running;
    std::vector<int> limit;
    std::vector<bool> gone;
    for (const Place& p : places_) {
      running.push_back(p.running);
      limit.push_back(p.limit);
      gone.push_back(!p.open());
    }
    std::optional<std::size_t> where;
    std::vector<std::string> ids;
    for (std::size_t p : placement_order(running, limit, gone)) {
      if (gpu > 0) {
        std::optional<std::vector<std::string>> got = places_[p].gpus->acquire(gpu);
        if (!got) continue;
        ids = std::move(*got);
      }
      where = p;
      break;
    }
    if (!where) return;
    std::optional<std::string> chosen = scheduler_->choose_trial_to_run(candidates);
    Trial* t = chosen ? find(*chosen) : nullptr;
    if (!chosen || t == nullptr || t->place >= 0) {
      if (gpu > 0) places_[*where].gpus->release(ids, gpu);
      if (!chosen) return;
      throw Error(ErrorCode::kInternal,
                  fmt::format("the {} scheduler chose \"{}\", which is not a waiting trial",
                              scheduler_->name(), *chosen));
    }
    t->gpu_ids = std::move(ids);
    t->place = static_cast<int>(*where);
    ++places_[*where].running;
    try {
      start(*t);
    } catch (...) {
      unplace(*t);
      throw;
    }
  }
}

const Trial* Experiment::add_suggested_trial() {
  const std::size_t index = next_index_;
  const std::string id = trial_id_for(index);
  std::optional<nlohmann::json> config = searcher_->suggest(id);
  if (!config) return nullptr;
  ++next_index_;
  Trial t;
  t.info.trial_id = id;
  t.info.index = index;
  t.info.config = *config;
  t.info.path = trial_path(id);
  // A folder the saved state did not know yet (the driver died after the
  // trial started, before the next save) is that trial, with the
  // configuration it ran with. On a restore, what its folder says happened
  // decides, as for the trials the state names (reconcile): a trial that was
  // running goes on only with RestoreOptions::resume_unfinished.
  auto trial_storage = storage_->child(id);
  if (trial_storage->exists(kParamsKey)) {
    t.info.config = parse_json(trial_storage->get(kParamsKey), trial_storage->uri_of(kParamsKey));
    refresh_checkpoints(t);
    if (spec_.restore) {
      const std::vector<nlohmann::json> rows = experiment::read_result_rows(*trial_storage);
      if (!rows.empty()) t.info.last_result = rows.back();
      t.info.status = TrialStatus::kRunning;
      t.expected_starts = 0;
      reconcile(t);
    }
  }
  check_storable_json(t.info.config, fmt::format("trial {}: config", id));
  scheduler_->on_trial_add(view_of(t));
  if (t.info.status == TrialStatus::kTerminated) {
    scheduler_->on_trial_complete(view_of(t), with_flat_keys(t.info.last_result));
    tell_searcher(t, false);
  } else if (t.info.status == TrialStatus::kError) {
    scheduler_->on_trial_error(view_of(t));
    tell_searcher(t, true);
  }
  trials_.push_back(std::move(t));
  dirty_ = true;
  return &trials_.back();
}

Trial* Experiment::find(const std::string& id) {
  for (auto& t : trials_) {
    if (t.info.trial_id == id) return &t;
  }
  return nullptr;
}

std::string Experiment::trial_path(const std::string& id) const {
  // A plain path for local storage (as the Trainer shows it), else the URI.
  return path_ == uri_ ? storage_->child(id)->uri() : path_ + "/" + id;
}

void Experiment::start(Trial& t) {
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
  const nlohmann::json before = experiment::read_trainer_state(trial_storage->uri());
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
  rs.resources = spec_.tune.resources_per_trial;

  if (t.place == 0) {
    tune_internal::ForkedRunner r = tune_internal::fork_runner(rs, t.gpu_ids, t.info.trial_id);
    t.pid = r.pid;
    t.channel = std::make_unique<train_internal::Channel>(std::move(r.channel),
                                                          fmt::format("trial {}", t.info.trial_id));
  } else {
    spec_.hosts->start(static_cast<std::size_t>(t.place - 1), t.info.trial_id,
                       runner_to_json(rs, t.gpu_ids));
    log::info(fmt::format("trial {} starts on {}", t.info.trial_id,
                          places_[static_cast<std::size_t>(t.place)].name));
  }
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

void Experiment::wait_for_runners(int timeout_ms) {
  std::vector<pollfd> fds;
  for (const auto& t : trials_) {
    if (t.channel) fds.push_back({t.channel->fd(), POLLIN, 0});
  }
  if (spec_.hosts != nullptr) {
    for (int fd : spec_.hosts->fds()) fds.push_back({fd, POLLIN, 0});
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
  if (spec_.hosts != nullptr) {
    for (const TrialHosts::Event& e : spec_.hosts->read()) on_host_event(e);
  }
}

void Experiment::take_returning_hosts() {
  if (spec_.hosts == nullptr) return;
  const std::vector<std::size_t> back = spec_.hosts->admit_returning();
  if (back.empty()) return;
  // Its trials were unplaced when it was lost: the place starts empty.
  const std::vector<PlaceOffer> offers = place_offers();
  for (std::size_t i : back) set_up_place(i + 1, offers.at(i + 1));
  count_slots();
}

void Experiment::on_host_event(const TrialHosts::Event& e) {
  const int place = static_cast<int>(e.host) + 1;
  if (e.type == TrialHosts::Event::kLost) {
    Place& p = places_.at(static_cast<std::size_t>(place));
    p.gone = true;
    count_slots();
    log::warn(fmt::format("Tuner: {} is lost ({}); no trial starts there unless it comes back",
                          p.name, e.why));
    for (auto& t : trials_) {
      if (t.place == place) resume_elsewhere(t, fmt::format("its host ({}) was lost", p.name));
    }
    return;
  }
  if (e.type == TrialHosts::Event::kPreempted) {
    Place& p = places_.at(static_cast<std::size_t>(place));
    if (!p.open()) return;
    p.draining = true;
    const double grace = spec_.run.failure_config.preemption_grace_s;
    p.drain_deadline = monotonic_seconds() + grace;
    count_slots();
    log::warn(fmt::format(
        "Tuner: {} received SIGTERM (its node is being preempted); no trial starts there any "
        "more, and each trial running there pauses with a checkpoint at its next result "
        "(within {} s, FailureConfig::preemption_grace_s) and resumes on another host",
        p.name, grace));
    return;
  }
  Trial* t = find(e.trial);
  // A trial that is not running there any more (killed, or its host was
  // taken for lost) is past what its runner says.
  if (t == nullptr || t->place != place) return;
  if (e.type == TrialHosts::Event::kMessage) {
    handle_message(*t, e.message);
    return;
  }
  unplace(*t);
  finish(*t, e.wait_status);
}

void Experiment::resume_elsewhere(Trial& t, const std::string& why) {
  unplace(t);
  if (t.ended) {
    finish(t, 0);  // its end arrived; only its exit did not
    return;
  }
  dirty_ = true;
  refresh_checkpoints(t);
  apply_deferred_retention(t);
  log::warn(
      fmt::format("trial {}: {}; it resumes on another host from its latest checkpoint (not "
                  "counted as a failure)",
                  t.info.trial_id, why));
  t.info.status = TrialStatus::kPaused;
}

bool Experiment::on_draining_place(const Trial& t) const {
  return t.place >= 0 && places_.at(static_cast<std::size_t>(t.place)).draining;
}

void Experiment::check_draining_places() {
  const double now = monotonic_seconds();
  for (std::size_t i = 1; i < places_.size(); ++i) {
    Place& p = places_[i];
    if (!p.draining || p.gone || p.running == 0 || now < p.drain_deadline) continue;
    log::warn(
        fmt::format("Tuner: the preemption grace time of {} is over; stopping the trials "
                    "still running there",
                    p.name));
    for (auto& t : trials_) {
      if (t.place != static_cast<int>(i)) continue;
      spec_.hosts->kill(i - 1, t.info.trial_id);
      resume_elsewhere(t, fmt::format("its host ({}) was preempted", p.name));
    }
  }
}

void Experiment::handle_message(Trial& t, const nlohmann::json& m) {
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

void Experiment::reply(Trial& t, const nlohmann::json& message) {
  if (t.place > 0) {
    spec_.hosts->send(static_cast<std::size_t>(t.place - 1), t.info.trial_id, message);
    return;
  }
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
std::vector<std::string> Experiment::retire(Trial& t, const std::vector<std::string>& doomed,
                                            const std::vector<std::string>& kept, bool may_defer) {
  t.kept = kept;
  t.text.clear();  // an ended trial's saved JSON names what it kept
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
void Experiment::apply_deferred_retention(Trial& t) {
  if (t.deferred.empty()) return;
  apply_retention(t);
}

void Experiment::apply_retention(Trial& t) {
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

nlohmann::json Experiment::on_round(Trial& t, const nlohmann::json& m) {
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

  if (preempted_) {
    t.ending = TrialStatus::kPaused;
    return {{"save", true}, {"stop", true}};
  }
  // Stopper::stop_all() ends every running trial at its next result.
  check_time_budget();
  bool stop = stop_experiment_ || meets_stop_criteria(row);
  if (!stop && spec_.tune.stopper) {
    stop = (*spec_.tune.stopper)(t.info.trial_id, row);
    if (spec_.tune.stopper->stop_all()) {
      stop_experiment_ = true;
      stop = true;
    }
  }
  // Its host is being preempted: unless it ends here, it pauses with a
  // checkpoint and resumes on another host; the scheduler sees its next
  // result there.
  if (!stop && on_draining_place(t)) {
    t.ending = TrialStatus::kPaused;
    return {{"save", true}, {"stop", true}};
  }
  SchedulerDecision d;
  if (!stop) d = scheduler_->on_trial_result(view_of(t), with_flat_keys(row));
  if (stop || d.action == SchedulerDecision::kStop) {
    t.ending = TrialStatus::kTerminated;
    // checkpoint_at_end: unless this very result came with a checkpoint,
    // which then is the final one (the runner stops at once).
    const bool save = spec_.class_trainable &&
                      spec_.run.checkpoint_config.checkpoint_at_end.value_or(true) &&
                      !m["checkpoint"].is_string();
    return {{"save", save}, {"stop", true}, {"end", true}};
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

bool Experiment::meets_stop_criteria(const nlohmann::json& row) const {
  for (auto it = spec_.tune.stop.begin(); it != spec_.tune.stop.end(); ++it) {
    std::optional<double> v = number_at(row, it.key());
    if (v && *v >= it->get<double>()) return true;
  }
  return false;
}

void Experiment::reap_runners() {
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
    unplace(t);
    finish(t, status);
  }
}

void Experiment::finish(Trial& t, int wait_status) {
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

void Experiment::complete(Trial& t) {
  // Ended before it took a clone sent in place: the clone is moot, and
  // the trial ran with its config before.
  if (t.reset_sent && t.clone) {
    t.info.config = t.config_before_reset;
    drop_clone(t);
  }
  t.info.status = TrialStatus::kTerminated;
  scheduler_->on_trial_complete(view_of(t), with_flat_keys(t.info.last_result));
  tell_searcher(t, false);
  for (auto& cb : spec_.tune.callbacks) cb->on_trial_complete(t.info);
}

// A trial completes once for the searcher, however often it is resumed.
void Experiment::tell_searcher(Trial& t, bool error) {
  if (t.searcher_told) return;
  t.searcher_told = true;
  searcher_->on_trial_complete(t.info.trial_id, t.info.last_result, error);
}

double Experiment::time_used() const {
  return time_used_before_ + (monotonic_seconds() - fit_started_);
}

void Experiment::check_preemption(bool notice) {
  if (notice && !preempted_) {
    preempted_ = true;
    stop_experiment_ = true;
    dirty_ = true;
    const double grace = spec_.run.failure_config.preemption_grace_s;
    preempt_deadline_ = monotonic_seconds() + grace;
    log::warn(
        fmt::format("{}: SIGTERM: preempted; no trial starts any more, each running one "
                    "pauses with a checkpoint at its next result (within {} s, "
                    "FailureConfig::preemption_grace_s); Tuner::restore goes on from there",
                    path_, grace));
  }
  if (preempted_ && running_count() > 0 && monotonic_seconds() >= preempt_deadline_) {
    log::warn(
        fmt::format("{}: the preemption grace time is over; stopping the trials still "
                    "running (each resumes from its latest checkpoint)",
                    path_));
    for (auto& t : trials_) {
      if (t.place >= 0) t.info.status = TrialStatus::kPaused;
    }
    stop_all_runners();
  }
}

void Experiment::check_time_budget() {
  const double budget = spec_.tune.time_budget_s;
  if (budget <= 0 || stop_experiment_ || time_used() < budget) return;
  stop_experiment_ = true;
  dirty_ = true;
  log::info(
      fmt::format("{}: the time budget of {} s (TuneConfig::time_budget_s) is spent; no "
                  "trial starts any more and each running one stops at its next result",
                  path_, budget));
}

void Experiment::stop_all_runners() {
  for (auto& t : trials_) {
    if (t.place > 0) spec_.hosts->kill(static_cast<std::size_t>(t.place - 1), t.info.trial_id);
    if (t.pid > 0) {
      ::kill(t.pid, SIGKILL);
      int status = 0;
      ::waitpid(t.pid, &status, 0);
    }
    if (t.place >= 0) unplace(t);
  }
}

void Experiment::unplace(Trial& t) {
  if (t.place < 0) return;
  Place& p = places_.at(static_cast<std::size_t>(t.place));
  if (!t.gpu_ids.empty()) p.gpus->release(t.gpu_ids, spec_.tune.resources_per_trial.gpu);
  t.gpu_ids.clear();
  --p.running;
  t.place = -1;
  t.pid = -1;
  t.channel.reset();
}

}  // namespace cairn::tune::tuner_internal
