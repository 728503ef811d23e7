// `cairn --version` (or -V, or `cairn version`): prints "cairn <version>"
// from the project version and exits 0, with no subcommand needed.
#include <regex>
#include <string>

#include <gtest/gtest.h>

#include "cairn/version.h"
#include "cli/subprocess.h"

namespace cairn {
namespace {

TEST(CliVersionTest, PrintsCairnAndTheProjectVersionAndExitsZero) {
  testing::ProcessResult r = testing::run_process(CAIRN_CLI_PATH, {"--version"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "cairn " CAIRN_PROJECT_VERSION "\n");
  EXPECT_EQ(r.err, "");
}

TEST(CliVersionTest, TheShortFlagAndTheVersionCommandPrintTheSameLine) {
  for (const char* spelling : {"-V", "version"}) {
    SCOPED_TRACE(spelling);
    testing::ProcessResult r = testing::run_process(CAIRN_CLI_PATH, {spelling});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "cairn " CAIRN_PROJECT_VERSION "\n");
    EXPECT_EQ(r.err, "");
  }
}

TEST(CliVersionTest, TheInstalledHeaderCarriesTheSameVersion) {
  EXPECT_EQ(std::string(CAIRN_VERSION_STRING), CAIRN_PROJECT_VERSION);
  EXPECT_TRUE(std::regex_match(CAIRN_VERSION_STRING, std::regex(R"(\d+\.\d+\.\d+)")));
  EXPECT_EQ(std::to_string(CAIRN_VERSION_MAJOR) + "." + std::to_string(CAIRN_VERSION_MINOR) + "." +
                std::to_string(CAIRN_VERSION_PATCH),
            CAIRN_VERSION_STRING);
}

TEST(CliVersionTest, HelpListsTheVersionFlag) {
  testing::ProcessResult r = testing::run_process(CAIRN_CLI_PATH, {"--help"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("--version"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace cairn
