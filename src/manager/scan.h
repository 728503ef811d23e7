// One listing of an experiment folder, grouped by checkpoint: which
// checkpoints are committed (their manifest is listed and not empty), which
// are leftovers, and which writes were left incomplete. Used by the
// CheckpointManager's open and by the experiment layer's listing and gc.
// Thread-safety: free functions over their arguments. Failure: storage
// errors pass through; split_torn reads manifests and never throws for a
// torn one (it reports it through `note`).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cairn/storage.h"
#include "manager/history.h"

namespace cairn {

// What an experiment's storage holds, grouped by checkpoint.
struct Scan {
  std::map<uint64_t, std::string> committed;    // index -> name
  std::map<uint64_t, std::string> uncommitted;  // index -> name
  std::vector<std::string> incomplete;          // incomplete-write ids
  std::optional<uint64_t> max_index;
};

// `listing` and `incomplete` are list_with_incomplete("") of the experiment:
// one listing tells which checkpoints are committed, with no request per
// checkpoint.
Scan scan_experiment(const std::vector<ObjectInfo>& listing, std::vector<std::string> incomplete);

// Reads the manifests of the committed checkpoints that `known` (the
// history) does not list, and moves those that are torn (Manifest::torn:
// the remains of an interrupted commit) to the uncommitted ones, telling
// `note` why. The history lists only checkpoints committed before it was
// written, so the manifests it names are whole and are not read. Returns
// the whole manifests read, by index.
std::map<uint64_t, std::string> split_torn(Storage& storage, Scan& scan,
                                           const std::map<uint64_t, history::State::Entry>& known,
                                           const std::function<void(const std::string&)>& note);

}  // namespace cairn
