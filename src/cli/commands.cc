#include "cli/commands.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>

#include "cairn/error.h"
#include "cairn/storage.h"
#include "checkpoint/manifest_text.h"
#include "experiment/layout.h"
#include "experiment/tuner_state.h"
#include "manager/history_store.h"
#include "manager/memory_tier.h"
#include "manager/scan.h"
#include "util/json.h"
#include "util/log.h"

namespace cairn::cli {

namespace {

namespace fs = std::filesystem;

constexpr std::string_view kHistoryKey = experiment::kManagerHistoryKey;
using experiment::kParamsKey;
using experiment::kTunerStateKey;
using experiment::read_tuner_state;
using experiment::TunerState;
using experiment::TunerTrialState;

// Opens the storage at `path`, or throws kNotFound when nothing is there
// (check_root_exists), naming the path as the user gave it.
std::shared_ptr<Storage> open_existing(std::string_view path) {
  auto storage = open_storage(path);
  try {
    check_root_exists(*storage);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kInvalidArgument) throw;
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("{}: is a file; give a checkpoint, experiment or storage directory", path));
  }
  return storage;
}

// The checkpoint folders of one experiment, from a listing of its storage:
// name -> whether a manifest is listed in it (may be committed: whether it
// is whole, and what a torn one means, is told when it is read).
// `listing` and `incomplete`: the experiment's list_with_incomplete("").
std::map<uint64_t, std::pair<std::string, bool>> checkpoint_dirs(
    const std::vector<ObjectInfo>& listing, const std::vector<std::string>& incomplete) {
  std::map<uint64_t, std::pair<std::string, bool>> out;
  auto note = [&](const std::string& key, bool is_object) {
    size_t slash = key.find('/');
    // An object directly in the experiment is not a checkpoint's; an
    // incomplete write's id may be a whole (empty) checkpoint folder.
    if (slash == std::string::npos && is_object) return;
    std::string top = key.substr(0, slash);
    auto index = parse_checkpoint_name(top);
    if (!index) return;
    auto& entry = out[*index];
    entry.first = top;
    // Listed, whatever it holds: a torn one is damage or a leftover
    // (damaged_not_leftover), told apart where it is read.
    if (is_object && std::string_view(key).substr(slash + 1) == kManifestKey) {
      entry.second = true;
    }
  };
  for (const auto& o : listing) note(o.key, true);
  for (const auto& id : incomplete) note(id, false);
  return out;
}

std::map<uint64_t, std::pair<std::string, bool>> checkpoint_dirs(Storage& experiment) {
  std::vector<std::string> incomplete;
  std::vector<ObjectInfo> listing = experiment.list_with_incomplete("", incomplete);
  return checkpoint_dirs(listing, incomplete);
}

// A committed checkpoint's row: from its history record alone when that
// holds its size and file count, unless `check` (`ls --check`) asks for its
// manifest to be read; from its manifest otherwise (a record an older Cairn
// wrote, or no history).
CheckpointRow committed_row(const CheckpointRecord& r, bool check) {
  CheckpointRow row;
  row.name = r.name;
  row.index = r.index;
  row.uri = r.checkpoint.uri();
  row.committed = true;
  row.metrics = r.metrics;
  row.pinned = r.pinned;
  if (r.created_at > 0) row.time = r.created_at;
  if (!check && r.size_bytes && r.file_count && row.time) {
    row.size_bytes = *r.size_bytes;
    row.file_count = *r.file_count;
    return row;
  }
  try {
    Manifest m = r.checkpoint.manifest();
    row.size_bytes = m.total_bytes();
    row.file_count = m.files.size();
    if (!row.time) row.time = m.created_at;
    if (row.metrics.is_null()) row.metrics = m.metrics;
  } catch (const Error& e) {
    // Listed with the reason; `cairn verify` fails on it.
    row.error = e.what();
  }
  return row;
}

CheckpointRow leftover_row(Storage& experiment, const std::string& name) {
  CheckpointRow row;
  row.name = name;
  row.index = parse_checkpoint_name(name).value_or(0);
  auto storage = experiment.child(name);
  row.uri = storage->uri();
  row.committed = false;
  uint64_t size = 0, count = 0;
  std::optional<double> newest;
  for (const auto& o : storage->list("")) {
    size += o.size;
    ++count;
    newest = std::max(newest.value_or(o.modified), o.modified);
  }
  row.size_bytes = size;
  row.file_count = count;
  row.time = newest;
  return row;
}

