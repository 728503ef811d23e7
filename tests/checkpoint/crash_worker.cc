// Saves and retains checkpoints forever, until killed. Used by crash_test.
// Usage: crash_worker EXPERIMENT_DIR SEED NUM_TO_KEEP [TIER_ROOT]
// (NUM_TO_KEEP 0: keep all; TIER_ROOT: save through a memory tier there,
// keeping 2 in memory and persisting every 2nd in the background)
// Writes 'r' to stdout once the experiment is open, so the test can aim its
// kills at saves rather than at start-up.
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <random>

#include <fmt/format.h>

#include "cairn/manager.h"
#include "crash_pattern.h"

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::cerr << "usage: crash_worker EXPERIMENT_DIR SEED NUM_TO_KEEP [TIER_ROOT]\n";
    return 2;
  }
  std::mt19937_64 rng(std::strtoull(argv[2], nullptr, 10));
  cairn::CheckpointConfig config;
  if (int keep = std::atoi(argv[3]); keep > 0) config.num_to_keep = keep;  // 0: keep all
  config.checkpoint_score_attribute = "score";
  if (argc == 5) {
    config.memory_tier.enabled = true;
    config.memory_tier.root = argv[4];
    config.memory_tier.num_to_keep = 2;
    config.memory_tier.persist_every_n = 2;
  }
  cairn::ManagerOptions options;
  options.warn = [](const std::string&) {};  // missing scores are part of the workload
  try {
    cairn::CheckpointManager manager(argv[1], config, options);
    (void)!::write(STDOUT_FILENO, "r", 1);
    auto source = cairn::Checkpoint::from_directory(fmt::format("memory://crash-source/{}", rng()));
    for (;;) {
      uint64_t seed = rng();
      int files = 1 + static_cast<int>(rng() % 3);
      source.storage().remove_prefix("");
      for (int f = 0; f < files; ++f) {
        uint64_t size = rng() % 3 == 0 ? rng() % (256 << 10) : rng() % 4096;
        source.storage().put(fmt::format("f{}.bin", f),
                             cairn::testing::crash_pattern(seed, f, size));
      }
      nlohmann::json metrics = {{"seed", seed}};
      if (rng() % 8 != 0) metrics["score"] = static_cast<double>(rng() % 1000) / 10.0;
      auto record = manager.register_checkpoint(metrics, source);
      (void)!::write(STDOUT_FILENO, "c", 1);  // committed: the test may aim past it
      if (rng() % 2 == 0) {
        // Metadata replaced after the commit, twice: a kill in either leaves
        // the metadata before it or after it (crash_test checks).
        record.checkpoint.update_metadata({{"touched", seed}, {"pad", std::string(8192, 'p')}});
        record.checkpoint.update_metadata({{"again", seed}});
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "crash_worker: " << e.what() << "\n";
    return 1;
  }
}
