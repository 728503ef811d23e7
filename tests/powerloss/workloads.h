// The power-loss harness's workloads: what powerloss_workload runs (with the
// recorder preloaded for the "act" phase) and what the checker reopens the
// experiment with. Each checkpoint's files are crash_pattern(seed, file, size)
// with the seed in its metrics, so a checker can tell exact bytes from
// almost-right ones.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "cairn/manager.h"

namespace cairn::powerloss {

struct Workload {
  std::string_view name;
  int setup_saves;  // before recording: durable history to lose
  int act_saves;    // recorded
  std::optional<int> num_to_keep;
  bool background_delete = false;
  bool state_dict = false;  // a direct-I/O safetensors save (StateCheckpointManager)
  std::string_view what;    // for the docs and failure messages
  // Metadata updates after each recorded save: update v sets {"v": v} (and a
  // pad of kMetadataPad bytes), leaving the mark "metadata N v" once it returned.
  int metadata_updates = 0;
};

inline constexpr size_t kMetadataPad = 6000;

// clang-format off
inline constexpr std::array<Workload, 6> kWorkloads = {{
    {"save", 1, 1, std::nullopt, false, false,
     "one Checkpoint committed through CheckpointManager::register_checkpoint"},
    {"retention", 2, 2, 2, false, false,
     "two saves with num_to_keep=2: each commit deletes the oldest (manifest first)"},
    {"history", 20, 4, 2, false, false,
     "saves with num_to_keep=2 (an add, a deleting and a remove record each) across the history "
     "log's compaction: snapshot rewritten, log objects removed"},
    {"direct", 1, 1, std::nullopt, false, true,
     "a StateDict saved with O_DIRECT and fallocate preallocation (StateCheckpointManager)"},
    {"background", 1, 2, 1, true, false,
     "num_to_keep=1 with ManagerOptions::background_delete: data deleted on the deleter thread"},
    {"metadata", 1, 1, std::nullopt, false, false,
     "a save, then its metadata replaced twice (update_metadata): the previous or the new, "
     "never neither", 2},
}};
// clang-format on

inline const Workload* find_workload(std::string_view name) {
  for (const auto& w : kWorkloads)
    if (w.name == name) return &w;
  return nullptr;
}

inline CheckpointConfig config_of(const Workload& w) {
  CheckpointConfig c;
  c.num_to_keep = w.num_to_keep;
  return c;
}

// The seed of save number `n` (0-based over setup and act).
inline uint64_t seed_of(int n) { return 0x5eed0000u + static_cast<uint64_t>(n); }

// The sizes of the files of save `n`: a small one, one spanning several
// sectors unaligned, and (every other save) an empty one.
inline std::vector<uint64_t> file_sizes(int n) {
  std::vector<uint64_t> s = {100 + static_cast<uint64_t>(n) % 7,
                             5000 + 37 * static_cast<uint64_t>(n)};
  if (n % 2 == 0) s.push_back(0);
  return s;
}

// The StateDict of the direct workload: one u8 tensor of this many bytes.
inline constexpr uint64_t kStateBytes = (uint64_t{3} << 16) + 4096 * 3 + 123;

}  // namespace cairn::powerloss
