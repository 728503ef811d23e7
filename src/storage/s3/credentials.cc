#include "storage/s3/credentials.h"

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cairn/error.h"
#include "util/json.h"
#include "util/log.h"

namespace cairn::s3 {

namespace {

using std::chrono::system_clock;

constexpr std::string_view kContainerHost = "http://169.254.170.2";
constexpr std::string_view kMetadataHost = "http://169.254.169.254";
constexpr std::string_view kMetadataTokenTtl = "21600";

std::optional<std::string> env_value(const AwsEnvironment& env, std::string_view name) {
  auto v = env.getenv(name);
  if (v && v->empty()) v.reset();
  return v;
}

[[noreturn]] void fail(ErrorCode code, std::string message, bool retryable = false) {
  throw Error(code, std::move(message), retryable);
}

std::string format_time(system_clock::time_point t) {
  using namespace std::chrono;
  const auto secs = floor<seconds>(t);
  const auto day = floor<days>(secs);
  const year_month_day ymd(day);
  const hh_mm_ss hms(secs - day);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", static_cast<int>(ymd.year()),
                     static_cast<unsigned>(ymd.month()), static_cast<unsigned>(ymd.day()),
                     hms.hours().count(), hms.minutes().count(), hms.seconds().count());
}

// Parses a JSON answer that holds secrets. parse_json's messages quote the
// text near a syntax error, so they are replaced with one that does not.
nlohmann::json parse_secret_json(std::string_view text, const std::string& where) {
  nlohmann::json j;
  try {
    j = parse_json(text, where);
  } catch (const Error&) {
    fail(ErrorCode::kFailedPrecondition, fmt::format("{}: the answer is not valid JSON", where));
  }
  if (!j.is_object()) {
    fail(ErrorCode::kFailedPrecondition, fmt::format("{}: the answer is not a JSON object", where));
  }
  return j;
}

std::string required_string(const nlohmann::json& j, const char* name, const std::string& where) {
  const auto it = j.find(name);
  if (it == j.end() || !it->is_string() || it->get_ref<const std::string&>().empty()) {
    fail(ErrorCode::kFailedPrecondition,
         fmt::format("{}: the answer has no {} (a non-empty string)", where, name));
  }
  return it->get<std::string>();
}

// AccessKeyId, SecretAccessKey, the token under `token_name` and Expiration,
// the shape that credential_process, container and instance metadata
// answers share.
Credentials credentials_from_json(const nlohmann::json& j, const char* token_name,
                                  const std::string& where) {
  Credentials c;
  c.access_key_id = required_string(j, "AccessKeyId", where);
  c.secret_access_key = required_string(j, "SecretAccessKey", where);
  if (const auto t = j.find(token_name); t != j.end() && !t->is_null()) {
    if (!t->is_string()) {
      fail(ErrorCode::kFailedPrecondition,
           fmt::format("{}: {} is not a string", where, token_name));
    }
    c.session_token = t->get<std::string>();
  }
  if (const auto e = j.find("Expiration"); e != j.end() && !e->is_null()) {
    const auto when =
        e->is_string() ? parse_aws_time(e->get_ref<const std::string&>()) : std::nullopt;
    if (!when) {
      fail(ErrorCode::kFailedPrecondition,
           fmt::format("{}: Expiration {} is not an ISO 8601 time", where, e->dump()));
    }
    c.expiration = when;
  }
  c.source = where;
  return c;
}

// HTTP statuses from credential endpoints, as errors naming `where`.
[[noreturn]] void http_status_error(int status, const std::string& where) {
  if (status == 401 || status == 403) {
    fail(ErrorCode::kPermissionDenied, fmt::format("{}: refused with HTTP {}", where, status));
  }
  const bool transient = status == 429 || status >= 500;
  fail(transient ? ErrorCode::kUnavailable : ErrorCode::kFailedPrecondition,
       fmt::format("{}: answered HTTP {}", where, status), transient);
}

// One walk down the chain.
class ChainLookup {
 public:
  ChainLookup(const AwsEnvironment& env, const CredentialsOptions& options)
      : env_(env),
        options_(options),
        profile_(aws_profile_name(env)),
        paths_(aws_file_paths(env)) {}

  Credentials resolve() {
    if (auto c = from_environment()) return *c;
    if (auto c = from_profile(false)) return *c;
    if (auto c = from_profile(true)) return *c;
    if (auto c = from_process()) return *c;
    if (auto c = from_container()) return *c;
    if (auto c = from_instance_metadata()) return *c;
    std::string places;
    for (const std::string& m : misses_) {
      if (!places.empty()) places += "; ";
      places += m;
    }
    fail(ErrorCode::kFailedPrecondition,
         fmt::format("no AWS credentials found for profile \"{}\": {}", profile_, places));
  }

