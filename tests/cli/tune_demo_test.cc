// The PBT example (examples/tune/pbt_torch.cc, scripts/demo-tune.sh) end to
// end: the driver kills itself with SIGKILL, Tuner::restore finishes every
// trial, every trial ends with the config PBT gave it, and every checkpoint
// verifies. A few seconds: 8 small trials.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/subprocess.h"
#include "support/temp_dir.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;
using testing::ProcessResult;
using testing::TempDir;

ProcessResult example(const TempDir& storage, std::vector<std::string> extra) {
  std::vector<std::string> args{"--storage", storage.str(), "--name", "pbt"};
  args.insert(args.end(), extra.begin(), extra.end());
  return testing::run_process(CAIRN_TUNE_EXAMPLE_PATH, args);
}

TEST(TuneDemo, ADriverKilledMidSearchIsRestoredAndEveryTrialFinishes) {
  TempDir storage;
  ProcessResult crashed = example(storage, {"--crash-after-results", "20"});
  ASSERT_EQ(crashed.exit_code, 128 + 9) << crashed.out << crashed.err;  // SIGKILL
  EXPECT_NE(crashed.out.find("killing the driver with SIGKILL"), std::string::npos) << crashed.out;
  ASSERT_TRUE(fs::exists(storage / "pbt/tuner_state.json"));

  ProcessResult restored = example(storage, {"--restore"});
  ASSERT_EQ(restored.exit_code, 0) << restored.out << restored.err;
  EXPECT_NE(restored.out.find("best trial: trial_"), std::string::npos) << restored.out;

  const nlohmann::json state =
      nlohmann::json::parse(testing::read_text(storage / "pbt/tuner_state.json"));
  ASSERT_EQ(state.at("trials").size(), 8u);
  int clones = 0;
  for (const auto& t : state.at("trials")) {
    const std::string id = t.at("trial_id").get<std::string>();
    EXPECT_EQ(t.at("status"), "TERMINATED") << id;
    const fs::path trial = storage / "pbt" / id;
    // The trial ran with the config it ends with: the last result's lr is
    // the one PBT gave it (the trainable sets it after loading a checkpoint).
    const nlohmann::json params = nlohmann::json::parse(testing::read_text(trial / "params.json"));
    const std::vector<nlohmann::json> rows = testing::read_json_lines(trial / "result.json");
    // TuneConfig::stop: the first result at 12 iterations or more ends the
    // trial, also when the driver died after the trial wrote it and before
    // it ended (restore judges that result). A clone goes on from its
    // source's iteration (as in Ray), so the number of rows may differ from
    // 12, and a clone of a source's 12th checkpoint ends at 13.
    ASSERT_FALSE(rows.empty()) << id;
    EXPECT_GE(rows.back().at("training_iteration").get<int>(), 12) << id;
    for (size_t i = 0; i + 1 < rows.size(); ++i) {
      EXPECT_LT(rows[i].at("training_iteration").get<int>(), 12) << id << " row " << i;
    }
    EXPECT_EQ(rows.back().at("lr"), params.at("lr")) << id;
    EXPECT_EQ(params, t.at("config")) << id;
    // The lr changes between two results only where PBT exploited.
    for (size_t i = 1; i < rows.size(); ++i) {
      if (rows[i].at("lr") != rows[i - 1].at("lr")) ++clones;
    }
  }
  EXPECT_GT(clones, 0) << "PBT never exploited: " << restored.out;
  // Staged copies are removed once imported (empty folders may remain).
  if (fs::exists(storage / "pbt/.cairn_clones")) {
    for (const auto& e : fs::recursive_directory_iterator(storage / "pbt/.cairn_clones")) {
      EXPECT_FALSE(e.is_regular_file()) << "a staged clone was left behind: " << e.path();
    }
  }

  ProcessResult verify =
      testing::run_process(CAIRN_CLI_PATH, {"verify", (storage / "pbt").string()});
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
}

TEST(TuneDemo, ANewSearchOverAnExistingOneIsRefusedWithAHint) {
  TempDir storage;
  ASSERT_EQ(example(storage, {"--crash-after-results", "1"}).exit_code, 128 + 9);
  ProcessResult again = example(storage, {});
  EXPECT_EQ(again.exit_code, 1) << again.out << again.err;
  EXPECT_NE(again.err.find("--restore"), std::string::npos) << again.err;
}

}  // namespace
}  // namespace cairn
