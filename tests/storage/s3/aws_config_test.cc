// AWS configuration resolution: environment over files over defaults, the
// shared files' INI dialect, and the errors for malformed files and missing
// profiles.
#include "storage/s3/aws_config.h"

#include <gtest/gtest.h>

#include "storage/s3/aws_env_fake.h"
#include "support/errors.h"
#include "support/temp_dir.h"

namespace cairn::s3 {
namespace {

using cairn::testing::error_message_of;
using cairn::testing::TempDir;
using cairn::testing::write_text;
using testing::FakeWorld;

bool contains(const std::string& s, std::string_view part) {
  return s.find(part) != std::string::npos;
}

// A HOME with ~/.aws/config and ~/.aws/credentials as given.
struct Home {
  TempDir dir;
  FakeWorld world;
  Home(const std::string& config, const std::string& credentials) {
    if (!config.empty()) write_text(dir / ".aws/config", config);
    if (!credentials.empty()) write_text(dir / ".aws/credentials", credentials);
    world.vars["HOME"] = dir.str();
  }
  std::string config_path() const { return (dir / ".aws/config").string(); }
  std::string credentials_path() const { return (dir / ".aws/credentials").string(); }
};

TEST(AwsConfig, DefaultsWithNoEnvironmentAndNoFiles) {
  Home home("", "");
  const S3Settings s = resolve_s3_settings(home.world.env());
  EXPECT_EQ(s.profile, "default");
  EXPECT_EQ(s.region, "us-east-1");
  EXPECT_EQ(s.endpoint, "https://s3.us-east-1.amazonaws.com");
  EXPECT_FALSE(s.custom_endpoint);
  EXPECT_EQ(s.addressing, S3Settings::Addressing::kAuto);
}

TEST(AwsConfig, EnvironmentWinsOverTheProfileAndAwsRegionOverDefaultRegion) {
  Home home("[default]\nregion = eu-west-1\nendpoint_url = http://profile:9000\n", "");
  FakeWorld& w = home.world;
  EXPECT_EQ(resolve_s3_settings(w.env()).region, "eu-west-1");
  EXPECT_EQ(resolve_s3_settings(w.env()).endpoint, "http://profile:9000");
  w.vars["AWS_DEFAULT_REGION"] = "ap-south-1";
  EXPECT_EQ(resolve_s3_settings(w.env()).region, "ap-south-1");
  w.vars["AWS_REGION"] = "us-west-2";
  EXPECT_EQ(resolve_s3_settings(w.env()).region, "us-west-2");
  w.vars["AWS_REGION"] = "";  // set but empty counts as unset
  EXPECT_EQ(resolve_s3_settings(w.env()).region, "ap-south-1");

  w.vars["AWS_ENDPOINT_URL"] = "http://global:1/";
  EXPECT_EQ(resolve_s3_settings(w.env()).endpoint, "http://global:1");
  w.vars["AWS_ENDPOINT_URL_S3"] = "https://s3-only.example//";
  const S3Settings s = resolve_s3_settings(w.env());
  EXPECT_EQ(s.endpoint, "https://s3-only.example");
  EXPECT_TRUE(s.custom_endpoint);
  w.vars["AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"] = "true";
  EXPECT_EQ(resolve_s3_settings(w.env()).endpoint, "https://s3.ap-south-1.amazonaws.com");
  EXPECT_FALSE(resolve_s3_settings(w.env()).custom_endpoint);
}

TEST(AwsConfig, NamedProfileFromConfigWithAnS3SubSection) {
  Home home(
      "# comment\n"
      "; another\n"
      "[default]\n"
      "region = us-east-2\n"
      "\n"
      "[profile  dev]\n"
      "Region = eu-central-1\n"
      "endpoint_url = http://ignored-for-s3:1\n"
      "s3 =\n"
      "  addressing_style = path\n"
      "  # a comment inside the block\n"
      "  endpoint_url = http://127.0.0.1:9000/\n"
      "output = json\n",
      "");
  home.world.vars["AWS_PROFILE"] = "dev";
  const S3Settings s = resolve_s3_settings(home.world.env());
  EXPECT_EQ(s.profile, "dev");
  EXPECT_EQ(s.region, "eu-central-1");
  EXPECT_EQ(s.endpoint, "http://127.0.0.1:9000");
  EXPECT_TRUE(s.custom_endpoint);
  EXPECT_EQ(s.addressing, S3Settings::Addressing::kPath);
}

TEST(AwsConfig, ServicesSectionNamedByTheProfileGivesTheS3Endpoint) {
  Home home(
      "[profile dev]\n"
      "services = local\n"
      "endpoint_url = http://other:1\n"
      "[services local]\n"
      "s3 =\n"
      "  endpoint_url = http://minio:9000\n",
      "");
  home.world.vars["AWS_PROFILE"] = "dev";
  EXPECT_EQ(resolve_s3_settings(home.world.env()).endpoint, "http://minio:9000");
}

TEST(AwsConfig, TheCredentialsFileOverridesTheConfigFileForTheSameProfile) {
  Home home("[profile dev]\nregion = eu-west-1\n", "[dev]\nregion = eu-north-1\n");
  home.world.vars["AWS_PROFILE"] = "dev";
  EXPECT_EQ(resolve_s3_settings(home.world.env()).region, "eu-north-1");
}

TEST(AwsConfig, FilePathsComeFromTheEnvironmentAndHome) {
  TempDir elsewhere;
  write_text(elsewhere / "cfg", "[profile x]\nregion = sa-east-1\n");
  FakeWorld w;
  w.vars["HOME"] = "/home/someone/";
  EXPECT_EQ(aws_file_paths(w.env()).config, "/home/someone/.aws/config");
  EXPECT_EQ(aws_file_paths(w.env()).credentials, "/home/someone/.aws/credentials");
  w.vars["AWS_CONFIG_FILE"] = (elsewhere / "cfg").string();
  w.vars["AWS_SHARED_CREDENTIALS_FILE"] = "~/creds";
  EXPECT_EQ(aws_file_paths(w.env()).config, (elsewhere / "cfg").string());
  EXPECT_EQ(aws_file_paths(w.env()).credentials, "/home/someone/creds");
  w.vars["AWS_PROFILE"] = "x";
  EXPECT_EQ(resolve_s3_settings(w.env()).region, "sa-east-1");
  w.vars.erase("HOME");
  EXPECT_EQ(aws_file_paths(w.env()).credentials, "");
}

TEST(AwsConfig, AProfileInNeitherFileIsAnErrorNamingItAndBothFiles) {
  Home home("[profile other]\n", "");
  home.world.vars["AWS_PROFILE"] = "prod";
  const std::string msg =
      error_message_of([&] { resolve_s3_settings(home.world.env()); }, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(msg, "\"prod\"")) << msg;
  EXPECT_TRUE(contains(msg, home.config_path())) << msg;
  EXPECT_TRUE(contains(msg, home.credentials_path() + " (no such file)")) << msg;
}

TEST(AwsConfig, MalformedFilesNameTheFileAndLine) {
  struct Case {
    std::string text;
    int line;
    std::string_view why;
  };
  const std::vector<Case> cases = {
      {"[default]\nregion = x\njust words\n", 3, "expected"},
      {"region = x\n", 1, "before any [section]"},
      {"[default\nregion = x\n", 1, "closing ']'"},
      {"[default]\n[ ]\n", 2, "no name"},
      {"[default]\nregion = a\n\n[default]\n", 4, "again (first on line 1)"},
      {"[default]\nregion = a\nREGION = b\n", 3, "\"region\" set again (first on line 2)"},
      {"[default]\ns3 =\n  addressing_style path\n", 3, "indented block of \"s3\""},
      {"[default]\n = value\n", 2, "no name"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    Home home(c.text, "");
    const std::string msg = error_message_of([&] { resolve_s3_settings(home.world.env()); },
                                             ErrorCode::kInvalidArgument);
    EXPECT_TRUE(contains(msg, fmt::format("{} line {}:", home.config_path(), c.line))) << msg;
    EXPECT_TRUE(contains(msg, c.why)) << msg;
  }
}

TEST(AwsConfig, BadValuesNameWhereTheyCameFrom) {
  Home home("[default]\ns3 =\n  addressing_style = sideways\n", "");
  std::string msg =
      error_message_of([&] { resolve_s3_settings(home.world.env()); }, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(msg, "\"sideways\"")) << msg;
  EXPECT_TRUE(contains(msg, home.config_path() + " line 3")) << msg;

  FakeWorld w;
  w.vars["AWS_ENDPOINT_URL_S3"] = "minio:9000";
  msg = error_message_of([&] { resolve_s3_settings(w.env()); }, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(msg, "AWS_ENDPOINT_URL_S3")) << msg;
  w.vars.clear();
  w.vars["AWS_REGION"] = "us-east-1/../../evil";
  msg = error_message_of([&] { resolve_s3_settings(w.env()); }, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(msg, "AWS_REGION")) << msg;
}

TEST(AwsConfig, IniParserKeepsBotocoresDialect) {
  const IniFile f = parse_aws_ini(
      "[default]\r\n"
      "aws_access_key_id: AKID\r\n"
      "note = first\n"
      "  continued\n"
      "empty =\n"
      "s3 =\n"
      "    max_concurrent_requests = 20\n"
      "\tAddressing_Style = virtual\n"
      "[profile dev]\n"
      "    indented_key = at the start of a section\n",
      "mem");
  ASSERT_EQ(f.sections.size(), 2u);
  const IniSection& d = f.sections.at("default");
  EXPECT_EQ(d.values.at("aws_access_key_id"), "AKID");
  EXPECT_EQ(d.values.at("note"), "first\ncontinued");
  EXPECT_EQ(d.values.at("empty"), "");
  EXPECT_EQ(d.values.at("s3"), "");
  EXPECT_EQ(d.sub_sections.at("s3").at("max_concurrent_requests"), "20");
  EXPECT_EQ(d.sub_sections.at("s3").at("addressing_style"), "virtual");
  EXPECT_EQ(d.lines.at("s3.addressing_style"), 8);
  EXPECT_EQ(f.sections.at("profile dev").values.at("indented_key"), "at the start of a section");

  EXPECT_NE(find_profile(f, "dev", true), nullptr);
  EXPECT_EQ(find_profile(f, "dev", false), nullptr) << "credentials files use [dev]";
  EXPECT_EQ(find_profile(f, "default", true), &d);
}

TEST(AwsConfig, AnUnreadableFileIsAnErrorNotAMissingOne) {
  TempDir dir;
  std::filesystem::create_directories(dir / "config-is-a-directory");
  FakeWorld w;
  w.vars["AWS_CONFIG_FILE"] = (dir / "config-is-a-directory").string();
  w.vars["HOME"] = dir.str();
  const std::string msg = error_message_of([&] { resolve_s3_settings(w.env()); }, ErrorCode::kIO);
  EXPECT_TRUE(contains(msg, "config-is-a-directory")) << msg;
}

TEST(AwsConfig, ShellCommandRunnerReturnsStdoutAndNamesOnlyTheProgramOnFailure) {
  EXPECT_EQ(run_shell_command("printf '%s' '{\"Version\": 1}'"), "{\"Version\": 1}");
  EXPECT_EQ(run_shell_command("echo one; echo two >&2; echo three"), "one\nthree\n");
  std::string msg =
      error_message_of([] { run_shell_command("sh -c 'exit 3' --secret-token=hunter2"); },
                       ErrorCode::kFailedPrecondition);
  EXPECT_TRUE(contains(msg, "\"sh\"")) << msg;
  EXPECT_TRUE(contains(msg, "status 3")) << msg;
  EXPECT_FALSE(contains(msg, "hunter2")) << msg;
  msg = error_message_of([] { run_shell_command("kill -9 $$"); }, ErrorCode::kFailedPrecondition);
  EXPECT_TRUE(contains(msg, "signal 9")) << msg;
  msg = error_message_of([] { run_shell_command("head -c 2000000 /dev/zero"); },
                         ErrorCode::kFailedPrecondition);
  EXPECT_TRUE(contains(msg, "more than")) << msg;
}

}  // namespace
}  // namespace cairn::s3
