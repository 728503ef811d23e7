// The pure parts of trials on several hosts (tune/trial_hosts.h): where a
// trial goes, how many a host holds, and the JSON of what crosses to a host.
#include "tune/trial_hosts.h"

#include <climits>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace cairn::tune::tuner_internal {
namespace {

TEST(TrialPlacement, TheLeastLoadedPlaceWithRoomComesFirstTiesToTheLowest) {
  const std::vector<int> limit = {2, 2, 2};
  const std::vector<bool> none_gone = {false, false, false};
  EXPECT_EQ(placement_order(std::vector<int>{0, 0, 0}, limit, none_gone),
            (std::vector<std::size_t>{0, 1, 2}));
  EXPECT_EQ(placement_order(std::vector<int>{1, 0, 0}, limit, none_gone),
            (std::vector<std::size_t>{1, 2, 0}));
  EXPECT_EQ(placement_order(std::vector<int>{1, 1, 0}, limit, none_gone),
            (std::vector<std::size_t>{2, 0, 1}));
  // Full places and lost ones are not candidates.
  EXPECT_EQ(placement_order(std::vector<int>{2, 1, 0}, limit, {false, false, true}),
            (std::vector<std::size_t>{1}));
  EXPECT_TRUE(placement_order(std::vector<int>{2, 2, 2}, limit, none_gone).empty());
  // Without a per-place bound (max_concurrent_trials bounds the whole).
  const std::vector<int> open = {INT_MAX, INT_MAX};
  EXPECT_EQ(placement_order(std::vector<int>{5, 3}, open, {false, false}),
            (std::vector<std::size_t>{1, 0}));
}

TEST(TrialPlacement, AHostHoldsItsCoresOverWhatATrialAsksAndAtLeastOne) {
  EXPECT_EQ(default_slots(8, 2, 1), 4);
  EXPECT_EQ(default_slots(8, 0.5, 1), 16);
  EXPECT_EQ(default_slots(8, 0, 4), 2);  // cpu 0: a core per worker
  EXPECT_EQ(default_slots(2, 3, 1), 1);
  EXPECT_EQ(default_slots(0, 1, 1), 1);
}

TEST(TrialPlacement, ProcessesOnOneHostShareItsCoresAndGpusOut) {
  const PlaceOffer four{8, {"0", "1", "2", "3"}};
  const std::vector<PlaceOffer> got = share_hosts({"a", "b", "a", "a"}, {four, four, four, four});
  EXPECT_EQ(got[0].cores, 2);  // 8 cores, 3 processes on host a
  EXPECT_EQ(got[0].gpu_ids, (std::vector<std::string>{"0", "3"}));
  EXPECT_EQ(got[2].gpu_ids, (std::vector<std::string>{"1"}));
  EXPECT_EQ(got[3].gpu_ids, (std::vector<std::string>{"2"}));
  EXPECT_EQ(got[1].cores, 8);  // alone on host b: all of it
  EXPECT_EQ(got[1].gpu_ids, four.gpu_ids);
  const std::vector<PlaceOffer> tight =
      share_hosts({"a", "a", "a"}, {{2, {"0"}}, {2, {"0"}}, {2, {"0"}}});
  EXPECT_EQ(tight[0].cores, 1);
  EXPECT_EQ(tight[0].gpu_ids, (std::vector<std::string>{"0"}));
  EXPECT_TRUE(tight[1].gpu_ids.empty());
  EXPECT_TRUE(tight[2].gpu_ids.empty());
}

TEST(TrialHostMessages, ARunnersSpecCrossesWithItsSettingsAndKeepsTheLocalCode) {
  tune_internal::RunnerSpec rs;
  rs.config = {{"lr", 0.1}};
  rs.num_workers = 3;
  rs.run.name = "trial_00002";
  rs.run.storage_path = "s3://bucket/exp";
  rs.run.failure_config.max_failures = 2;
  rs.run.failure_config.report_timeout_s = 60;
  rs.run.checkpoint_config.num_to_keep = 2;
  rs.run.checkpoint_config.checkpoint_score_attribute = "loss";
  rs.trial_uri = "s3://bucket/exp/trial_00002";
  rs.trial_path = "s3://bucket/exp/trial_00002";
  const nlohmann::json j = runner_to_json(rs, {"1", "3"});

  tune_internal::RunnerSpec local;
  bool called = false;
  local.train_fn = [&called](const nlohmann::json&) { called = true; };
  local.run.resume_existing = true;
  local.run.checkpoint_config.checkpoint_frequency = 5;
  std::vector<std::string> gpus;
  const tune_internal::RunnerSpec got =
      runner_from_json(nlohmann::json::parse(j.dump()), local, gpus);
  EXPECT_EQ(got.config, rs.config);
  EXPECT_EQ(got.num_workers, 3);
  EXPECT_EQ(got.run.name, "trial_00002");
  EXPECT_EQ(got.run.storage_path, "s3://bucket/exp");
  EXPECT_EQ(got.run.failure_config.max_failures, 2);
  EXPECT_EQ(got.run.failure_config.report_timeout_s, 60);
  EXPECT_EQ(got.run.checkpoint_config.num_to_keep, 2);
  EXPECT_EQ(got.run.checkpoint_config.checkpoint_score_attribute, "loss");
  EXPECT_EQ(got.run.checkpoint_config.checkpoint_frequency, 0);  // the Tuner decides
  EXPECT_EQ(got.trial_uri, rs.trial_uri);
  EXPECT_EQ(gpus, (std::vector<std::string>{"1", "3"}));
  got.train_fn({});
  EXPECT_TRUE(called);                   // the host's own code
  EXPECT_TRUE(got.run.resume_existing);  // not a setting that crosses
  EXPECT_THROW(runner_from_json({{"config", 1}}, local, gpus), nlohmann::json::exception);
}

TEST(TrialHostMessages, AResultGridCrossesWhole) {
  TrialResult a;
  a.trial_id = "trial_00000";
  a.config = {{"x", 1}};
  a.status = TrialStatus::kTerminated;
  a.metrics = {{"loss", 0.5}};
  a.path = "/r/exp/trial_00000";
  TrialResult b;
  b.trial_id = "trial_00001";
  b.status = TrialStatus::kError;
  b.error = "boom";
  ResultGrid grid({a, b}, "loss", "min", "/r/exp");
  ExperimentStats stats;
  stats.trial_starts = 3;
  stats.wall_seconds = 1.5;
  grid.set_stats(stats);
  const ResultGrid got = grid_from_json(nlohmann::json::parse(grid_to_json(grid).dump()));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].trial_id, "trial_00000");
  EXPECT_EQ(got[0].config, a.config);
  EXPECT_EQ(got[0].metrics, a.metrics);
  EXPECT_EQ(got[0].path, a.path);
  EXPECT_EQ(got[1].status, TrialStatus::kError);
  EXPECT_EQ(got[1].error, "boom");
  EXPECT_EQ(got.metric(), "loss");
  EXPECT_EQ(got.mode(), "min");
  EXPECT_EQ(got.experiment_path(), "/r/exp");
  EXPECT_EQ(got.stats().trial_starts, 3u);
  EXPECT_EQ(got.get_best_result().trial_id, "trial_00000");
}

}  // namespace
}  // namespace cairn::tune::tuner_internal
