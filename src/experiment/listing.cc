// Reading, finding and collecting the garbage of experiments under a root
// (cairn/manager.h: read_experiment, find_experiments, collect_garbage):
// the experiment-level operations behind `cairn ls` and `cairn gc`, built on
// the manager's scan of one experiment (manager/scan.h) and its history.
#include <algorithm>

#include <fmt/format.h>

#include "cairn/commit.h"
#include "cairn/error.h"
#include "cairn/manager.h"
#include "checkpoint/local_view.h"
#include "checkpoint/manifest_text.h"
#include "experiment/layout.h"
#include "manager/history.h"
#include "manager/history_store.h"
#include "manager/scan.h"
#include "util/log.h"

namespace cairn {

ExperimentListing read_experiment(std::string_view experiment_uri) {
  ExperimentListing out;
  auto storage = open_storage(experiment_uri);
  out.uri = storage->uri();
  HistoryScan found = scan_with_history(
      *storage, [](const std::string& m) { log::warn(m); },
      [](const std::string& m) { log::info(m); });
  const history::State& stored = found.history.state;
  out.config = stored.config;
  for (const auto& [index, name] : found.scan.uncommitted) out.uncommitted.push_back(name);
  for (const auto& [index, damaged] : found.scan.damaged) {
    log::warn(fmt::format("{}: {} is damaged: {}", out.uri, damaged.name, damaged.why));
    out.damaged.emplace(damaged.name, damaged.why);
  }
  for (const auto& [index, entry] : stored.records) {
    if (!entry.deleting && found.scan.committed.count(index) == 0 &&
        found.scan.uncommitted.count(index) == 0 && found.scan.damaged.count(index) == 0) {
      // Told, not hidden: the history names it, but its folder is gone (a
      // deletion before a crash, or by hand). The manager's next open drops
      // the record.
      log::warn(fmt::format("{}: {} is in the history but no longer on storage; not listed",
                            out.uri, checkpoint_name(index)));
    }
  }
  for (const auto& [index, name] : found.scan.committed) {
    CheckpointRecord r(index, Checkpoint(storage->child(name)));
    auto it = stored.records.find(index);
    if (it != stored.records.end()) {
      r.metrics = it->second.metrics;
      r.created_at = it->second.created_at;
      r.pinned = it->second.pinned;
      r.size_bytes = it->second.size_bytes;
      r.file_count = it->second.file_count;
    } else {
      try {
        Manifest m =
            Manifest::parse(found.manifests.at(index), r.checkpoint.storage().uri_of(kManifestKey));
        r.metrics = m.metrics;
        r.created_at = m.created_at;
        r.size_bytes = m.total_bytes();
        r.file_count = m.files.size();
      } catch (const Error&) {
        // ignore-error: listed without metrics; `cairn verify` reports the damage.
      }
    }
    out.checkpoints.push_back(std::move(r));
  }
  return out;
}

std::vector<std::string> find_experiments(std::string_view uri) {
  auto storage = open_storage(uri);
  // What only an experiment holds: its history, its log folder, checkpoint
  // folders. list_names() ends folder names with '/'.
  auto is_marker = [](std::string_view name) {
    const bool folder = !name.empty() && name.back() == '/';
    if (folder) name.remove_suffix(1);
    return folder ? name == experiment::kManagerLogPrefix || parse_checkpoint_name(name).has_value()
                  : name == experiment::kManagerHistoryKey;
  };
  std::vector<std::string> found;
  const std::vector<std::string> top = storage->list_names("");
  if (std::any_of(top.begin(), top.end(), is_marker)) found.emplace_back();
  // Experiments one level down; a marker folder is part of the root's.
  for (const auto& name : top) {
    if (name.back() != '/' || is_marker(name)) continue;
    const std::string folder = name.substr(0, name.size() - 1);
    if (folder == experiment::kTrashPrefix) continue;  // the root experiment's
    const std::vector<std::string> inner = storage->list_names(folder);
    if (std::any_of(inner.begin(), inner.end(), is_marker)) found.push_back(folder);
  }
  return found;
}

GcReport collect_garbage(std::string_view uri, bool dry_run) {
  GcReport report;
  auto root = open_storage(uri);
  for (const auto& name : find_experiments(uri)) {
    auto storage = name.empty() ? root : root->child(name);
    // A dry run changes nothing, not even by creating a lock file.
    std::unique_ptr<Lock> lock;
    bool locked = false;
    if (dry_run) {
      locked = storage->is_locked(experiment::kLockKey);
    } else {
      try {
        lock = storage->try_lock(experiment::kLockKey);
      } catch (const Error& e) {
        if (e.code() != ErrorCode::kLocked) throw;
        locked = true;
      }
    }
    if (locked) {
      report.skipped.push_back(
          fmt::format("{}: skipped, a live writer holds its lock", storage->uri()));
      continue;
    }
    std::vector<std::string> incomplete;
    std::vector<ObjectInfo> listing = storage->list_with_incomplete("", incomplete);
    // The checkpoints the history lists were committed: never leftovers,
    // whatever their manifests hold now. A damaged history vouches for none.
    std::map<uint64_t, history::State::Entry> known;
    try {
      known = history::load_history(*storage, listing, [](const std::string& m) {
                log::warn(m);
              }).state.records;
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kCorruption) throw;
      log::warn(fmt::format("{}: reading every manifest: {}", storage->uri(), e.what()));
    }
    Scan scan = scan_experiment(listing, std::move(incomplete));
    // The other checkpoints' manifests are read: a torn one is a leftover
    // where the store can tear a write, damage (kept) everywhere else.
    split_torn(*storage, scan, known, [](const std::string& m) { log::info(m); });
    for (const auto& [index, damaged] : scan.damaged) {
      const std::string kept = fmt::format("{}: kept, damaged after its commit: {}",
                                           storage->uri_of(damaged.name), damaged.why);
      log::warn(kept);
      report.skipped.push_back(kept);
    }
    for (const auto& id : scan.incomplete) {
      if (!dry_run) {
        log::info(fmt::format("removing incomplete write {}", storage->uri_of(id)));
        storage->discard_incomplete(id);
      }
      report.removed.push_back(storage->uri_of(id));
    }
    std::vector<std::string> leftovers;
    for (const auto& [index, cp] : scan.uncommitted) leftovers.push_back(cp);
    // What a manager's deleter had not freed when its writer stopped.
    for (auto& folder : trash_folders(*storage)) leftovers.push_back(std::move(folder));
    for (const auto& cp : leftovers) {
      Checkpoint leftover(storage->child(cp));
      if (dry_run) {
        for (const auto& o : leftover.storage().list(""))
          report.removed.push_back(leftover.storage().uri_of(o.key));
      } else {
        auto removed = remove_uncommitted(leftover);
        report.removed.insert(report.removed.end(), removed.begin(), removed.end());
      }
    }
  }
  // Node-local views of remote checkpoints that no live process uses (their
  // users were killed): garbage wherever they came from.
  for (auto& view : sweep_unused_views(dry_run)) report.removed.push_back(std::move(view));
  return report;
}

}  // namespace cairn
