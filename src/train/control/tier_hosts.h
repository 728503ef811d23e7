// The memory tier across the hosts of a launch, as the driver sees it
// (train/peer_tier.h implements it for MPI launches; docs/memory-tier.md,
// "Across hosts"). The driver calls it at the points below, on its own
// thread; without one (DriverSpec::tier_hosts null) the tier, if any, is this
// host's alone.
#pragma once

#include <string>
#include <vector>

#include "cairn/checkpoint.h"
#include "cairn/manager.h"

namespace cairn::train_internal {

class TierHosts {
 public:
  virtual ~TierHosts() = default;
  // The experiment's manager opened (its memory tier is this host's copy).
  virtual void opened(CheckpointManager& manager) = 0;
  // An attempt of `world` ranks restores from `from`, a checkpoint of the
  // memory tier: every host is made to hold all of it; returns, by rank,
  // "memory" or "peer" (its host's copy came from a peer). Throws when the
  // hosts cannot (the attempt fails as a driver failure).
  virtual std::vector<std::string> restoring(const CheckpointRecord& from, int world) = 0;
  // Every rank wrote `files` into its own host's copy of `reserved`: each
  // host's files go to its replica holder, checked. Throws (the round fails).
  virtual void replicate(const Checkpoint& reserved, const std::vector<ManifestEntry>& files) = 0;
  // `committed` was committed in this host's copy of the tier: the other
  // hosts commit theirs and drop what the tier no longer keeps.
  virtual void committed(const CheckpointRecord& committed) = 0;
  // The run ends: waits for the persistence under way, persists the newest
  // checkpoint if only memory holds it, and frees every other host's copy.
  // Throws when persisting fails (the tier is then kept everywhere).
  virtual void release() = 0;
};

}  // namespace cairn::train_internal
