// One listing of an experiment folder, grouped by checkpoint: which
// checkpoints are committed (their manifest is listed), which are damaged
// (committed, but their manifest cannot be read), which are leftovers, and
// which writes were left incomplete. Used by the
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
#include "manager/history_store.h"

namespace cairn {

// What an experiment's storage holds, grouped by checkpoint.
struct Scan {
  std::map<uint64_t, std::string> committed;    // index -> name
  std::map<uint64_t, std::string> uncommitted;  // index -> name
  // Committed checkpoints whose manifest cannot be read (damage after the
  // commit: see damaged_not_leftover): kept on storage, never removed.
  struct Damaged {
    std::string name;
    std::string why;  // the manifest's URI and why it cannot be read
  };
  std::map<uint64_t, Damaged> damaged;  // index -> what
  std::vector<std::string> incomplete;  // incomplete-write ids
  std::optional<uint64_t> max_index;
};

// Whether a checkpoint whose manifest is listed but cannot be read is
// damaged (committed; kept and reported) rather than the leftover of an
// interrupted commit (removed): damaged when the history lists it, or when
// the store never tears a write (StorageCapabilities::torn_writes), so that
// no interrupted commit can have left that manifest.
inline bool damaged_not_leftover(bool history_lists_it, bool store_tears_writes) {
  return history_lists_it || !store_tears_writes;
}

// `listing` and `incomplete` are list_with_incomplete("") of the experiment:
// one listing tells which checkpoints are committed, with no request per
// checkpoint.
Scan scan_experiment(const std::vector<ObjectInfo>& listing, std::vector<std::string> incomplete);

// Reads the manifests of the committed checkpoints that `known` (the
// history) does not list, and moves those that are torn (Manifest::torn)
// out of the committed ones: to the damaged ones where the store never tears
// a write (damaged_not_leftover), else to the uncommitted ones (the remains
// of an interrupted commit), telling `note` why. The history lists only
// checkpoints committed before it was written, so the manifests it names
// are not read (their damage is found where they are read). Returns the
// whole manifests read, by index.
std::map<uint64_t, std::string> split_torn(Storage& storage, Scan& scan,
                                           const std::map<uint64_t, history::State::Entry>& known,
                                           const std::function<void(const std::string&)>& note);

// An experiment as the manager's open and `cairn ls` see it.
struct HistoryScan {
  history::Loaded history;
  Scan scan;
  // The whole manifests read, by index: those of the committed checkpoints
  // the history does not vouch for.
  std::map<uint64_t, std::string> manifests;
  // The history was authoritative: only the folders it does not vouch for
  // were listed (so `scan.incomplete` holds only what lies in them).
  bool trusted = false;
};

// Reads the history and finds which checkpoints are committed. With an
// authoritative history (history::Loaded::authoritative) that is one listing
// of the experiment folder (list_names) and the history: a checkpoint the
// history names, not flagged as being deleted, whose folder is listed is
// committed without its folder being read; every other checkpoint folder
// is listed alone and its manifest read (split_torn), as after a crash
// between a commit and its history record, or during a deletion. Otherwise
// (no snapshot, an older format, a damaged record) the whole experiment is
// listed and every manifest the history does not list is read, as
// scan_experiment() and split_torn() do. History entries whose folder is not
// on storage are in neither map of `scan`. `warn` gets the history's
// warnings, `note` split_torn's. Failure: as load_history() and split_torn().
HistoryScan scan_with_history(Storage& storage, const std::function<void(const std::string&)>& warn,
                              const std::function<void(const std::string&)>& note);

// The folders in the experiment's trash (manager_layout::kTrashPrefix): a
// retired checkpoint's files each, waiting for the manager's deleter. Keys
// relative to `storage` (".cairn.trash/checkpoint_000007"); one listing,
// none where the storage cannot rename (nothing is ever put there).
std::vector<std::string> trash_folders(Storage& storage);

}  // namespace cairn
