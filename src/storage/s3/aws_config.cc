#include "storage/s3/aws_config.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "cairn/error.h"
#include "util/fs.h"

extern char** environ;

namespace cairn::s3 {

namespace {

constexpr size_t kMaxFileBytes = size_t{16} << 20;
constexpr size_t kMaxProcessOutput = size_t{1} << 20;

[[noreturn]] void malformed(std::string_view path, int line, std::string_view why) {
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("AWS shared file {} line {}: {}", path, line, why));
}

// A variable's value, with an empty value counting as unset (as the AWS
// tools treat most of them).
std::optional<std::string> env_value(const AwsEnvironment& env, std::string_view name) {
  auto v = env.getenv(name);
  if (v && v->empty()) v.reset();
  return v;
}

bool env_true(const AwsEnvironment& env, std::string_view name) {
  const auto v = env_value(env, name);
  return v && lowercase(trim(*v)) == "true";
}

std::string expand_home(const AwsEnvironment& env, const std::string& path) {
  if (path != "~" && !path.starts_with("~/")) return path;
  const auto home = env_value(env, "HOME");
  if (!home) return "";
  std::string h = *home;
  while (h.size() > 1 && h.back() == '/') h.pop_back();
  return h + path.substr(1);
}

// A setting of the merged profile and where it came from, for messages.
struct Setting {
  std::string value;
  std::string where;
};

// The profile as botocore sees it: the config file's section with the
// credentials file's section laid over it.
struct MergedProfile {
  std::map<std::string, Setting> values;
  std::map<std::string, std::map<std::string, Setting>> sub_sections;
};

void merge_section(MergedProfile& into, const IniSection& s, const std::string& path,
                   std::string_view profile) {
  auto where = [&](const std::string& key) {
    const auto it = s.lines.find(key);
    return fmt::format("profile {} in {} line {}", profile, path,
                       it == s.lines.end() ? s.line : it->second);
  };
  for (const auto& [k, v] : s.values) into.values[k] = {v, where(k)};
  for (const auto& [name, sub] : s.sub_sections) {
    for (const auto& [k, v] : sub) into.sub_sections[name][k] = {v, where(name + "." + k)};
  }
}

const Setting* lookup(const std::map<std::string, Setting>& m, const std::string& key) {
  const auto it = m.find(key);
  return it == m.end() || it->second.value.empty() ? nullptr : &it->second;
}

std::string checked_endpoint(std::string url, std::string_view where) {
  url = std::string(trim(url));
  const bool http = url.starts_with("http://");
  const bool https = url.starts_with("https://");
  while (url.ends_with("/")) url.pop_back();
  const size_t host_at = https ? 8 : 7;
  if ((!http && !https) || url.size() <= host_at ||
      url.find_first_of(" \t?#") != std::string::npos) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("S3 endpoint \"{}\" from {} is not an http:// or https:// URL", url, where));
  }
  return url;
}

}  // namespace

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::string lowercase(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

// ---- INI files ----

IniFile parse_aws_ini(std::string_view text, std::string_view path) {
  IniFile file;
  file.path = std::string(path);
  file.exists = true;
  IniSection* section = nullptr;
  std::string key;      // the last setting in `section`, for indented lines
  bool in_sub = false;  // whether `key` opened a sub-section
  int line_no = 0;
  while (!text.empty()) {
    ++line_no;
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const std::string_view t = trim(line);
    if (t.empty() || t.front() == '#' || t.front() == ';') continue;
    const bool indented = is_space(line.front());

    if (indented && section != nullptr && !key.empty()) {
      std::string& value = section->values[key];
      if (value.empty() || in_sub) {
        // A sub-section's "name = value" line.
        const size_t eq = t.find('=');
        if (eq == std::string_view::npos) {
          malformed(path, line_no,
                    fmt::format("expected \"name = value\" in the indented block of \"{}\"", key));
        }
        const std::string sub_key = lowercase(trim(t.substr(0, eq)));
        if (sub_key.empty()) malformed(path, line_no, "a setting with no name");
        in_sub = true;
        section->sub_sections[key][sub_key] = std::string(trim(t.substr(eq + 1)));
        section->lines[key + "." + sub_key] = line_no;
      } else {
        value += "\n";  // a continued value, as configparser reads one
        value += t;
      }
      continue;
    }

    if (t.front() == '[') {
      if (t.back() != ']') malformed(path, line_no, "a section header without its closing ']'");
      const std::string name(trim(t.substr(1, t.size() - 2)));
      if (name.empty()) malformed(path, line_no, "a section header with no name");
      const auto [it, added] = file.sections.try_emplace(name);
      if (!added) {
        malformed(path, line_no,
                  fmt::format("section [{}] again (first on line {})", name, it->second.line));
      }
      section = &it->second;
      section->line = line_no;
      key.clear();
      in_sub = false;
      continue;
    }

    const size_t delim = t.find_first_of("=:");
    if (delim == std::string_view::npos) {
      malformed(path, line_no, "expected \"[section]\", \"name = value\" or a comment");
    }
    if (section == nullptr) malformed(path, line_no, "a setting before any [section]");
    std::string name = lowercase(trim(t.substr(0, delim)));
    if (name.empty()) malformed(path, line_no, "a setting with no name");
    if (section->values.count(name)) {
      malformed(path, line_no,
                fmt::format("\"{}\" set again (first on line {})", name, section->lines[name]));
    }
    section->values[name] = std::string(trim(t.substr(delim + 1)));
    section->lines[name] = line_no;
    key = std::move(name);
    in_sub = false;
  }
  return file;
}

IniFile load_aws_ini(const std::string& path) {
  IniFile none;
  none.path = path;
  if (path.empty()) return none;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return none;
    throw errno_error(errno, "open", path);
  }
  UniqueFd owned(fd);
  std::string text;
  char buf[8192];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw errno_error(errno, "read", path);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxFileBytes) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("AWS shared file {} is larger than {} bytes", path, kMaxFileBytes));
    }
  }
  return parse_aws_ini(text, path);
}

