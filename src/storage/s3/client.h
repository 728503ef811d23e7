// S3's REST operations on one endpoint: each call is addressed (path-style or
// virtual-hosted), signed with SigV4, sent, retried under the RetryPolicy
// when the failure is transient, and its failure mapped to a cairn::Error.
//
// Error mapping (every message names s3://bucket/key, the operation, the HTTP
// status, S3's error code and the request id):
//   404                      -> kNotFound (NoSuchBucket says the bucket is missing)
//   403                      -> kPermissionDenied
//   ExpiredToken & co.       -> credentials re-read once, the request repeated
//   5xx, SlowDown, timeouts,
//   connection resets        -> retried; then kUnavailable / kTimeout, retryable()
//   501, 405                 -> kFailedPrecondition (the server lacks the feature)
//   other 4xx                -> kInvalidArgument
//
// Thread-safety: every method may be called from many threads at once.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/error.h"
#include "storage/s3/aws_config.h"
#include "storage/s3/credentials.h"
#include "storage/s3/http.h"
#include "storage/s3/retry.h"

namespace cairn::s3 {

// S3's limits on multipart uploads: every part but the last at least 5 MiB,
// none above 5 GiB, at most 10,000 parts per object.
inline constexpr uint64_t kMinPartSize = 5ull << 20;
inline constexpr uint64_t kMaxPartSize = 5ull << 30;
inline constexpr uint64_t kMaxParts = 10000;
// The largest object one PUT may carry.
inline constexpr uint64_t kMaxPutSize = 5ull << 30;

// Tunables, from the environment by default (docs/s3.md). from_environment()
// refuses a part size outside S3's limits (kInvalidArgument naming
// CAIRN_S3_PART_SIZE), so a bad setting fails before any request;
// CAIRN_S3_MIN_PART_SIZE lowers the floor for servers configured to accept
// smaller parts (the tests' servers), never below 4 KiB.
struct S3Options {
  uint64_t part_size = 16ull << 20;  // CAIRN_S3_PART_SIZE: multipart part and ranged-GET size
  int concurrency = 8;               // CAIRN_S3_CONCURRENCY: parallel parts / ranges per object
  // CAIRN_S3_UPLOAD_CUTOFF: the largest object Storage::put_stream() sends in
  // one PUT, streamed from its source; larger ones go as multipart uploads
  // of part_size parts. 0: every object above part_size is a multipart upload.
  uint64_t upload_cutoff = 200ull << 20;
  std::chrono::seconds lock_ttl{30};  // CAIRN_S3_LOCK_TTL: lease lifetime without heartbeat
  RetryPolicy retry;                  // CAIRN_S3_MAX_ATTEMPTS sets retry.max_attempts
  // CAIRN_S3_CONDITIONAL_WRITES=off: take leases without If-Match /
  // If-None-Match, for servers that accept those headers and ignore them
  // (docs/s3.md, "The experiment lock"). On (the default), a server that
  // refuses them is detected and the same fallback is used.
  bool conditional_writes = true;
  // CAIRN_S3_TORN_WRITES=on: the server can keep an interrupted PUT's
  // partial body (S3 and radosgw never do): StorageCapabilities::torn_writes,
  // so that an unreadable manifest no history lists is a leftover there.
  bool torn_writes = false;
  // CAIRN_S3_PREFIXES: the number of key prefixes objects are spread over
  // (key_spread.h; docs/s3.md, "Many ranks"). 1 stores keys as they are.
  // Every process that uses a bucket must use the same number.
  uint32_t prefixes = 1;
  std::chrono::milliseconds request_timeout{std::chrono::minutes(5)};
  static S3Options from_environment(const AwsEnvironment& env);
};

struct S3Request {
  std::string method = "GET";
  std::string key;  // object key in the bucket; empty for bucket-level calls
  // The key errors and logs name, where the caller knows the object by
  // another name than `key` (its stored name: key_spread.h); empty: `key`.
  std::string shown_key;
  const std::string& named() const { return shown_key.empty() ? key : shown_key; }
  std::vector<std::pair<std::string, std::string>> query;  // raw names and values
  Headers headers;
  std::span<const std::byte> body;
  // A body read as it is sent (HttpRequest::body_source), for objects too
  // large to hold in memory; every try reads it again from offset 0. Never
  // signed (UNSIGNED-PAYLOAD): give it a Content-MD5 header.
  std::function<void(uint64_t offset, std::span<std::byte> out)> body_source;
  uint64_t body_source_size = 0;
  bool sign_body = false;  // sign the body's SHA-256 (small XML bodies) or send UNSIGNED-PAYLOAD
  std::span<std::byte> response_buffer;
  // Statuses returned to the caller instead of thrown (e.g. 404 for stat).
  std::vector<int> accept;
  // Tries for this request, the first included; 0: the client's RetryPolicy.
  int max_attempts = 0;
};

class S3Client {
 public:
  S3Client(S3Settings settings, std::shared_ptr<CredentialsProvider> credentials,
           std::shared_ptr<HttpClient> http, S3Options options,
           std::function<std::chrono::system_clock::time_point()> now = nullptr);

  const S3Settings& settings() const { return settings_; }
  const S3Options& options() const { return options_; }

  // Sends `request` to `bucket`, retrying transient failures. Returns the
  // response when its status is 2xx or listed in request.accept.
  HttpResponse call(const std::string& bucket, const S3Request& request);

  // The error for a failed response, for callers that accepted a status and
  // then decided it is a failure after all.
  Error error_for(const std::string& bucket, const S3Request& request, const HttpResponse& response,
                  int attempts) const;

  // s3://bucket/key, for messages.
  static std::string object_uri(std::string_view bucket, std::string_view key);

 private:
  std::string url_for(const std::string& bucket, const S3Request& request, std::string& host,
                      std::string& path) const;
  double uniform();

  S3Settings settings_;
  std::shared_ptr<CredentialsProvider> credentials_;
  std::shared_ptr<HttpClient> http_;
  S3Options options_;
  std::function<std::chrono::system_clock::time_point()> now_;
  std::string scheme_;
  std::string endpoint_host_;  // host[:port] of the endpoint
  std::mutex rng_mu_;
  std::mt19937_64 rng_;
};

}  // namespace cairn::s3
