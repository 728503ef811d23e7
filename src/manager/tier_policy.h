// The memory tier's decisions (MemoryTierConfig), apart from any I/O: when a
// checkpoint is also persisted, whether the tier can hold one more, and the
// folder an experiment's tier uses. Pure functions, safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace cairn::tier_policy {

// Whether the checkpoint just saved to the tier is persisted too: it is the
// `every_n`-th since the last persisted one (`saves_since_persisted` counts
// it), or `every_minutes` have passed since `last_persisted_at` (seconds).
// 0 turns a rule off; with both off only the close persists.
bool should_persist(int every_n, double every_minutes, uint64_t saves_since_persisted, double now,
                    double last_persisted_at);

// The space a tier may use: the bytes its checkpoints hold now, what its
// file system has free, and its cap (0: none).
struct Space {
  uint64_t held = 0;
  uint64_t free = 0;
  uint64_t max_bytes = 0;
};

// Why the tier cannot hold `keep` checkpoints of `estimate` bytes plus the
// one being written (a sentence naming the need and what there is), or
// nullopt when it can. An estimate of 0 (nothing known yet) always fits.
std::optional<std::string> shortfall(uint64_t estimate, int keep, const Space& space);

// The folder name of the tier of the experiment at `experiment_uri`: the
// experiment folder's last name (for people), then the XXH3-64 of the URI.
std::string tier_folder_name(std::string_view experiment_uri);

}  // namespace cairn::tier_policy