AwsFilePaths aws_file_paths(const AwsEnvironment& env) {
  return {expand_home(env,
                      env_value(env, "AWS_SHARED_CREDENTIALS_FILE").value_or("~/.aws/credentials")),
          expand_home(env, env_value(env, "AWS_CONFIG_FILE").value_or("~/.aws/config"))};
}

std::string aws_profile_name(const AwsEnvironment& env) {
  if (auto p = env_value(env, "AWS_PROFILE")) return *p;
  if (auto p = env_value(env, "AWS_DEFAULT_PROFILE")) return *p;
  return "default";
}

const IniSection* find_profile(const IniFile& file, std::string_view profile, bool config_file) {
  if (!config_file) {
    const auto it = file.sections.find(std::string(profile));
    return it == file.sections.end() ? nullptr : &it->second;
  }
  // "[profile  dev]" names profile dev too: botocore splits the header on
  // whitespace. "[profile default]" and "[default]" both name the default.
  const IniSection* plain_default = nullptr;
  for (const auto& [name, section] : file.sections) {
    if (name == "default" && profile == "default") plain_default = &section;
    if (!name.starts_with("profile") || name.size() <= 7 || !is_space(name[7])) continue;
    if (trim(std::string_view(name).substr(7)) == profile) return &section;
  }
  return plain_default;
}

// ---- S3 settings ----

namespace {

using SubSection = std::map<std::string, Setting>;

// The profile's settings from the config file and then the shared
// credentials file (which wins), for `profile_name`. kInvalidArgument when a
// profile other than the default is in neither file.
MergedProfile load_profile(const IniFile& config, const IniFile& credentials,
                           const std::string& profile_name) {
  const IniSection* from_config = find_profile(config, profile_name, true);
  const IniSection* from_credentials = find_profile(credentials, profile_name, false);
  if (profile_name != "default" && from_config == nullptr && from_credentials == nullptr) {
    auto describe = [](const IniFile& f, std::string_view what) {
      if (f.path.empty()) return fmt::format("{} file (not looked for: HOME is not set)", what);
      return fmt::format("{} file {}{}", what, f.path, f.exists ? "" : " (no such file)");
    };
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("AWS profile \"{}\" (from AWS_PROFILE) is in neither the {} nor the {}",
                            profile_name, describe(config, "config"),
                            describe(credentials, "shared credentials")));
  }
  MergedProfile profile;
  if (from_config) merge_section(profile, *from_config, config.path, profile_name);
  if (from_credentials) merge_section(profile, *from_credentials, credentials.path, profile_name);
  return profile;
}

// The region: AWS_REGION, AWS_DEFAULT_REGION, the profile's, or us-east-1.
// kInvalidArgument naming where it came from when it is not a region name.
std::string resolve_region(const AwsEnvironment& env, const MergedProfile& profile) {
  std::string region;
  std::string region_from;
  if (auto r = env_value(env, "AWS_REGION")) {
    region = *r;
    region_from = "AWS_REGION";
  } else if (auto d = env_value(env, "AWS_DEFAULT_REGION")) {
    region = *d;
    region_from = "AWS_DEFAULT_REGION";
  } else if (const Setting* p = lookup(profile.values, "region")) {
    region = p->value;
    region_from = p->where;
  } else {
    region = "us-east-1";
  }
  region = std::string(trim(region));
  const bool region_ok =
      !region.empty() && region.find_first_not_of(
                             "abcdefghijklmnopqrstuvwxyz"
                             "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-") == std::string::npos;
  if (!region_ok) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("AWS region \"{}\" from {} is not a region name", region, region_from));
  }
  return region;
}

