// The Tuner experiment's state: opening the experiment, tuner_state.json
// (saved through experiment/tuner_state.h, periodically), restoring it and
// reconciling each trial with what its own folder says happened later.
#include "tune/experiment.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "cairn/error.h"
#include "cairn/manager.h"
#include "experiment/layout.h"
#include "experiment/location.h"
#include "experiment/results.h"
#include "experiment/trainer_state.h"
#include "experiment/tuner_state.h"
#include "manager/memory_tier.h"
#include "train/control/channel.h"
#include "train/control/net.h"
#include "train/control/scratch.h"
#include "tune/domain.h"
#include "tune/trial_runner.h"
#include "util/fs.h"
#include "util/json.h"
#include "util/log.h"
#include "util/settings.h"

namespace cairn::tune::tuner_internal {

using internal::check_mode;

double monotonic_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string trial_id_for(std::size_t index) { return fmt::format("trial_{:05d}", index); }

std::optional<double> number_at(const nlohmann::json& result, const std::string& key) {
  if (!result.is_object()) return std::nullopt;
  const nlohmann::json* found = nullptr;
  if (auto it = result.find(key); it != result.end()) {
    found = &*it;
  } else {
    // Ray's flattened name of a nested metric: "eval/loss" is
    // result["eval"]["loss"].
    const nlohmann::json* node = &result;
    size_t at = 0;
    while (true) {
      if (node == nullptr || !node->is_object()) {
        node = nullptr;  // a part of the name is missing, or not an object
        break;
      }
      const size_t slash = key.find('/', at);
      auto it =
          node->find(key.substr(at, slash == std::string::npos ? std::string::npos : slash - at));
      node = it == node->end() ? nullptr : &*it;
      if (slash == std::string::npos) break;
      at = slash + 1;
    }
    found = node;
  }
  if (found == nullptr || !found->is_number()) return std::nullopt;
  const double v = found->get<double>();
  if (std::isnan(v)) return std::nullopt;
  return v;
}

nlohmann::json with_flat_keys(const nlohmann::json& result) {
  if (!result.is_object()) return result;
  nlohmann::json out = result;
  auto add = [&](auto&& self, const nlohmann::json& node, const std::string& prefix) -> void {
    for (auto it = node.begin(); it != node.end(); ++it) {
      const std::string name = prefix + it.key();
      if (it->is_object()) {
        self(self, *it, name + "/");
      } else if (it->is_number() && !out.contains(name)) {
        out[name] = *it;
      }
    }
  };
  for (auto it = result.begin(); it != result.end(); ++it) {
    if (it->is_object()) add(add, *it, it.key() + "/");
  }
  return out;
}

nlohmann::json failure_config_json(const FailureConfig& f) {
  return {{"max_failures", f.max_failures},
          {"report_timeout_s", f.report_timeout_s},
          {"preemption_grace_s", f.preemption_grace_s}};
}

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

// ---- opening and the state --------------------------------------------

int Experiment::place_limit(const PlaceOffer& offer) const {
  const int configured = spec_.tune.max_concurrent_trials;
  const bool one_place = spec_.hosts == nullptr || spec_.hosts->size() == 0;
  // max_concurrent_trials bounds the whole experiment; on one place that
  // is the place's bound, as before there were several.
  if (configured > 0) return one_place ? configured : INT_MAX;
  return default_slots(offer.cores, spec_.tune.resources_per_trial.cpu, spec_.num_workers);
}

void Experiment::count_slots() {
  if (spec_.tune.max_concurrent_trials > 0) {
    max_concurrent_ = spec_.tune.max_concurrent_trials;
    return;
  }
  long total = 0;
  for (const Place& p : places_) total += p.open() ? p.limit : 0;
  max_concurrent_ = static_cast<int>(std::clamp<long>(total, 1, INT_MAX));
}

std::vector<PlaceOffer> Experiment::place_offers() const {
  std::vector<std::string> hosts{train_internal::host_name()};
  std::vector<PlaceOffer> offers{own_offer(spec_.tune)};
  if (spec_.hosts != nullptr) {
    for (std::size_t i = 0; i < spec_.hosts->size(); ++i) {
      hosts.push_back(spec_.hosts->host(i));
      offers.push_back(spec_.hosts->offer(i));
    }
  }
  return share_hosts(hosts, std::move(offers));
}

void Experiment::set_up_place(std::size_t i, const PlaceOffer& offer) {
  Place& p = places_.at(i);
  p.name = i == 0 ? "this host" : spec_.hosts->name(i - 1);
  p.limit = place_limit(offer);
  p.gpus = std::make_unique<GpuPool>(offer.gpu_ids);
  p.running = 0;
  p.gone = false;
  p.draining = false;
}

void Experiment::make_places() {
  const TrialResources& want = spec_.tune.resources_per_trial;
  const bool one_place = spec_.hosts == nullptr || spec_.hosts->size() == 0;
  const std::vector<PlaceOffer> offers = place_offers();
  places_.resize(offers.size());
  for (std::size_t i = 0; i < offers.size(); ++i) set_up_place(i, offers[i]);
  count_slots();
  // A request no place can ever hold is refused before any trial starts.
  std::optional<Error> refused;
  for (const Place& p : places_) {
    try {
      p.gpus->check_request(want.gpu);
      return;
    } catch (const Error& e) {
      if (!refused) refused = e;
    }
  }
  if (one_place || want.gpu <= 0) throw *refused;
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("{} (on every one of the {} hosts of the launch)", refused->what(),
                          places_.size()));
}