// Checks `cp` against its manifest: `manifest_text` when the caller has
// read it already (so that it is read once), else read here.
void verify_checkpoint(const Checkpoint& cp, VerifyView& view,
                       const std::string* manifest_text = nullptr) {
  VerifiedCheckpoint checked;
  checked.uri = cp.uri();
  try {
    Manifest m = manifest_text ? Manifest::parse(*manifest_text, cp.storage().uri_of(kManifestKey))
                               : cp.manifest();
    checked.files = m.files.size();
    checked.bytes = m.total_bytes();
    auto problems = cp.verify(m);
    for (const auto& p : problems) view.problems.push_back({cp.uri(), p.path, p.reason});
    checked.ok = problems.empty();
  } catch (const Error& e) {
    // A manifest that cannot be parsed (or vanished between listing and
    // reading) is this checkpoint's failure, not the command's.
    if (e.code() != ErrorCode::kCorruption && e.code() != ErrorCode::kNotFound) throw;
    view.problems.push_back({cp.uri(), std::string(kManifestKey), e.what()});
    checked.ok = false;
  }
  view.checkpoints.push_back(std::move(checked));
}

// Adds to `listing` the checkpoints that only this host's memory tier holds
// (docs/memory-tier.md: after a crash, the newest ones), as records whose
// tier is "memory", and returns the indices the tier holds. A damaged tier
// is named in `e.error`; the persistent checkpoints are still listed.
std::set<uint64_t> add_memory_tier(ExperimentView& e, ExperimentListing& listing) {
  try {
    return merge_memory_tier(e.uri, listing);
  } catch (const Error& err) {
    if (err.code() != ErrorCode::kCorruption) throw;
    if (!e.error.empty()) e.error += "; ";
    e.error += fmt::format("the memory tier: {}", err.what());
    return {};
  }
}

// One Trainer experiment (or trial folder) as `cairn ls` lists it: its
// checkpoints from its history, read without the lock. A damaged history is
// reported in `error`, and the checkpoints are then read from their manifests.
ExperimentView trainer_experiment(const std::shared_ptr<Storage>& storage, std::string name,
                                  bool check = false) {
  ExperimentView e;
  e.name = std::move(name);
  e.uri = storage->uri();
  ExperimentListing listing;
  try {
    listing = read_experiment(storage->uri());
  } catch (const Error& err) {
    // One damaged history does not hide the other experiments: this one is
    // listed with the error, and its checkpoints from their own manifests.
    if (err.code() != ErrorCode::kCorruption) throw;
    e.error = err.what();
    listing.uri = storage->uri();
    for (const auto& [index, entry] : checkpoint_dirs(*storage)) {
      const auto& [dir, committed] = entry;
      if (!committed || !Checkpoint(storage->child(dir)).is_committed()) {
        listing.uncommitted.push_back(dir);
        continue;
      }
      // Metrics and time come from the manifest in committed_row(); the
      // config is unknown, so ranking is by recency.
      listing.checkpoints.emplace_back(index, Checkpoint(storage->child(dir)));
    }
  }
  e.config = listing.config;
  const std::set<uint64_t> in_memory = add_memory_tier(e, listing);
  for (const auto& r : rank_checkpoints(listing.checkpoints, listing.config)) {
    e.best.push_back(r.name);
  }
  for (const auto& r : listing.checkpoints) {
    CheckpointRow row = committed_row(r, check);
    row.persistent = r.tier != "memory";
    row.in_memory = in_memory.count(r.index) > 0;
    e.checkpoints.push_back(std::move(row));
  }
  for (const auto& n : listing.uncommitted) e.checkpoints.push_back(leftover_row(*storage, n));
  for (const auto& [n, why] : listing.damaged) {
    CheckpointRow row = leftover_row(*storage, n);
    row.committed = true;  // its files are what is left; `cairn verify` fails on it
    row.error =
        fmt::format("damaged after its commit: {}; kept (`cairn show` lists its files)", why);
    e.checkpoints.push_back(std::move(row));
  }
  std::stable_sort(
      e.checkpoints.begin(), e.checkpoints.end(),
      [](const CheckpointRow& a, const CheckpointRow& b) { return a.index < b.index; });
  return e;
}

// Names in an experiment folder that make it one (find_experiments' markers):
// checkpoint folders and the history's log folder.
bool is_experiment_marker(std::string_view folder) {
  return folder == history::kLogPrefix || parse_checkpoint_name(folder).has_value();
}