// The endpoint_url of the profile's "services" section for s3, if any.
std::optional<Setting> services_endpoint(const MergedProfile& profile, const IniFile& config) {
  const Setting* services = lookup(profile.values, "services");
  if (services == nullptr) return std::nullopt;
  const auto it = config.sections.find("services " + services->value);
  if (it == config.sections.end()) return std::nullopt;
  const auto sub_it = it->second.sub_sections.find("s3");
  if (sub_it == it->second.sub_sections.end()) return std::nullopt;
  const auto url = sub_it->second.find("endpoint_url");
  if (url == sub_it->second.end() || url->second.empty()) return std::nullopt;
  return Setting{url->second, fmt::format("[services {}] in {} line {}", services->value,
                                          config.path, it->second.lines.at("s3.endpoint_url"))};
}

// A configured endpoint, in the order the AWS CLI looks for one, unless
// configured endpoints are ignored; nothing means the region's AWS endpoint.
std::optional<Setting> configured_endpoint(const AwsEnvironment& env, const MergedProfile& profile,
                                           const SubSection& s3, const IniFile& config) {
  const Setting* ignore = lookup(profile.values, "ignore_configured_endpoint_urls");
  const bool ignore_configured = env_value(env, "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")
                                     ? env_true(env, "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")
                                     : ignore && lowercase(ignore->value) == "true";
  if (ignore_configured) return std::nullopt;
  if (auto e = env_value(env, "AWS_ENDPOINT_URL_S3")) return Setting{*e, "AWS_ENDPOINT_URL_S3"};
  if (auto g = env_value(env, "AWS_ENDPOINT_URL")) return Setting{*g, "AWS_ENDPOINT_URL"};
  if (const Setting* sub = lookup(s3, "endpoint_url")) return *sub;
  if (std::optional<Setting> e = services_endpoint(profile, config)) return e;
  if (const Setting* p = lookup(profile.values, "endpoint_url")) return *p;
  return std::nullopt;
}

// The s3 section's addressing_style (kAuto when unset).
S3Settings::Addressing resolve_addressing(const SubSection& s3) {
  const Setting* style = lookup(s3, "addressing_style");
  if (style == nullptr) return S3Settings{}.addressing;
  const std::string v = lowercase(style->value);
  if (v == "auto") return S3Settings::Addressing::kAuto;
  if (v == "path") return S3Settings::Addressing::kPath;
  if (v == "virtual") return S3Settings::Addressing::kVirtual;
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("s3 addressing_style \"{}\" in {} is not auto, path or virtual",
                          style->value, style->where));
}

}  // namespace

S3Settings resolve_s3_settings(const AwsEnvironment& env) {
  S3Settings s;
  s.profile = aws_profile_name(env);
  const AwsFilePaths paths = aws_file_paths(env);
  const IniFile config = load_aws_ini(paths.config);
  const IniFile credentials = load_aws_ini(paths.credentials);
  const MergedProfile profile = load_profile(config, credentials, s.profile);
  static const SubSection kNone;
  const auto s3_it = profile.sub_sections.find("s3");
  const SubSection& s3 = s3_it == profile.sub_sections.end() ? kNone : s3_it->second;
  s.region = resolve_region(env, profile);
  if (std::optional<Setting> endpoint = configured_endpoint(env, profile, s3, config)) {
    s.endpoint = checked_endpoint(endpoint->value, endpoint->where);
    s.custom_endpoint = true;
  } else {
    s.endpoint = fmt::format("https://s3.{}.amazonaws.com", s.region);
  }
  s.addressing = resolve_addressing(s3);
  return s;
}

// ---- credential_process ----

std::string run_shell_command(const std::string& command) {
  // Only the program is named in messages: arguments may carry secrets.
  const std::string_view t = trim(command);
  const std::string program(t.substr(0, t.find_first_of(" \t")));
  auto fail = [&](std::string why) {
    return Error(ErrorCode::kFailedPrecondition,
                 fmt::format("credential_process \"{}\": {}", program, why));
  };
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw fail(fmt::format("pipe: {}", std::strerror(errno)));
  UniqueFd read_end(fds[0]);
  UniqueFd write_end(fds[1]);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), STDOUT_FILENO);
  const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
  pid_t pid = -1;
  const int rc =
      ::posix_spawn(&pid, "/bin/sh", &actions, nullptr, const_cast<char**>(argv), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw fail(fmt::format("cannot start /bin/sh: {}", std::strerror(rc)));
  write_end = UniqueFd();  // the child holds its copy; EOF comes when it exits

  std::string out;
  bool too_long = false;
  char buf[8192];
  for (;;) {
    const ssize_t n = ::read(read_end.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (out.size() + static_cast<size_t>(n) > kMaxProcessOutput) {
      too_long = true;  // keep draining so the child is not stuck on a full pipe
      continue;
    }
    out.append(buf, static_cast<size_t>(n));
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw fail(fmt::format("waitpid: {}", std::strerror(errno)));
  }
  if (WIFSIGNALED(status)) throw fail(fmt::format("killed by signal {}", WTERMSIG(status)));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw fail(fmt::format("exited with status {}", WEXITSTATUS(status)));
  }
  if (too_long) throw fail(fmt::format("wrote more than {} bytes", kMaxProcessOutput));
  return out;
}

}  // namespace cairn::s3
