#include "storage/s3/client.h"

#include <algorithm>
#include <charconv>
#include <thread>

#include <fmt/format.h>

#include "cairn/error.h"
#include "storage/s3/key_spread.h"
#include "storage/s3/sigv4.h"
#include "storage/s3/xml.h"
#include "util/log.h"

namespace cairn::s3 {
namespace {

template <typename T>
T env_number(const AwsEnvironment& env, std::string_view name, T fallback, T min) {
  std::optional<std::string> v = env.getenv(name);
  if (!v || v->empty()) return fallback;
  T out{};
  auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), out);
  if (ec != std::errc() || p != v->data() + v->size() || out < min) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}=\"{}\": expected a whole number of at least {}", name, *v, min));
  }
  return out;
}

// An on/off variable: on or 1, off or 0; unset or empty keeps `fallback`.
bool env_switch(const AwsEnvironment& env, std::string_view name, bool fallback) {
  std::optional<std::string> v = env.getenv(name);
  if (!v || v->empty()) return fallback;
  if (*v == "on" || *v == "1") return true;
  if (*v == "off" || *v == "0") return false;
  throw Error(ErrorCode::kInvalidArgument, fmt::format("{}=\"{}\": expected on or off", name, *v));
}

// A bucket name that can be a DNS label (virtual-hosted addressing).
bool dns_compatible(std::string_view bucket) {
  if (bucket.size() < 3 || bucket.size() > 63) return false;
  for (char c : bucket) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return bucket.front() != '-' && bucket.back() != '-';
}

bool is_token_expiry(std::string_view code) {
  return code == "ExpiredToken" || code == "ExpiredTokenException" || code == "InvalidToken" ||
         code == "TokenRefreshRequired" || code == "RequestExpired";
}

}  // namespace

S3Options S3Options::from_environment(const AwsEnvironment& env) {
  S3Options o;
  const uint64_t min_part =
      env_number<uint64_t>(env, "CAIRN_S3_MIN_PART_SIZE", kMinPartSize, uint64_t{4096});
  o.part_size = env_number<uint64_t>(env, "CAIRN_S3_PART_SIZE", o.part_size, 1);
  if (o.part_size < min_part) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("CAIRN_S3_PART_SIZE={}: below the smallest part the server accepts "
                            "({} bytes{}); set at least {}",
                            o.part_size, min_part,
                            min_part == kMinPartSize ? ", S3's minimum of 5 MiB"
                                                     : ", from CAIRN_S3_MIN_PART_SIZE",
                            min_part));
  }
  if (o.part_size > kMaxPartSize) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("CAIRN_S3_PART_SIZE={}: above the largest part S3 accepts ({} bytes, "
                            "5 GiB); set at most {}",
                            o.part_size, kMaxPartSize, kMaxPartSize));
  }
  o.concurrency = env_number<int>(env, "CAIRN_S3_CONCURRENCY", o.concurrency, 1);
  o.upload_cutoff = env_number<uint64_t>(env, "CAIRN_S3_UPLOAD_CUTOFF", o.upload_cutoff, 0);
  if (o.upload_cutoff > kMaxPutSize) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("CAIRN_S3_UPLOAD_CUTOFF={}: above the largest object one PUT may "
                            "carry ({} bytes, 5 GiB); set at most {}",
                            o.upload_cutoff, kMaxPutSize, kMaxPutSize));
  }
  o.lock_ttl =
      std::chrono::seconds(env_number<long long>(env, "CAIRN_S3_LOCK_TTL", o.lock_ttl.count(), 2));
  o.retry.max_attempts = env_number<int>(env, "CAIRN_S3_MAX_ATTEMPTS", o.retry.max_attempts, 1);
  o.prefixes = env_number<uint32_t>(env, "CAIRN_S3_PREFIXES", o.prefixes, 1);
  if (o.prefixes > KeySpread::kMaxPrefixes) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("CAIRN_S3_PREFIXES={}: at most {} key prefixes", o.prefixes,
                            KeySpread::kMaxPrefixes));
  }
  o.conditional_writes = env_switch(env, "CAIRN_S3_CONDITIONAL_WRITES", o.conditional_writes);
  o.torn_writes = env_switch(env, "CAIRN_S3_TORN_WRITES", o.torn_writes);
  return o;
}

