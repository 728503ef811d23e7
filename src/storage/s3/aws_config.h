// AWS configuration the way the AWS CLI and SDKs resolve it: environment
// variables first, then the shared config and credentials files
// (~/.aws/config, ~/.aws/credentials), then defaults.
//
// Everything reads the process's surroundings through an AwsEnvironment, so
// tests inject variables, a clock, an HTTP client and a process runner; only
// AwsEnvironment::process() touches the real ones. The files themselves are
// read from the file system, at the paths the environment names.
//
// Thread-safety: the functions here keep no state; they may run concurrently
// as long as the AwsEnvironment's callables may.
// Failure: cairn::Error. A malformed file is kInvalidArgument naming the file
// and line; a file that exists but cannot be read is the errno_error() of the
// read; a missing file is not an error (it is as if it were empty).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "storage/s3/http.h"

namespace cairn::s3 {

struct AwsEnvironment {
  // The value of an environment variable; empty when it is not set.
  std::function<std::optional<std::string>(std::string_view name)> getenv;
  std::function<std::chrono::system_clock::time_point()> now;
  // For the EC2 instance metadata service and container credentials.
  std::shared_ptr<HttpClient> http;
  // Runs a shell command line (a profile's credential_process) and returns
  // its standard output; throws cairn::Error on a non-zero exit naming the
  // program but not its arguments, which may hold secrets.
  std::function<std::string(const std::string& command)> run_process;

  // The real thing: the process environment, the system clock, the libcurl
  // client and run_shell_command().
  static AwsEnvironment process();
};

// Runs `command` with /bin/sh -c, standard error passed through, and returns
// its standard output (at most 1 MiB). Throws Error kFailedPrecondition when it
// cannot be started, is killed, or exits non-zero, naming only the program
// (the command's first word).
std::string run_shell_command(const std::string& command);

struct S3Settings {
  std::string profile;  // AWS_PROFILE, else AWS_DEFAULT_PROFILE, else "default"
  // AWS_REGION, AWS_DEFAULT_REGION, the profile's `region`, else "us-east-1".
  std::string region;
  // AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's `s3 =` sub-section
  // endpoint_url, the `[services x]` section's named by the profile's
  // `services`, the profile's endpoint_url, else
  // "https://s3.<region>.amazonaws.com"; never a trailing slash.
  // AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true (or the profile's
  // ignore_configured_endpoint_urls = true) skips all but the default.
  std::string endpoint;
  bool custom_endpoint = false;  // whether `endpoint` came from configuration
  // The profile's `s3 =` sub-section addressing_style (auto|path|virtual).
  enum class Addressing { kAuto, kPath, kVirtual } addressing = Addressing::kAuto;
};

// The S3 settings for `env`. Throws Error kInvalidArgument when a file is
// malformed, when AWS_PROFILE names a profile that exists in neither file
// (naming the profile and both files), or when a value is unusable (an
// endpoint that is not an http(s) URL, an unknown addressing style, a region
// that is not a region name), naming where the value came from.
S3Settings resolve_s3_settings(const AwsEnvironment& env);

// Text helpers shared by the configuration and credential parsers (ASCII
// whitespace and case, as the AWS file formats define them).
bool is_space(char c);
std::string_view trim(std::string_view s);
std::string lowercase(std::string_view s);

// ---- The shared files, for the credential providers and tests ----

// One [section] of an AWS INI file.
struct IniSection {
  int line = 0;  // of the [header]
  // Settings by lowercased name, values trimmed. A name followed by an
  // indented block ("s3 =\n  addressing_style = path") has an empty value here
  // and its block in sub_sections.
  std::map<std::string, std::string> values;
  std::map<std::string, std::map<std::string, std::string>> sub_sections;
  // The line of each setting, by name or "name.sub_name", for messages.
  std::map<std::string, int> lines;
};

struct IniFile {
  std::string path;
  bool exists = false;
  // Sections by their header's text, trimmed: "default", "profile dev", "dev".
  std::map<std::string, IniSection> sections;
};

// Parses an AWS shared config or credentials file, as botocore does: `[name]`
// headers, `name = value` or `name: value` settings (names lowercased), full-line
// comments starting with # or ;, indented blocks after a name with no value
// as a sub-section, other indented lines continuing the previous value. A
// line that is none of these, a setting before any section, or a repeated
// section or setting is an Error kInvalidArgument naming `path` and the line.
// Pure: `path` is only for messages.
IniFile parse_aws_ini(std::string_view text, std::string_view path);

// Reads and parses the file at `path`. A missing file (or an empty `path`)
// gives an IniFile with exists == false.
IniFile load_aws_ini(const std::string& path);

struct AwsFilePaths {
  // AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials; AWS_CONFIG_FILE,
  // else ~/.aws/config. A leading "~/" is expanded with HOME; empty when it
  // needs HOME and HOME is not set.
  std::string credentials;
  std::string config;
};
AwsFilePaths aws_file_paths(const AwsEnvironment& env);

// AWS_PROFILE, else AWS_DEFAULT_PROFILE, else "default".
std::string aws_profile_name(const AwsEnvironment& env);

// The profile's section: in a config file "[profile <name>]" (or "[default]"
// for the default profile), in a credentials file "[<name>]". Null when absent.
const IniSection* find_profile(const IniFile& file, std::string_view profile, bool config_file);

}  // namespace cairn::s3
