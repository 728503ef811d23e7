// A program outside Cairn's tree that uses an installed (or add_subdirectory)
// Cairn the way a user would: it saves a tensor state as a checkpoint through
// CheckpointManager into a temporary directory, reads it back, verifies it,
// and catches a cairn::Error thrown inside the library. tests/package/run.sh
// builds it with find_package(Cairn), with pkg-config and through
// add_subdirectory, against static and shared libraries. Exit 0 and a last
// line "consumer: ok" mean every check passed. Built with
// -DCONSUMER_WITH_TRAIN it also links the training runtime (Cairn::train).
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <cairn/checkpoint.h>
#include <cairn/error.h>
#include <cairn/manager.h>
#include <cairn/state.h>
#ifdef CONSUMER_WITH_TRAIN
#include <cairn/train.h>
#endif
#include <cairn/version.h>

namespace fs = std::filesystem;

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  std::cout << (ok ? "  ok   " : "  FAIL ") << what << '\n';
  if (!ok) ++failures;
}

fs::path make_temp_dir() {
  std::string pattern = (fs::temp_directory_path() / "cairn-consumer-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  return pattern;
}

void run(const fs::path& root) {
  const std::vector<float> weights{0.5f, -1.25f, 3.0f, 42.0f, 1e-3f, -7.5f};

  // Save: a safetensors state (Cairn::format) as a checkpoint of an
  // experiment (Cairn::core), keeping the 2 best by loss.
  cairn::CheckpointConfig config;
  config.num_to_keep = 2;
  config.checkpoint_score_attribute = "loss";
  config.checkpoint_score_order = "min";
  {
    cairn::CheckpointManager manager((root / "experiment").string(), config);
    for (int step = 0; step < 3; ++step) {
      cairn::StateDict state;
      state.add<float>("weights", {2, 3}, weights);
      state.metadata = {{"step", step}};
      fs::path scratch = root / ("scratch" + std::to_string(step));
      fs::create_directories(scratch);
      cairn::save_file(state, scratch / cairn::kStateFileName);
      manager.register_checkpoint({{"step", step}, {"loss", 1.0 / (step + 1)}},
                                  cairn::Checkpoint::from_directory(scratch.string()));
      fs::remove_all(scratch);
    }
  }

  // Read back with a new manager, as a resumed program would.
  cairn::CheckpointManager manager((root / "experiment").string(), config);
  auto latest = manager.latest();
  check(latest.has_value() && latest->name == "checkpoint_000002", "latest() is checkpoint_000002");
  check(manager.history().size() == 2, "retention kept 2 checkpoints");
  if (!latest) return;
  check(latest->checkpoint.verify().empty(), "verify() finds the checkpoint whole");

  cairn::LocalDirectory view = latest->checkpoint.as_directory();
  std::vector<float> restored(weights.size(), 0.0f);
  cairn::StateDict target;
  target.add_mutable<float>("weights", {2, 3}, std::span<float>(restored));
  cairn::load_into(view.path() / cairn::kStateFileName, target);
  check(restored == weights, "the tensor reads back bit for bit");
  check(target.metadata.value("step", -1) == 2, "the state's metadata reads back");

  // Damage a file: verify() names it.
  {
    fs::path file = view.path() / cairn::kStateFileName;
    fs::resize_file(file, fs::file_size(file) - 1);
  }
  auto problems = latest->checkpoint.verify();
  check(problems.size() == 1 && problems[0].path == cairn::kStateFileName,
        "verify() names a truncated file");

  // An error thrown inside the library is caught as cairn::Error here: its
  // type information crosses the (shared) library boundary.
  try {
    cairn::MappedState::open(root / "no-such-file.safetensors");
    check(false, "opening a missing file throws");
  } catch (const cairn::Error& e) {
    check(e.code() == cairn::ErrorCode::kNotFound &&
              std::strstr(e.what(), "no-such-file.safetensors") != nullptr,
          std::string("cairn::Error caught across the boundary: ") + e.what());
  }

#ifdef CONSUMER_WITH_TRAIN
  check(!cairn::Trainer::can_restore((root / "no-trainer-here").string()),
        "Trainer::can_restore of a folder without a run is false");
#endif
}

}  // namespace

int main() {
  std::cout << "consumer: linked against Cairn " << CAIRN_VERSION_STRING << '\n';
  fs::path root = make_temp_dir();
  try {
    run(root);
  } catch (const std::exception& e) {
    std::cout << "  FAIL unexpected exception: " << e.what() << '\n';
    ++failures;
  }
  fs::remove_all(root);
  if (failures != 0) {
    std::cout << "consumer: " << failures << " check(s) failed\n";
    return 1;
  }
  std::cout << "consumer: ok\n";
  return 0;
}