S3Client::S3Client(S3Settings settings, std::shared_ptr<CredentialsProvider> credentials,
                   std::shared_ptr<HttpClient> http, S3Options options,
                   std::function<std::chrono::system_clock::time_point()> now)
    : settings_(std::move(settings)),
      credentials_(std::move(credentials)),
      http_(std::move(http)),
      options_(options),
      now_(now ? std::move(now) : [] { return std::chrono::system_clock::now(); }),
      rng_(std::random_device{}()) {
  std::string_view e = settings_.endpoint;
  size_t sep = e.find("://");
  if (sep == std::string_view::npos) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("S3 endpoint \"{}\": expected http://host[:port] or https://host[:port]", e));
  }
  scheme_ = std::string(e.substr(0, sep));
  if (scheme_ != "http" && scheme_ != "https") {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("S3 endpoint \"{}\": the scheme must be http or https", e));
  }
  std::string_view host = e.substr(sep + 3);
  host = host.substr(0, host.find('/'));
  if (host.empty()) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("S3 endpoint \"{}\": no host", e));
  }
  // The Host header libcurl sends leaves out the scheme's default port; the
  // signed one must be byte-identical.
  std::string_view default_port = scheme_ == "http" ? ":80" : ":443";
  if (host.ends_with(default_port)) host.remove_suffix(default_port.size());
  endpoint_host_ = std::string(host);
}

std::string S3Client::object_uri(std::string_view bucket, std::string_view key) {
  return key.empty() ? fmt::format("s3://{}", bucket) : fmt::format("s3://{}/{}", bucket, key);
}

std::string S3Client::url_for(const std::string& bucket, const S3Request& request,
                              std::string& host, std::string& path) const {
  bool virtual_style = settings_.addressing == S3Settings::Addressing::kVirtual ||
                       (settings_.addressing == S3Settings::Addressing::kAuto &&
                        !settings_.custom_endpoint && dns_compatible(bucket));
  std::string key = uri_encode(request.key, /*encode_slash=*/false);
  if (virtual_style) {
    host = fmt::format("{}.{}", bucket, endpoint_host_);
    path = fmt::format("/{}", key);
  } else {
    host = endpoint_host_;
    path = request.key.empty() ? fmt::format("/{}", bucket) : fmt::format("/{}/{}", bucket, key);
  }
  // fmt rather than `"?" + std::string&&`: g++ 12 at -O3 reports a false
  // -Wrestrict overlap for the latter (GCC bug 105329).
  if (request.query.empty()) return fmt::format("{}://{}{}", scheme_, host, path);
  return fmt::format("{}://{}{}?{}", scheme_, host, path, canonical_query_string(request.query));
}

double S3Client::uniform() {
  std::lock_guard<std::mutex> g(rng_mu_);
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
}

Error S3Client::error_for(const std::string& bucket, const S3Request& request,
                          const HttpResponse& response, int attempts) const {
  S3ErrorBody e = parse_error_body(response.body);
  if (e.code.empty()) {
    e.code = response.status == 404 ? "NotFound" : fmt::format("HTTP{}", response.status);
  }
  if (e.request_id.empty()) e.request_id = response.header("x-amz-request-id").value_or("");
  std::string subject = object_uri(bucket, request.named());
  std::string detail = fmt::format("HTTP {} {}", response.status, e.code);
  if (!e.message.empty()) detail += ": " + e.message;
  std::string tail;
  if (!e.request_id.empty()) tail += fmt::format("request id {}", e.request_id);
  if (attempts > 1) tail += fmt::format("{}{} attempts", tail.empty() ? "" : "; ", attempts);
  if (!tail.empty()) detail += " (" + tail + ")";

  std::optional<std::string> region = response.header("x-amz-bucket-region");
  if (!region && !e.region.empty()) region = e.region;
  if (region && *region != settings_.region &&
      (response.status == 301 || e.code == "AuthorizationHeaderMalformed" ||
       e.code == "PermanentRedirect")) {
    return Error(ErrorCode::kInvalidArgument,
                 fmt::format("{}: the bucket is in region {}, not {} (set AWS_REGION={}): {}",
                             object_uri(bucket, ""), *region, settings_.region, *region, detail));
  }
  if (e.code == "NoSuchBucket") {
    return Error(ErrorCode::kNotFound,
                 fmt::format("{}: the bucket does not exist at {} ({})", object_uri(bucket, ""),
                             settings_.endpoint, detail));
  }
  std::string what = fmt::format("{}: {} failed: {}", subject, request.method, detail);
  switch (response.status) {
    case 404:
      return Error(ErrorCode::kNotFound, what);
    case 401:
    case 403:
      return Error(ErrorCode::kPermissionDenied, what);
    case 405:
    case 501:
      return Error(ErrorCode::kFailedPrecondition,
                   fmt::format("{} (the server does not support this operation)", what));
    default:
      break;
  }
  if (is_retryable_status(response.status, e.code)) {
    return Error(e.code == "RequestTimeout" ? ErrorCode::kTimeout : ErrorCode::kUnavailable, what,
                 /*retryable=*/true);
  }
  if (response.status >= 400 && response.status < 500) {
    return Error(ErrorCode::kInvalidArgument, what);
  }
  return Error(ErrorCode::kIO, what);
}