// Whether the folder `dir` of a Tuner experiment looks like a trial that the
// state does not list (yet): it holds params.json or is a Trainer experiment.
bool looks_like_trial(Storage& experiment, const std::string& dir) {
  for (const auto& name : experiment.list_names(dir)) {
    if (name == kParamsKey || name == kHistoryKey) return true;
    if (name.back() == '/' &&
        is_experiment_marker(std::string_view(name).substr(0, name.size() - 1)))
      return true;
  }
  return false;
}

// params.json of a trial folder as JSON; nullopt when absent.
std::optional<nlohmann::json> read_params(Storage& trial) {
  if (!trial.exists(kParamsKey)) return std::nullopt;
  return parse_json(trial.get(kParamsKey), trial.uri_of(kParamsKey));
}

TrialView trial_from_state(const TunerTrialState& t) {
  TrialView v;
  v.trial_id = t.trial_id;
  v.dir = t.dir;
  v.status = t.status;
  v.in_state = true;
  v.config = t.config;
  v.last_result = t.last_result;
  v.num_failures = t.num_failures;
  v.error = t.error;
  return v;
}

// A trial folder the state does not list (read_trial_folder() adds its config).
TrialView unlisted_trial(const std::string& dir) {
  TrialView v;
  v.trial_id = dir;
  v.dir = dir;
  v.status = "UNKNOWN";
  return v;
}

// Fills v.folder (and v.uri) from the trial's own folder; for a trial the
// state does not list, its config from params.json.
void read_trial_folder(TrialView& v, const std::shared_ptr<Storage>& trial, bool check) {
  v.uri = trial->uri();
  v.folder = trainer_experiment(trial, v.dir, check);
  if (v.in_state) return;
  try {
    if (auto params = read_params(*trial)) v.config = std::move(*params);
  } catch (const Error& err) {
    if (err.code() != ErrorCode::kCorruption) throw;
    if (!v.folder.error.empty()) v.folder.error += "; ";
    v.folder.error += err.what();
  }
}

// One Tuner experiment: tuner_state.json's trials, then any trial folder it
// does not list yet, each with the checkpoints of its own folder. `strict`:
// a damaged tuner_state.json is an error (kCorruption); otherwise it is
// reported in the experiment's `error` and every trial folder is listed as
// UNKNOWN.
ExperimentView tuner_experiment(const std::shared_ptr<Storage>& storage, std::string name,
                                bool strict, bool check) {
  ExperimentView e;
  e.name = std::move(name);
  e.uri = storage->uri();
  auto tuner = std::make_shared<TunerView>();
  std::optional<TunerState> state;
  try {
    state = read_tuner_state(*storage);
  } catch (const Error& err) {
    if (strict || err.code() != ErrorCode::kCorruption) throw;
    e.error = err.what();
  }
  std::set<std::string> folders;
  for (const auto& n : storage->list_names("")) {
    if (n.back() == '/') folders.insert(n.substr(0, n.size() - 1));
  }
  std::set<std::string> listed;
  if (state) {
    tuner->metric = state->metric;
    tuner->mode = state->mode;
    tuner->updated_at = state->updated_at;
    for (const auto& t : state->trials) {
      TrialView v = trial_from_state(t);
      listed.insert(t.dir);
      if (folders.count(t.dir) == 0) {
        v.folder_missing = true;
        v.uri = storage->uri_of(t.dir);
        v.folder.name = t.dir;
        v.folder.uri = v.uri;
      } else {
        read_trial_folder(v, storage->child(t.dir), check);
      }
      tuner->trials.push_back(std::move(v));
    }
  }
  for (const auto& dir : folders) {
    if (listed.count(dir) != 0 || !looks_like_trial(*storage, dir)) continue;
    auto trial = storage->child(dir);
    TrialView v = unlisted_trial(dir);
    read_trial_folder(v, trial, check);
    tuner->trials.push_back(std::move(v));
  }
  e.tuner = std::move(tuner);
  return e;
}

// The URI of the folder holding `uri`; nullopt at the top of a bucket or
// memory store.
std::optional<std::string> parent_uri(std::string uri) {
  while (!uri.empty() && uri.back() == '/') uri.pop_back();
  const size_t scheme = uri.find("://");
  const size_t top = scheme == std::string::npos ? 0 : scheme + 3;
  const size_t slash = uri.rfind('/');
  if (slash == std::string::npos || slash < top) return std::nullopt;
  // file:///x: the parent is the root directory; s3://bucket/x: the bucket.
  return slash == top ? uri.substr(0, slash + 1) : uri.substr(0, slash);
}

