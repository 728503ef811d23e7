// Settings read from an injected environment: defaults when unset or empty,
// values as given otherwise.
#include <gtest/gtest.h>

#include "util/settings.h"

namespace cairn::testing {
namespace {

TEST(Settings, UnsetAndEmptyVariablesGiveTheDefaults) {
  Settings s = Settings::from(Environment::of({{"TMPDIR", ""}, {"CAIRN_DIRECT_IO", ""}}));
  EXPECT_EQ(s.storage_path, "~/cairn_results");
  EXPECT_EQ(s.temp_dir, "/tmp");
  EXPECT_EQ(s.direct_io, "");
  EXPECT_EQ(s.home, "");
  EXPECT_FALSE(s.launched_by_mpi);
}

TEST(Settings, SetVariablesAreTakenAsGiven) {
  Settings s = Settings::from(Environment::of({{"CAIRN_STORAGE_PATH", "s3://b/p"},
                                               {"TMPDIR", "/scratch"},
                                               {"CAIRN_DIRECT_IO", "off"},
                                               {"CAIRN_TUNE_STATE_PERIOD_S", "0.5"},
                                               {"CAIRN_CACHE_DIR", "/cache"},
                                               {"HOME", "/home/u"},
                                               {"PMI_SIZE", ""}}));
  EXPECT_EQ(s.storage_path, "s3://b/p");
  EXPECT_EQ(s.temp_dir, "/scratch");
  EXPECT_EQ(s.direct_io, "off");
  EXPECT_EQ(s.tune_state_period_s, "0.5");
  EXPECT_EQ(s.cache_dir, "/cache");
  EXPECT_EQ(s.home, "/home/u");
  EXPECT_TRUE(s.launched_by_mpi);  // set, even empty, as MPI launchers do
}

TEST(Settings, EnvironmentGetTellsUnsetFromEmpty) {
  Environment env = Environment::of({{"A", ""}});
  EXPECT_EQ(env.get("A"), std::optional<std::string>(""));
  EXPECT_EQ(env.get("B"), std::nullopt);
  EXPECT_EQ(env.get_or("A", "x"), "x");
}

}  // namespace
}  // namespace cairn::testing