HttpResponse S3Client::call(const std::string& bucket, const S3Request& request) {
  std::string host, path;
  HttpRequest http;
  http.method = request.method;
  http.url = url_for(bucket, request, host, path);
  http.body = request.body;
  http.body_source = request.body_source;
  http.body_source_size = request.body_source_size;
  http.response_buffer = request.response_buffer;
  http.timeout = options_.request_timeout;
  std::string payload =
      request.sign_body ? sha256_hex(request.body) : std::string("UNSIGNED-PAYLOAD");

  const auto start = std::chrono::steady_clock::now();
  bool refreshed = false;
  for (int attempt = 1;; ++attempt) {
    Credentials credentials = credentials_->get();
    SigningRequest to_sign;
    to_sign.method = request.method;
    to_sign.path = path;
    to_sign.query = request.query;
    to_sign.headers = request.headers;
    to_sign.headers.emplace_back("host", host);
    to_sign.payload_sha256 = payload;
    http.headers = request.headers;
    for (auto& h : sign_request(to_sign, credentials, settings_.region, "s3", now_())) {
      http.headers.push_back(std::move(h));
    }

    auto elapsed = [&] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - start);
    };
    auto retry_after = [&](std::string_view why) {
      RetryPolicy policy = options_.retry;
      if (request.max_attempts > 0) policy.max_attempts = request.max_attempts;
      auto delay = backoff_delay(policy, attempt, uniform());
      if (!should_retry(policy, attempt, elapsed(), delay)) return false;
      log::debug(fmt::format("{}: {} attempt {} failed ({}), retrying in {} ms",
                             object_uri(bucket, request.named()), request.method, attempt, why,
                             delay.count()));
      std::this_thread::sleep_for(delay);
      return true;
    };

    HttpResponse response;
    try {
      response = http_->send(http);
    } catch (const Error& e) {
      if (e.retryable() && retry_after(e.what())) continue;
      throw Error(e.code(),
                  fmt::format("{}: {}{}", object_uri(bucket, request.named()), e.what(),
                              attempt > 1 ? fmt::format(" ({} attempts)", attempt) : ""),
                  e.retryable());
    }
    int status = response.status;
    if ((status >= 200 && status < 300) ||
        std::find(request.accept.begin(), request.accept.end(), status) != request.accept.end()) {
      return response;
    }
    S3ErrorBody body = parse_error_body(response.body);
    // S3 answers a HEAD without a body, so an expired token shows there only as
    // a bare 400 or 403: with temporary credentials, that too is worth one
    // refresh and a repeat (a real denial fails again, and is reported).
    const bool bare_head_denial = request.method == "HEAD" && body.code.empty() &&
                                  (status == 400 || status == 403) &&
                                  (!credentials.session_token.empty() || credentials.expiration);
    if ((is_token_expiry(body.code) || bare_head_denial) && !refreshed) {
      refreshed = true;
      credentials_->refresh();
      continue;
    }
    if (is_retryable_status(status, body.code) && retry_after(body.code)) continue;
    throw error_for(bucket, request, response, attempt);
  }
}

}  // namespace cairn::s3
