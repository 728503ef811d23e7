// Deleting committed checkpoints by index: what retention does once it has
// chosen (apply_retention, manager.cc) and what a caller that names them
// does (a damaged copy dropped from the memory tier, memory_tier.cc). Each
// deletion is announced in the history first, then each manifest goes,
// durably, before any data (dispose), then one record removes them.
#include <vector>

#include "cairn/manager.h"
#include "manager/history.h"

namespace cairn {

void CheckpointManager::delete_announced(const std::vector<uint64_t>& doomed,
                                         std::vector<uint64_t>& removed) {
  for (uint64_t index : doomed) {
    auto it = std::find_if(records_.begin(), records_.end(),
                           [&](const auto& r) { return r.index == index; });
    if (it == records_.end()) continue;
    // Uncommitted first: the manifest goes, durably, before any data.
    it->checkpoint.storage().remove(kManifestKey);
    dispose(it->name);
    records_.erase(it);
    deleting_.erase(index);
    removed.push_back(index);
  }
}

void CheckpointManager::remove_committed_locked(const std::vector<uint64_t>& doomed) {
  if (doomed.empty()) return;
  announce_deletion(doomed);
  std::vector<uint64_t> removed;
  delete_announced(doomed, removed);
  if (!removed.empty()) append_change(history::remove_record(0, removed));
}

}  // namespace cairn
