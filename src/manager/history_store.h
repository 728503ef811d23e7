// Reading an experiment's stored history (manager/history.h): the snapshot
// with the log applied. Shared by the manager, `cairn ls`/`verify` (through
// read_experiment) and the experiment copy.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cairn/storage.h"
#include "manager/history.h"

namespace cairn::history {

// The persisted history (snapshot plus log) as read from storage, with what
// the manager needs to go on appending to it.
struct Loaded {
  State state;
  std::vector<uint64_t> log_seqs;  // every log object on storage
  uint64_t applied = 0;            // log objects applied after the snapshot
  uint64_t max_seq = 0;            // the highest seq on storage (0: none)
  bool legacy = false;             // the snapshot has no log_seq (older Cairn)
  bool damaged = false;            // a log object was skipped as damaged
  bool torn = false;               // the snapshot was torn (treated as absent)

  // Whether the history tells which checkpoints are committed without their
  // manifests being read (manager/history.h, version 2): a whole snapshot of
  // the current format, every record after it applied and of that format.
  // Otherwise readers read every checkpoint's folder.
  bool authoritative() const {
    return state.present && !torn && !legacy && !damaged && state.version >= kVersion;
  }
};

// What load_history() needs of a listing, without listing the checkpoints:
// the snapshot, if it exists, and the log folder's objects (one listing of
// that folder).
std::vector<ObjectInfo> history_objects(Storage& storage);

// Reads the snapshot and applies the log objects after it, in seq order.
// `listing` is a list("") of the experiment (one listing serves the caller's
// reconciliation too). A damaged log object (torn, checksum mismatch,
// malformed) is skipped and `warn` gets its URI, the offset and the reason:
// its change is recovered by reconciling with the manifests. A torn
// snapshot (history::torn_snapshot: an interrupted write) is treated as
// absent, and `warn` says so: the caller rebuilds the history from the
// manifests. A snapshot that is whole but malformed throws kCorruption
// naming it; storage errors propagate.
Loaded load_history(Storage& storage, const std::vector<ObjectInfo>& listing,
                    const std::function<void(const std::string&)>& warn);

// The history folded into one snapshot text (log_seq = the highest seq on
// storage), or nullopt when the experiment has no snapshot. For copies.
std::optional<std::string> read_folded(Storage& storage,
                                       const std::function<void(const std::string&)>& warn);

}  // namespace cairn::history
