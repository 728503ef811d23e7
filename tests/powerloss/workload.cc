// A power-loss workload (workloads.h): powerloss_workload NAME PHASE EXPERIMENT
// with PHASE "setup" (saves before recording) or "act" (the recorded saves).
// Around each recorded save it leaves markers in the trace: removing the
// absent "<root>/.powerloss-mark-<text>" is recorded as "mark <text>"
// (recorder.cc): "committed N" once checkpoint N's save returned.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>

#include <fmt/format.h>

#include "cairn/state_manager.h"
#include "checkpoint/crash_pattern.h"
#include "powerloss/workloads.h"

namespace {

using namespace cairn;
using namespace cairn::powerloss;

void mark(const std::filesystem::path& root, const std::string& text) {
  // ignore-error: the name never exists; the recorder logs the attempt.
  (void)::unlink((root / (".powerloss-mark-" + text)).c_str());
}

void save_checkpoint(CheckpointManager& manager, int n, const std::filesystem::path& root,
                     int metadata_updates) {
  const uint64_t seed = seed_of(n);
  auto source = Checkpoint::from_directory(fmt::format("memory://powerloss-source/{}", seed));
  const auto sizes = file_sizes(n);
  for (size_t f = 0; f < sizes.size(); ++f) {
    source.storage().put(fmt::format("f{}.bin", f),
                         cairn::testing::crash_pattern(seed, static_cast<int>(f), sizes[f]));
  }
  auto record = manager.register_checkpoint({{"seed", seed}}, source);
  mark(root, fmt::format("committed {}", record.index));
  for (int v = 1; v <= metadata_updates; ++v) {
    record.checkpoint.update_metadata({{"v", v}, {"pad", std::string(kMetadataPad, 'a' + v)}});
    mark(root, fmt::format("metadata {} {}", record.index, v));
  }
}

void save_state(StateCheckpointManager& manager, int n, const std::filesystem::path& root) {
  const uint64_t seed = seed_of(n);
  const std::string bytes = cairn::testing::crash_pattern(seed, 0, kStateBytes);
  StateDict state;
  state.add("w", DType::kU8, Shape{kStateBytes},
            std::as_bytes(std::span(bytes.data(), bytes.size())));
  auto record = manager.save(state, static_cast<uint64_t>(n), {{"seed", seed}}, /*force=*/true);
  mark(root, fmt::format("committed {}", record->index));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: powerloss_workload NAME setup|act EXPERIMENT\n";
    return 2;
  }
  const Workload* w = find_workload(argv[1]);
  const bool act = std::string_view(argv[2]) == "act";
  if (!w || (!act && std::string_view(argv[2]) != "setup")) {
    std::cerr << "powerloss_workload: unknown workload or phase\n";
    return 2;
  }
  const std::filesystem::path exp = argv[3];
  const std::filesystem::path root = exp.parent_path();
  const int first = act ? w->setup_saves : 0;
  const int count = act ? w->act_saves : w->setup_saves;
  try {
    ManagerOptions options;
    options.warn = [](const std::string&) {};
    options.background_delete = w->background_delete;
    if (w->state_dict) {
      StateCheckpointOptions o;
      o.max_to_keep = w->num_to_keep;
      o.manager = options;
      o.write.io = IoPath::kDirect;
      o.write.block_size = 64 << 10;
      o.write.threads = 2;
      IoReport report;
      o.write.report = &report;
      StateCheckpointManager manager(exp.string(), o);
      for (int n = first; n < first + count; ++n) {
        save_state(manager, n, root);
        if (report.path != IoPath::kDirect) {
          std::cerr << "powerloss_workload: the save was not direct: " << report.reason << "\n";
          return 3;
        }
      }
    } else {
      CheckpointManager manager(exp.string(), config_of(*w), options);
      for (int n = first; n < first + count; ++n) {
        save_checkpoint(manager, n, root, act ? w->metadata_updates : 0);
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "powerloss_workload: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