// The last segment of `uri`: a folder's name in its parent.
std::string base_name(std::string uri) {
  while (!uri.empty() && uri.back() == '/') uri.pop_back();
  return uri.substr(uri.rfind('/') + 1);
}

// Complete lines of result.json (those ending in a line break; a last one
// torn by a crash is left out), and the last of them parsed; {0, null} when
// the file is absent.
std::pair<uint64_t, nlohmann::json> read_results(Storage& trial) {
  constexpr std::string_view kResults = experiment::kResultJsonKey;
  if (!trial.exists(kResults)) return {0, nullptr};
  const std::string text = trial.get(kResults);
  uint64_t count = 0;
  std::string_view last;
  for (size_t at = 0, end; (end = text.find('\n', at)) != std::string::npos; at = end + 1) {
    std::string_view line(text.data() + at, end - at);
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    ++count;
    last = line;
  }
  if (last.empty()) return {count, nullptr};
  nlohmann::json row = parse_json(last, trial.uri_of(kResults));
  return {count, row.is_object() ? row : nlohmann::json(nullptr)};
}

// `storage` as a trial of a Tuner experiment, when it is one: it holds
// params.json, or its parent's tuner_state.json lists it; nullopt otherwise.
// A damaged tuner_state.json in the parent is kCorruption naming it.
std::optional<TrialShowView> trial_show(const std::shared_ptr<Storage>& storage) {
  const std::string dir = base_name(storage->uri());
  std::optional<TunerState> state;
  std::string experiment_uri;
  if (auto parent_at = parent_uri(storage->uri())) {
    auto parent = open_storage(*parent_at);
    if (parent->exists(kTunerStateKey)) {
      state = read_tuner_state(*parent);
      experiment_uri = parent->uri();
    }
  }
  const TunerTrialState* listed = nullptr;
  if (state) {
    for (const auto& t : state->trials) {
      if (t.dir == dir) listed = &t;
    }
  }
  std::optional<nlohmann::json> params = read_params(*storage);
  if (!listed && !params) return std::nullopt;

  TrialShowView show;
  show.experiment_uri = experiment_uri;
  if (state) {
    show.state_updated_at = state->updated_at;
    show.metric = state->metric;
    show.mode = state->mode;
  }
  TrialView v = listed ? trial_from_state(*listed) : unlisted_trial(dir);
  v.uri = storage->uri();
  v.folder = trainer_experiment(storage, "");
  if (params) v.config = std::move(*params);  // the trial's own copy of its config
  auto [count, last] = read_results(*storage);
  show.result_count = count;
  if (v.last_result.is_null()) v.last_result = std::move(last);
  show.trial = std::move(v);
  return show;
}

}  // namespace

LsView collect_ls(std::string_view path, bool check) {
  auto root = open_existing(path);
  LsView view;
  view.uri = root->uri();
  const std::vector<std::string> top = root->list_names("");
  if (std::binary_search(top.begin(), top.end(), std::string(kTunerStateKey))) {
    // The path is a Tuner experiment: its state must be readable.
    view.experiments.push_back(tuner_experiment(root, "", /*strict=*/true, check));
    return view;
  }
  auto names = find_experiments(root->uri());
  if (names.empty() && root->exists(kManifestKey)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: is a checkpoint, not an experiment or storage root (use "
                            "`cairn show` for a checkpoint)",
                            root->uri()));
  }
  // Tuner experiments directly below: folders that are no Trainer experiment
  // (a Tuner's trials are one level further down, so find_experiments does
  // not see them) but hold tuner_state.json.
  std::vector<std::string> tuners;
  for (const auto& name : top) {
    if (name.back() != '/') continue;
    std::string folder = name.substr(0, name.size() - 1);
    if (is_experiment_marker(folder) ||
        std::find(names.begin(), names.end(), folder) != names.end()) {
      continue;
    }
    if (root->exists(join_key(folder, kTunerStateKey))) tuners.push_back(std::move(folder));
  }
  for (const auto& name : names) {
    view.experiments.push_back(
        trainer_experiment(name.empty() ? root : root->child(name), name, check));
  }
  for (const auto& name : tuners) {
    // One damaged tuner state does not hide the other experiments.
    view.experiments.push_back(tuner_experiment(root->child(name), name, /*strict=*/false, check));
  }
  std::stable_sort(
      view.experiments.begin(), view.experiments.end(),
      [](const ExperimentView& a, const ExperimentView& b) { return a.name < b.name; });
  return view;
}