void Experiment::open_experiment() {
  experiment::ExperimentLocation loc =
      experiment::locate_experiment(spec_.run.storage_path, spec_.run.name);
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
        ParamSpace(spec_.param_space, spec_.tune.sample_functions),
        static_cast<std::size_t>(spec_.tune.num_samples), spec_.tune.seed);
  }
  // Once here, not in every trial's runner.
  for (const auto& p : train_internal::sweep_dead_scratch_dirs()) {
    log::info(fmt::format("removed {}, the scratch folder of a driver that died", p.string()));
  }
  scheduler_ = spec_.tune.scheduler;
  if (!scheduler_) scheduler_ = std::make_shared<FIFOScheduler>();
  scheduler_->set_search_properties(spec_.tune.metric, spec_.tune.mode);
  make_places();
  const Settings settings = Settings::from(Environment::process());
  if (const std::string& env = settings.tune_state_period_s; !env.empty()) {
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

void Experiment::load_saved_state() {
  const nlohmann::json& s = spec_.saved;
  const std::string where = storage_->uri_of(kStateKey);
  try {
    next_index_ = s.at("next_trial_index").get<std::size_t>();
    time_used_before_ = s.value("time_used_s", 0.0);
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
  const std::optional<int> keep = spec_.run.checkpoint_config.num_to_keep;
  for (auto& t : trials_) {
    t.info.path = trial_path(t.info.trial_id);
    reconcile(t);
    // A driver that died between a trial's end and its deferred retention
    // left it more checkpoints than it keeps; no runner of an ended trial
    // will open its manager again, so this restore applies the retention.
    const bool ended =
        t.info.status == TrialStatus::kTerminated || t.info.status == TrialStatus::kError;
    if (ended && keep && t.kept.size() > static_cast<size_t>(*keep)) apply_retention(t);
    // Ended after the state was saved: the searcher did not hear it then.
    if (t.info.status == TrialStatus::kTerminated || t.info.status == TrialStatus::kError) {
      tell_searcher(t, t.info.status == TrialStatus::kError);
    }
  }
}

// Brings a restored trial up to what its own folder says happened after
// the state was saved, and applies RestoreOptions.
void Experiment::reconcile(Trial& t) {
  const RestoreOptions& o = *spec_.restore;
  auto trial_storage = storage_->child(t.info.trial_id);
  nlohmann::json ts = experiment::read_trainer_state(trial_storage->uri());
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
    backfill_rows(trial_storage);
    const std::vector<nlohmann::json> rows = experiment::read_result_rows(*trial_storage);
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
  // No runner will open an ended trial's manager again: the memory tier a
  // killed runner left is persisted (its newest checkpoint) and freed now.
  const bool ended =
      t.info.status == TrialStatus::kTerminated || t.info.status == TrialStatus::kError;
  if (ended && holds_memory_tier(t)) {
    apply_retention(t);
    refresh_checkpoints(t);
  }
}

// A result committed with its checkpoint whose row the driver's death lost
// is a result too: its row is written before the trial is judged, so that a
// trial it ends keeps it (the runner of a resumed one would write it too).
void Experiment::backfill_rows(const std::shared_ptr<Storage>& trial) {
  ExperimentListing listing = read_experiment(trial->uri());
  merge_memory_tier(trial->uri(), listing);
  const std::vector<CheckpointRecord>& committed = listing.checkpoints;
  const std::vector<nlohmann::json> rows = experiment::read_result_rows(*trial);
  const int64_t last = rows.empty() ? 0 : rows.back().value("training_iteration", int64_t{0});
  const bool lost = std::any_of(committed.begin(), committed.end(), [&](const auto& r) {
    const nlohmann::json it = r.metrics.value("training_iteration", nlohmann::json());
    return it.is_number_integer() && it.get<int64_t>() > last;
  });
  if (lost) experiment::RunResults(trial, wall_seconds).backfill(committed, true, trial->uri());
}

ExperimentListing Experiment::read_trial(const std::string& trial_id) const {
  const std::string uri = storage_->child(trial_id)->uri();
  ExperimentListing listing = read_experiment(uri);
  merge_memory_tier(uri, listing);
  return listing;
}

bool Experiment::holds_memory_tier(const Trial& t) const {
  const MemoryTierConfig& tier = spec_.run.checkpoint_config.memory_tier;
  return tier.enabled &&
         find_memory_tier(storage_->child(t.info.trial_id)->uri(), tier.root).has_value();
}

void Experiment::refresh_checkpoints(Trial& t) {
  ExperimentListing listing = read_trial(t.info.trial_id);
  t.text.clear();  // an ended trial's saved JSON names what it kept
  t.kept.clear();
  for (const auto& r : listing.checkpoints) t.kept.push_back(r.name);
  if (!t.kept.empty()) t.info.latest_checkpoint = t.kept.back();
}

// The state as text. A trial that has ended (TERMINATED, ERROR) does not
// change until it is resumed, so its JSON is kept as text and spliced in:
// the cost of a save grows with the trials that are still going, not with
// the experiment's length.
std::string Experiment::state_text() {
  nlohmann::json cc = spec_.run.checkpoint_config.to_json();
  cc["checkpoint_frequency"] = spec_.run.checkpoint_config.checkpoint_frequency;
  const std::optional<bool> at_end = spec_.run.checkpoint_config.checkpoint_at_end;
  cc["checkpoint_at_end"] = at_end ? nlohmann::json(*at_end) : nlohmann::json(nullptr);
  const nlohmann::json head = {
      {"format", std::string(experiment::kTunerStateFormat)},
      {"version", experiment::kTunerStateVersion},
      {"name", spec_.run.name},
      {"storage_path", spec_.run.storage_path},
      {"updated_at", wall_seconds()},
      {"metric", spec_.tune.metric},
      {"mode", spec_.tune.mode},
      {"num_samples", spec_.tune.num_samples},
      {"max_concurrent_trials", spec_.tune.max_concurrent_trials},
      {"seed", std::to_string(spec_.tune.seed)},
      {"stop", spec_.tune.stop},
      {"time_budget_s", spec_.tune.time_budget_s},
      {"time_used_s", time_used()},
      {"resources_per_trial",
       {{"cpu", spec_.tune.resources_per_trial.cpu}, {"gpu", spec_.tune.resources_per_trial.gpu}}},
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

void Experiment::save_state() {
  const double t0 = monotonic_seconds();
  const std::string text = state_text();
  experiment::write_tuner_state(*storage_, text);
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
double Experiment::save_period() const {
  return fixed_period_ ? *fixed_period_ : std::max(1.0, 100 * last_save_duration_);
}

void Experiment::maybe_save_state(double now) {
  if (!dirty_) return;
  if (now - last_save_ >= save_period()) save_state();
}

ResultGrid Experiment::results() {
  std::vector<TrialInfo> infos;
  for (const auto& t : trials_) infos.push_back(t.info);
  return results_of(infos, *storage_, spec_.tune.metric, spec_.tune.mode, path_);
}

ResultGrid results_of(const std::vector<TrialInfo>& trials, Storage& storage,
                      const std::string& metric, const std::string& mode, const std::string& path) {
  std::vector<TrialResult> out;
  for (const auto& info : trials) {
    TrialResult r;
    try {
      static_cast<Result&>(r) = Result::from_path(storage.child(info.trial_id)->uri());
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kNotFound) throw;  // a trial that never ran
    }
    r.path = info.path;
    r.trial_id = info.trial_id;
    r.config = info.config;
    r.status = info.status;
    if (info.status == TrialStatus::kError) r.error = info.error;
    if (info.status == TrialStatus::kTerminated) {
      // Ended as the Tuner asked (a stop criterion, a scheduler, a final
      // checkpoint through the preemption path): not a failure, whatever
      // the trial's own run recorded when its workers were stopped.
      r.error.reset();
      r.preempted = false;
    }
    if (r.metrics.is_null() || r.metrics.empty()) {
      r.metrics = info.last_result.is_object() ? info.last_result : nlohmann::json::object();
    }
    out.push_back(std::move(r));
  }
  return ResultGrid(std::move(out), metric, mode, path);
}

ResultGrid saved_results(const nlohmann::json& saved, const std::string& uri,
                         const std::string& path) {
  auto storage = open_storage(uri);
  std::vector<TrialInfo> infos;
  std::string metric, mode;
  try {
    metric = saved.at("metric").get<std::string>();
    mode = saved.at("mode").get<std::string>();
    for (const auto& j : saved.at("trials")) {
      TrialInfo info = trial_from_json(j).info;
      // A plain path for local storage (as the Trainer shows it), else the URI.
      info.path = path == uri ? storage->child(info.trial_id)->uri() : path + "/" + info.trial_id;
      infos.push_back(std::move(info));
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("{}: {}", storage->uri_of(kStateKey), e.what()));
  }
  return results_of(infos, *storage, metric, mode, path);
}

}  // namespace cairn::tune::tuner_internal
