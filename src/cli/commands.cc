#include "cli/commands.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>

#include "cairn/error.h"
#include "cairn/storage.h"
#include "manager/history_store.h"
#include "util/log.h"

namespace cairn::cli {

namespace {

namespace fs = std::filesystem;

constexpr std::string_view kHistoryKey = "checkpoint_manager.json";

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
// name -> whether it holds a manifest (is committed).
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
    if (is_object && std::string_view(key).substr(slash + 1) == kManifestKey) entry.second = true;
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

CheckpointRow committed_row(const CheckpointRecord& r) {
  CheckpointRow row;
  row.name = r.name;
  row.index = r.index;
  row.uri = r.checkpoint.uri();
  row.committed = true;
  row.metrics = r.metrics;
  row.pinned = r.pinned;
  if (r.created_at > 0) row.time = r.created_at;
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

void verify_checkpoint(const Checkpoint& cp, VerifyView& view) {
  VerifiedCheckpoint checked;
  checked.uri = cp.uri();
  try {
    Manifest m = cp.manifest();
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

}  // namespace

LsView collect_ls(std::string_view path) {
  auto root = open_existing(path);
  LsView view;
  view.uri = root->uri();
  auto names = find_experiments(root->uri());
  if (names.empty() && root->exists(kManifestKey)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: is a checkpoint, not an experiment or storage root (use "
                            "`cairn show` for a checkpoint)",
                            root->uri()));
  }
  for (const auto& name : names) {
    auto storage = name.empty() ? root : root->child(name);
    ExperimentView e;
    e.name = name;
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
        if (!committed) {
          listing.uncommitted.push_back(dir);
          continue;
        }
        // Metrics and time come from the manifest in committed_row(); the
        // config is unknown, so ranking is by recency.
        listing.checkpoints.emplace_back(index, Checkpoint(storage->child(dir)));
      }
    }
    e.config = listing.config;
    for (const auto& r : rank_checkpoints(listing.checkpoints, listing.config)) {
      e.best.push_back(r.name);
    }
    for (const auto& r : listing.checkpoints) e.checkpoints.push_back(committed_row(r));
    for (const auto& n : listing.uncommitted) e.checkpoints.push_back(leftover_row(*storage, n));
    std::stable_sort(
        e.checkpoints.begin(), e.checkpoints.end(),
        [](const CheckpointRow& a, const CheckpointRow& b) { return a.index < b.index; });
    view.experiments.push_back(std::move(e));
  }
  return view;
}

ShowView collect_show(std::string_view path) {
  auto storage = open_existing(path);
  Checkpoint cp(storage);
  ShowView view;
  view.uri = cp.uri();
  view.committed = cp.is_committed();
  if (view.committed) {
    view.manifest = cp.manifest();
    for (const auto& f : view.manifest->files) view.files.push_back({f.path, f.size, f.xxh3});
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
  view.metadata = cp.get_metadata();
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
    try {
      (void)history::load_history(*storage, listing, [](const std::string& m) { log::warn(m); });
    } catch (const Error& e) {
      // A damaged history is a problem to report; the checkpoints are still
      // verified from their own manifests below.
      if (e.code() != ErrorCode::kCorruption) throw;
      view.problems.push_back({storage->uri(), std::string(kHistoryKey), e.what()});
    }
    for (const auto& [index, entry] : checkpoint_dirs(listing, incomplete)) {
      const auto& [dir, committed] = entry;
      if (committed) {
        verify_checkpoint(Checkpoint(storage->child(dir)), view);
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

}  // namespace cairn::cli