ShowView collect_show(std::string_view path) {
  auto storage = open_existing(path);
  Checkpoint cp(storage);
  ShowView view;
  view.uri = cp.uri();
  view.committed = cp.is_committed();
  if (!view.committed) {
    if (auto trial = trial_show(storage)) {
      view.trial = std::move(*trial);
      return view;
    }
  }
  if (view.committed) {
    try {
      view.manifest = cp.manifest();
    } catch (const Error& e) {
      // Damaged after its commit: what is left, for a person to salvage.
      if (e.code() != ErrorCode::kCorruption) throw;
      view.damage = e.what();
      for (const auto& f : cp.files()) view.files.push_back({f.key, f.size, std::nullopt});
    }
    if (view.manifest) {
      for (const auto& f : view.manifest->files) view.files.push_back({f.path, f.size, f.xxh3});
    }
  } else {
    auto experiments = find_experiments(storage->uri());
    if (!experiments.empty()) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: is an experiment or storage root, not a checkpoint (use "
                              "`cairn ls` to list its checkpoints)",
                              cp.uri()));
    }
    for (const auto& f : cp.files()) view.files.push_back({f.key, f.size, std::nullopt});
  }
  try {
    view.metadata = cp.get_metadata();
  } catch (const Error& e) {
    // ignore-error: a damaged checkpoint's metadata may be damaged too; the
    // files above are what show is for.
    if (!view.damage || e.code() != ErrorCode::kCorruption) throw;
  }
  return view;
}

VerifyView collect_verify(std::string_view path) {
  auto root = open_existing(path);
  VerifyView view;
  view.uri = root->uri();
  if (root->exists(kManifestKey)) {
    verify_checkpoint(Checkpoint(root), view);
    return view;
  }
  auto names = find_experiments(root->uri());
  if (names.empty()) {
    throw Error(ErrorCode::kNotFound,
                fmt::format("{}: holds no committed checkpoint and no experiment", root->uri()));
  }
  for (const auto& name : names) {
    auto storage = name.empty() ? root : root->child(name);
    // One listing serves the history's check and the checkpoints' list.
    std::vector<std::string> incomplete;
    std::vector<ObjectInfo> listing = storage->list_with_incomplete("", incomplete);
    std::map<uint64_t, history::State::Entry> known;  // what the history vouches for
    try {
      known = history::load_history(*storage, listing, [](const std::string& m) {
                log::warn(m);
              }).state.records;
    } catch (const Error& e) {
      // A damaged history is a problem to report; the checkpoints are still
      // verified from their own manifests below.
      if (e.code() != ErrorCode::kCorruption) throw;
      view.problems.push_back({storage->uri(), std::string(kHistoryKey), e.what()});
    }
    for (const auto& [index, entry] : checkpoint_dirs(listing, incomplete)) {
      const auto& [dir, committed] = entry;
      // A torn manifest is damage, a failure naming it, where the history
      // lists the checkpoint or the store never tears a write; elsewhere it
      // is no commit, skipped like any leftover (the manager's next open or
      // `cairn gc` removes it).
      Checkpoint cp(storage->child(dir));
      std::optional<std::string> text;
      if (committed) text = read_whole_manifest(cp.storage());
      if (text) {
        verify_checkpoint(cp, view, &*text);
      } else if (committed && damaged_not_leftover(known.count(index) > 0,
                                                   storage->capabilities().torn_writes)) {
        verify_checkpoint(cp, view);
      } else {
        view.skipped.push_back(storage->uri_of(dir));
      }
    }
  }
  return view;
}

GcView collect_gc(std::string_view path, bool dry_run) {
  auto root = open_existing(path);
  GcView view;
  view.uri = root->uri();
  view.dry_run = dry_run;
  GcReport report = collect_garbage(root->uri(), dry_run);
  view.removed = std::move(report.removed);
  view.skipped = std::move(report.skipped);
  return view;
}

GcView collect_gc_memory_tiers(std::string_view root, bool dry_run) {
  GcView view;
  view.uri = root.empty() ? std::string("(the default memory tier root)") : std::string(root);
  view.dry_run = dry_run;
  GcReport report = collect_memory_tiers(root, dry_run);
  view.removed = std::move(report.removed);
  view.skipped = std::move(report.skipped);
  return view;
}

}  // namespace cairn::cli
