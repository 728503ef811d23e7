// Finding an experiment's memory tier (MemoryTierConfig, docs/memory-tier.md)
// from outside its manager, for read-only views such as `cairn ls`.
//
// Thread-safety: safe from any thread. Failure: never throws for a tier that
// is absent or unreadable (nullopt); the caller reads the tier's checkpoints
// as it reads any experiment's.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "cairn/manager.h"

namespace cairn {

// The URI of the checkpoints folder (an experiment of its own) of the memory
// tier this host holds for the experiment at `experiment_uri` (as its
// manager names it: file:///..., s3://...), or nullopt when there is none
// under `root` ("": $CAIRN_MEMORY_TIER_DIR, else /dev/shm) or the tier
// there names another experiment in its owner.json. A tier left by an
// earlier experiment deleted and started again at the same URI is told
// apart only by its manager (owner.json's creation time), which removes it
// on open.
std::optional<std::string> find_memory_tier(std::string_view experiment_uri,
                                            std::string_view root = "");

// Adds to `listing` (read_experiment of the experiment at `experiment_uri`)
// the checkpoints that only this host's memory tier holds (after a crash,
// the newest ones), as records whose tier is "memory" and persisted false,
// keeping the listing in index order, and returns the indices the tier
// holds (persisted ones included). Nothing when the listing's config has no
// memory tier or this host holds none for it. kCorruption naming the tier
// when it cannot be read; `listing` is then unchanged.
// The folder of the memory tier of the experiment at `experiment_uri` under
// `root` ("": $CAIRN_MEMORY_TIER_DIR, else /dev/shm), whether or not it exists.
std::filesystem::path memory_tier_folder(std::string_view experiment_uri, std::string_view root);
// A tier folder's parts: its checkpoints (an experiment of its own) and the
// owner.json naming its experiment.
std::filesystem::path memory_tier_checkpoints(const std::filesystem::path& tier);
std::filesystem::path memory_tier_owner(const std::filesystem::path& tier);

std::set<uint64_t> merge_memory_tier(std::string_view experiment_uri, ExperimentListing& listing);

}  // namespace cairn