 private:
  const IniFile& file(bool config) {
    std::optional<IniFile>& f = config ? config_ : credentials_;
    if (!f) f = load_aws_ini(config ? paths_.config : paths_.credentials);
    return *f;
  }

  std::optional<Credentials> from_environment() {
    const auto id = env_value(env_, "AWS_ACCESS_KEY_ID");
    const auto secret = env_value(env_, "AWS_SECRET_ACCESS_KEY");
    if (!id && !secret) {
      misses_.push_back("environment: AWS_ACCESS_KEY_ID not set");
      return std::nullopt;
    }
    if (!id || !secret) {
      fail(ErrorCode::kFailedPrecondition,
           fmt::format("AWS credentials in the environment: {} is set but {} is not",
                       id ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
                       id ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID"));
    }
    Credentials c{*id, *secret, "", std::nullopt, "environment"};
    if (auto t = env_value(env_, "AWS_SESSION_TOKEN")) {
      c.session_token = *t;
    } else if (auto legacy = env_value(env_, "AWS_SECURITY_TOKEN")) {
      c.session_token = *legacy;
    }
    if (auto e = env_value(env_, "AWS_CREDENTIAL_EXPIRATION")) {
      c.expiration = parse_aws_time(*e);
      if (!c.expiration) {
        fail(ErrorCode::kInvalidArgument,
             fmt::format("AWS_CREDENTIAL_EXPIRATION \"{}\" is not an ISO 8601 time", *e));
      }
    }
    return c;
  }

  std::optional<Credentials> from_profile(bool config) {
    const std::string what = config ? "config file" : "shared credentials file";
    const IniFile& f = file(config);
    if (f.path.empty()) {
      misses_.push_back(fmt::format("{}: HOME not set", what));
      return std::nullopt;
    }
    if (!f.exists) {
      misses_.push_back(fmt::format("{} {}: no such file", what, f.path));
      return std::nullopt;
    }
    const IniSection* s = find_profile(f, profile_, config);
    if (s == nullptr) {
      misses_.push_back(fmt::format("{} {}: no profile {}", what, f.path, profile_));
      return std::nullopt;
    }
    auto value = [&](const char* key) -> std::string {
      const auto it = s->values.find(key);
      return it == s->values.end() ? "" : it->second;
    };
    const std::string id = value("aws_access_key_id");
    const std::string secret = value("aws_secret_access_key");
    if (id.empty() && secret.empty()) {
      misses_.push_back(
          fmt::format("{} {}: profile {} has no aws_access_key_id", what, f.path, profile_));
      return std::nullopt;
    }
    const std::string source = fmt::format("profile {} in {}", profile_, f.path);
    if (id.empty() || secret.empty()) {
      fail(ErrorCode::kFailedPrecondition,
           fmt::format("AWS credentials in {}: {} without {}", source,
                       id.empty() ? "aws_secret_access_key" : "aws_access_key_id",
                       id.empty() ? "aws_access_key_id" : "aws_secret_access_key"));
    }
    std::string token = value("aws_session_token");
    if (token.empty()) token = value("aws_security_token");
    return Credentials{id, secret, token, std::nullopt, source};
  }

  std::optional<Credentials> from_process() {
    // The credentials file's setting wins, as botocore merges the files.
    std::string command;
    for (bool config : {false, true}) {
      const IniFile& f = file(config);
      if (const IniSection* s = find_profile(f, profile_, config)) {
        const auto it = s->values.find("credential_process");
        if (it != s->values.end() && !it->second.empty()) {
          command = it->second;
          break;
        }
      }
    }
    if (command.empty()) {
      misses_.push_back(fmt::format("credential_process: not set in profile {}", profile_));
      return std::nullopt;
    }
    const std::string where = fmt::format("credential_process of profile {}", profile_);
    std::string out;
    try {
      out = env_.run_process(command);
    } catch (const Error& e) {
      throw with_context(e, where);
    }
    const nlohmann::json j = parse_secret_json(out, where);
    const auto version = j.find("Version");
    if (version == j.end() || !version->is_number_integer() || version->get<int64_t>() != 1) {
      fail(ErrorCode::kFailedPrecondition,
           fmt::format("{}: the answer's Version is {}, not 1", where,
                       version == j.end() ? "missing" : version->dump()));
    }
    return credentials_from_json(j, "SessionToken", where);
  }

  // Whether a full container-credentials URI may be used over plain HTTP:
  // only to this machine or to the ECS and EKS agents' link-local addresses.
  static bool allowed_plain_http_host(std::string_view url) {
    std::string_view rest = url.substr(7);  // after "http://"
    rest = rest.substr(0, rest.find_first_of("/?#"));
    if (const size_t at = rest.rfind('@'); at != std::string_view::npos) rest.remove_prefix(at + 1);
    std::string_view host = rest;
    if (host.starts_with("[")) {
      host = host.substr(
          1, host.find(']') == std::string_view::npos ? host.size() - 1 : host.find(']') - 1);
    } else {
      host = host.substr(0, host.find(':'));
    }
    const std::string h = lowercase(host);
    return h == "localhost" || h.starts_with("127.") || h == "::1" || h == "169.254.170.2" ||
           h == "169.254.170.23" || h == "fd00:ec2::23";
  }

  std::optional<Credentials> from_container() {
    std::string url;
    if (auto rel = env_value(env_, "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")) {
      url = fmt::format("{}{}{}", kContainerHost, rel->starts_with("/") ? "" : "/", *rel);
    } else if (auto full = env_value(env_, "AWS_CONTAINER_CREDENTIALS_FULL_URI")) {
      url = *full;
      const bool https = url.starts_with("https://");
      if (!https && !(url.starts_with("http://") && allowed_plain_http_host(url))) {
        fail(ErrorCode::kInvalidArgument,
             fmt::format("AWS_CONTAINER_CREDENTIALS_FULL_URI \"{}\" must be https, or http to a "
                         "loopback or container-agent address",
                         url));
      }
    } else {
      misses_.push_back(
          "container credentials: AWS_CONTAINER_CREDENTIALS_RELATIVE_URI and "
          "AWS_CONTAINER_CREDENTIALS_FULL_URI not set");
      return std::nullopt;
    }
    const std::string where = fmt::format("container credentials {}", url);

    std::string token;
    if (auto path = env_value(env_, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE")) {
      // Read on every fetch: the agent rotates the file's token.
      token = read_token_file(*path, where);
    } else if (auto t = env_value(env_, "AWS_CONTAINER_AUTHORIZATION_TOKEN")) {
      token = *t;
    }
    token = std::string(trim(token));
    if (token.find_first_of("\r\n") != std::string::npos) {
      fail(ErrorCode::kInvalidArgument,
           fmt::format("{}: the authorization token holds a line break", where));
    }

    HttpRequest req;
    req.method = "GET";
    req.url = url;
    req.headers.emplace_back("Accept", "application/json");
    if (!token.empty()) req.headers.emplace_back("Authorization", token);
    req.timeout = options_.container_timeout;
    req.connect_timeout =
        std::min(options_.container_timeout, std::chrono::milliseconds(std::chrono::seconds(2)));
    HttpResponse resp;
    try {
      resp = env_.http->send(req);
    } catch (const Error& e) {
      throw with_context(e, where);
    }
    if (resp.status != 200) http_status_error(resp.status, where);
    return credentials_from_json(parse_secret_json(resp.body, where), "Token", where);
  }

  static std::string read_token_file(const std::string& path, const std::string& where) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) {
      throw with_context(errno_error(errno, "open", path),
                         where + ": AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
    }
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0 && out.size() < (size_t{1} << 20)) {
      out.append(buf, n);
    }
    const bool failed = std::ferror(f) != 0;
    std::fclose(f);
    if (failed) {
      throw with_context(errno_error(EIO, "read", path),
                         where + ": AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
    }
    return out;
  }

  std::optional<Credentials> from_instance_metadata() {
    if (auto disabled = env_value(env_, "AWS_EC2_METADATA_DISABLED");
        disabled && lowercase(trim(*disabled)) == "true") {
      misses_.push_back("EC2 instance metadata: disabled by AWS_EC2_METADATA_DISABLED");
      return std::nullopt;
    }
    std::string endpoint =
        env_value(env_, "AWS_EC2_METADATA_SERVICE_ENDPOINT").value_or(std::string(kMetadataHost));
    while (endpoint.ends_with("/")) endpoint.pop_back();
    const std::string where = fmt::format("EC2 instance metadata {}", endpoint);

    auto request = [&](const char* method, const std::string& path, Headers headers) {
      HttpRequest req;
      req.method = method;
      req.url = endpoint + path;
      req.headers = std::move(headers);
      req.timeout = options_.metadata_timeout;
      req.connect_timeout = options_.metadata_connect_timeout;
      return env_.http->send(req);
    };

    // An unreachable service is the common case off EC2: a miss, not an error.
    HttpResponse token_resp;
    try {
      token_resp =
          request("PUT", "/latest/api/token",
                  {{"X-aws-ec2-metadata-token-ttl-seconds", std::string(kMetadataTokenTtl)}});
    } catch (const Error& e) {
      misses_.push_back(fmt::format("{}: {}", where, e.what()));
      return std::nullopt;
    }
    if (token_resp.status != 200) {
      misses_.push_back(
          fmt::format("{}: the session token request answered HTTP {}", where, token_resp.status));
      return std::nullopt;
    }
    const std::string token(trim(token_resp.body));
    const Headers auth = {{"X-aws-ec2-metadata-token", token}};

    // From here on the service is there, so failures are errors of their own.
    try {
      const std::string roles_path = "/latest/meta-data/iam/security-credentials/";
      const HttpResponse roles = request("GET", roles_path, auth);
      if (roles.status == 404) {
        misses_.push_back(fmt::format("{}: no IAM role attached to the instance", where));
        return std::nullopt;
      }
      if (roles.status != 200) http_status_error(roles.status, where + roles_path);
      const std::string_view listing = trim(roles.body);
      const std::string role(trim(listing.substr(0, listing.find('\n'))));
      if (role.empty()) {
        misses_.push_back(fmt::format("{}: no IAM role attached to the instance", where));
        return std::nullopt;
      }
      const std::string role_where = fmt::format("{} (role {})", where, role);
      const HttpResponse creds = request("GET", roles_path + uri_encode(role, true), auth);
      if (creds.status != 200) http_status_error(creds.status, role_where);
      const nlohmann::json j = parse_secret_json(creds.body, role_where);
      if (const auto code = j.find("Code"); code != j.end() && *code != "Success") {
        fail(ErrorCode::kFailedPrecondition,
             fmt::format("{}: the answer's Code is {}, not \"Success\"", role_where, code->dump()));
      }
      return credentials_from_json(j, "Token", role_where);
    } catch (const Error& e) {
      if (std::string_view(e.what()).starts_with(where)) throw;
      throw with_context(e, where);
    }
  }

  const AwsEnvironment& env_;
  const CredentialsOptions& options_;
  const std::string profile_;
  const AwsFilePaths paths_;
  std::optional<IniFile> config_;
  std::optional<IniFile> credentials_;
  std::vector<std::string> misses_;
};

class ChainProvider final : public CredentialsProvider {
 public:
  ChainProvider(AwsEnvironment env, CredentialsOptions options)
      : env_(std::move(env)), options_(options) {}

  Credentials get() override {
    std::unique_lock lock(mu_);
    if (cached_ && (fresh(*cached_) || (!expired(*cached_) && fetched_recently()))) {
      return *cached_;
    }
    return fetch(lock, /*from_get=*/true);
  }

  Credentials refresh() override {
    std::unique_lock lock(mu_);
    return fetch(lock, /*from_get=*/false);
  }

 private:
  // Fresh: more of their lifetime left than the window, which is the
  // configured one or, for short-lived credentials, a quarter of the lifetime
  // they had when fetched (credentials valid for 4 minutes are re-fetched
  // with 1 minute left, not on every request).
  bool fresh(const Credentials& c) const {
    if (!c.expiration) return true;
    auto window = std::chrono::duration_cast<system_clock::duration>(options_.refresh_window);
    if (fetched_at_ && *fetched_at_ < *c.expiration) {
      window = std::min(window, (*c.expiration - *fetched_at_) / 4);
    }
    return env_.now() + window < *c.expiration;
  }
  // get() asks the chain at most once per min_refetch_interval while the
  // cached credentials still work: a source that keeps answering with
  // credentials about to expire, or keeps failing, is not asked per request.
  bool fetched_recently() const {
    return last_attempt_ && env_.now() < *last_attempt_ + options_.min_refetch_interval;
  }
  bool expired(const Credentials& c) const { return c.expiration && env_.now() >= *c.expiration; }

  // Runs one walk down the chain, or joins the one under way; `lock` holds mu_.
  Credentials fetch(std::unique_lock<std::mutex>& lock, bool from_get) {
    if (fetching_) {
      const uint64_t seen = generation_;
      cv_.wait(lock, [&] { return generation_ != seen; });
    } else {
      fetching_ = true;
      last_attempt_ = env_.now();
      lock.unlock();
      std::optional<Credentials> got;
      std::exception_ptr error;
      try {
        got = ChainLookup(env_, options_).resolve();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      fetching_ = false;
      ++generation_;
      last_error_ = error;
      if (got) {
        cached_ = std::move(got);
        fetched_at_ = env_.now();
      }
      cv_.notify_all();
    }
    if (last_error_) {
      if (from_get && cached_ && !expired(*cached_)) {
        // ignore-error: the cached credentials still work; the next get()
        // tries again, and the failure is logged.
        try {
          std::rethrow_exception(last_error_);
        } catch (const std::exception& e) {
          log::warn(
              fmt::format("AWS credentials from {} expire at {}; renewing them failed, "
                          "using them until then: {}",
                          cached_->source, format_time(*cached_->expiration), e.what()));
        }
        return *cached_;
      }
      std::rethrow_exception(last_error_);
    }
    return *cached_;
  }

  const AwsEnvironment env_;
  const CredentialsOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool fetching_ = false;
  uint64_t generation_ = 0;  // completed fetches
  std::exception_ptr last_error_;
  std::optional<Credentials> cached_;
  std::optional<system_clock::time_point> fetched_at_;    // when cached_ arrived
  std::optional<system_clock::time_point> last_attempt_;  // the last fetch's start
};

class StaticProvider final : public CredentialsProvider {
 public:
  explicit StaticProvider(Credentials c) : c_(std::move(c)) {}
  Credentials get() override { return c_; }
  Credentials refresh() override { return c_; }

 private:
  const Credentials c_;
};

bool digits(std::string_view s, size_t at, size_t n, int& out) {
  if (at + n > s.size()) return false;
  out = 0;
  for (size_t i = at; i < at + n; ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    out = out * 10 + (s[i] - '0');
  }
  return true;
}

}  // namespace

std::optional<system_clock::time_point> parse_aws_time(std::string_view s) {
  using namespace std::chrono;
  s = trim(s);
  int y, mo, d, h, mi, sec;
  if (!digits(s, 0, 4, y) || s.size() < 19 || s[4] != '-' || !digits(s, 5, 2, mo) || s[7] != '-' ||
      !digits(s, 8, 2, d) || (s[10] != 'T' && s[10] != 't' && s[10] != ' ') ||
      !digits(s, 11, 2, h) || s[13] != ':' || !digits(s, 14, 2, mi) || s[16] != ':' ||
      !digits(s, 17, 2, sec)) {
    return std::nullopt;
  }
  const year_month_day ymd{year(y), month(static_cast<unsigned>(mo)),
                           day(static_cast<unsigned>(d))};
  if (!ymd.ok() || h > 23 || mi > 59 || sec > 60) return std::nullopt;
  size_t at = 19;
  microseconds fraction{0};
  if (at < s.size() && s[at] == '.') {
    ++at;
    int64_t scale = 100000;
    const size_t start = at;
    while (at < s.size() && s[at] >= '0' && s[at] <= '9') {
      fraction += microseconds((s[at] - '0') * scale);
      scale /= 10;
      ++at;
    }
    if (at == start) return std::nullopt;
  }
  minutes offset{0};
  if (at < s.size() && (s[at] == 'Z' || s[at] == 'z')) {
    ++at;
  } else if (at < s.size() && (s[at] == '+' || s[at] == '-')) {
    const int sign = s[at] == '-' ? -1 : 1;
    int oh, om;
    if (!digits(s, at + 1, 2, oh)) return std::nullopt;
    size_t mat = at + 3;
    if (mat < s.size() && s[mat] == ':') ++mat;
    if (!digits(s, mat, 2, om) || oh > 23 || om > 59) return std::nullopt;
    offset = minutes(sign * (oh * 60 + om));
    at = mat + 2;
  } else {
    return std::nullopt;  // a time without a zone is ambiguous
  }
  if (at != s.size()) return std::nullopt;
  const auto t = sys_days(ymd) + hours(h) + minutes(mi) + seconds(sec) + fraction - offset;
  return time_point_cast<system_clock::duration>(t);
}

std::shared_ptr<CredentialsProvider> default_credentials(AwsEnvironment env,
                                                         CredentialsOptions options) {
  return std::make_shared<ChainProvider>(std::move(env), options);
}

std::shared_ptr<CredentialsProvider> static_credentials(Credentials c) {
  return std::make_shared<StaticProvider>(std::move(c));
}

}  // namespace cairn::s3
