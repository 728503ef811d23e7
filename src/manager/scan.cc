#include "manager/scan.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "cairn/checkpoint.h"
#include "cairn/manager.h"
#include "checkpoint/manifest_text.h"
#include "manager/layout.h"

namespace cairn {

// `listing` and `incomplete` are list_with_incomplete("") of the experiment:
// one listing tells which checkpoints are committed, with no request per
// checkpoint.
Scan scan_experiment(const std::vector<ObjectInfo>& listing, std::vector<std::string> incomplete) {
  Scan scan;
  std::map<uint64_t, std::string> all;
  std::set<uint64_t> with_manifest;
  for (const auto& o : listing) {
    size_t slash = o.key.find('/');
    if (slash == std::string::npos) continue;
    std::string top = o.key.substr(0, slash);
    auto index = parse_checkpoint_name(top);
    if (!index) continue;
    all[*index] = top;
    // Whether a listed manifest is whole is told by reading it (split_torn):
    // an empty one is torn, a leftover or damage by the store's kind.
    if (o.key.substr(slash + 1) == kManifestKey) with_manifest.insert(*index);
  }
  scan.incomplete = std::move(incomplete);
  for (const auto& id : scan.incomplete) {
    // A temp file inside a checkpoint folder, or (file systems) an empty
    // folder a crash left: either way that index was used.
    std::string top = id.substr(0, id.find('/'));
    if (auto index = parse_checkpoint_name(top)) all.emplace(*index, top);
  }
  for (const auto& [index, name] : all) {
    (with_manifest.count(index) ? scan.committed : scan.uncommitted)[index] = name;
    scan.max_index = std::max(scan.max_index.value_or(0), index);
  }
  return scan;
}

// Reads the manifests of the committed checkpoints that `known` (the
// history) does not list, and moves those that are torn (Manifest::torn:
// the remains of an interrupted commit) to the uncommitted ones, telling
// `note` why. The history lists only checkpoints committed before it was
// written, so the manifests it names are whole and are not read. Returns
// the whole manifests read, by index.
std::map<uint64_t, std::string> split_torn(Storage& storage, Scan& scan,
                                           const std::map<uint64_t, history::State::Entry>& known,
                                           const std::function<void(const std::string&)>& note) {
  std::map<uint64_t, std::string> read;
  for (auto it = scan.committed.begin(); it != scan.committed.end();) {
    const auto& [index, name] = *it;
    if (known.count(index)) {
      ++it;
      continue;
    }
    const std::string key = join_key(name, kManifestKey);
    std::string why;
    std::optional<std::string> text = read_whole_manifest(storage, key, &why);
    if (text) {
      read.emplace(index, std::move(*text));
      ++it;
      continue;
    }
    // (Read, so not one the history lists.)
    if (!why.empty() && damaged_not_leftover(false, storage.capabilities().torn_writes)) {
      scan.damaged.emplace(index, Scan::Damaged{name, fmt::format("{} is unreadable ({})",
                                                                  storage.uri_of(key), why)});
      it = scan.committed.erase(it);
      continue;
    }
    note(why.empty()
             ? fmt::format("{}: the manifest went away since the listing", storage.uri_of(key))
             : fmt::format("{}: torn manifest, the remains of an interrupted commit ({}); "
                           "{} is not a checkpoint",
                           storage.uri_of(key), why, name));
    scan.uncommitted.emplace(index, name);
    it = scan.committed.erase(it);
  }
  return read;
}

namespace {

// The full scan: a listing of the whole experiment (version 1's way).
void scan_everything(Storage& storage, const std::vector<ObjectInfo>& listing,
                     std::vector<std::string> incomplete, HistoryScan& out,
                     const std::function<void(const std::string&)>& note) {
  out.scan = scan_experiment(listing, std::move(incomplete));
  out.manifests = split_torn(storage, out.scan, out.history.state.records, note);
}

}  // namespace

HistoryScan scan_with_history(Storage& storage, const std::function<void(const std::string&)>& warn,
                              const std::function<void(const std::string&)>& note) {
  HistoryScan out;
  // The history first, then the folder: a checkpoint committed in between
  // is then listed but not named, so it is read rather than missed.
  out.history = history::load_history(storage, history::history_objects(storage), warn);
  if (!out.history.authoritative()) {
    std::vector<std::string> incomplete;
    const std::vector<ObjectInfo> listing = storage.list_with_incomplete("", incomplete);
    scan_everything(storage, listing, std::move(incomplete), out, note);
    return out;
  }
  out.trusted = true;
  const std::vector<std::string> names = storage.list_names("");
  const auto& records = out.history.state.records;
  // The folders the history does not vouch for, listed one by one.
  std::vector<ObjectInfo> listing;
  std::vector<std::string> incomplete;
  std::map<uint64_t, std::string> folders;
  for (const auto& name : names) {
    if (name.empty() || name.back() != '/') continue;
    const std::string folder = name.substr(0, name.size() - 1);
    auto index = parse_checkpoint_name(folder);
    if (!index) continue;
    folders.emplace(*index, folder);
    auto it = records.find(*index);
    if (it != records.end() && !it->second.deleting) continue;
    std::vector<std::string> inner_incomplete;
    const size_t listed_before = listing.size();
    for (auto& o : storage.list_with_incomplete(folder, inner_incomplete)) {
      listing.push_back(std::move(o));
    }
    // A folder with nothing in it (file systems: a crash between making it
    // and writing into it) is a leftover too.
    if (inner_incomplete.empty() && listing.size() == listed_before) {
      inner_incomplete.push_back(folder);
    }
    for (auto& id : inner_incomplete) incomplete.push_back(std::move(id));
  }
  out.scan = scan_experiment(listing, std::move(incomplete));
  out.manifests = split_torn(storage, out.scan, {}, note);
  for (const auto& [index, folder] : folders) {
    auto it = records.find(index);
    if (it != records.end() && !it->second.deleting) out.scan.committed.emplace(index, folder);
    out.scan.max_index = std::max(out.scan.max_index.value_or(0), index);
  }
  return out;
}

std::vector<std::string> trash_folders(Storage& storage) {
  std::vector<std::string> out;
  if (!storage.capabilities().renames) return out;
  for (const std::string& name : storage.list_names(manager_layout::kTrashPrefix)) {
    if (name.back() != '/') continue;  // the deleter's folders only
    out.push_back(fmt::format("{}/{}", manager_layout::kTrashPrefix,
                              std::string_view(name).substr(0, name.size() - 1)));
  }
  return out;
}

}  // namespace cairn
