// What the Trainer's memory tier across hosts (train/peer_tier.h) needs of a
// CheckpointManager beyond its public API: the tier's files live on several
// hosts, so the tier's commits record the ranks' entries unchecked, and
// persistence is carried out by the hosts together instead of by the
// manager's background copy. docs/memory-tier.md, "Across hosts".
//
// Thread-safety: as the manager's own calls; `due` runs under the manager's
// lock and must only take note.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cairn/manager.h"

namespace cairn::manager_internal {

struct TierAccess {
  // Turns `m`'s memory tier (kFailedPrecondition without one) into one
  // across hosts: commits record the entries unchecked, each checkpoint due
  // for persistence goes to `due` instead of the background copy, and the
  // memory bound counts `free_space()` (the least free memory of any host;
  // called under the manager's lock, it may throw to refuse the save).
  static void spread(CheckpointManager& m, std::function<void(uint64_t index)> due,
                     std::function<uint64_t()> free_space);
  // The tier's folder (<root>/cairn-tier-<uid>/<id>), if `m` has a tier.
  static std::optional<std::filesystem::path> folder(const CheckpointManager& m);
  // The tier's checkpoint of `index`, if it holds one.
  static std::optional<Checkpoint> in_memory(const CheckpointManager& m, uint64_t index);
  // The names of the checkpoints the tier keeps, in index order.
  static std::vector<std::string> kept(const CheckpointManager& m);
  // Marks `index` as being persisted by the caller, so that the tier's
  // retention keeps it (nullopt: none is).
  static void persisting(CheckpointManager& m, std::optional<uint64_t> index);
  // Where checkpoint `index` is persisted.
  static Checkpoint persistent_location(const CheckpointManager& m, uint64_t index);
  // Commits, at persistent_location(index), the persistent copy of tier
  // checkpoint `source` whose files `files` the hosts wrote there: each is
  // checked to exist with its size, the commit keeps the source's metrics,
  // time, layout, ranks and metadata, and the usual retention follows. On
  // failure the location is discarded and the error thrown.
  static void commit_persisted(CheckpointManager& m, uint64_t index, const Checkpoint& source,
                               const std::vector<ManifestEntry>& files);
  // The tier's newest checkpoint when persistent storage holds neither it
  // nor a newer one: what the end of a run must persist.
  static std::optional<CheckpointRecord> unpersisted_newest(const CheckpointManager& m);
};

}  // namespace cairn::manager_internal
