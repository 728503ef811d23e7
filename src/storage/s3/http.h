// A minimal HTTP/1.1 client for the S3 backend and the credential providers,
// over libcurl. One HttpClient keeps a pool of connections (keep-alive, reused
// across requests and threads); it sends exactly one request per send() call
// and never retries: retry policy belongs to the caller (s3/retry.h), which
// knows which operations are idempotent.
//
// Thread-safety: send() may be called from many threads at once.
// Failure: a transport failure (DNS, connection refused or reset, timeout,
// a body cut short) throws cairn::Error naming the method and URL: kTimeout
// for timeouts, kUnavailable otherwise, both retryable(). An HTTP error status
// is not a transport failure: the response is returned for the caller to map.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cairn::s3 {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method = "GET";  // GET, PUT, POST, DELETE, HEAD
  // The whole URL, path and query already percent-encoded:
  // "http://127.0.0.1:9000/bucket/a%20b?uploadId=x&partNumber=1".
  std::string url;
  // Sent as given. Content-Length is added for bodies; libcurl's own defaults
  // ("Expect: 100-continue", "Accept: */*") are suppressed.
  Headers headers;
  // The request body (PUT, POST); must outlive send().
  std::span<const std::byte> body;
  // Or, when set, a body of `body_source_size` bytes read as it is sent:
  // body_source(offset, out) fills `out` with the bytes at `offset`, front to
  // back (a send() that libcurl rewinds starts again at an earlier offset).
  // What it throws ends the request and is rethrown by send() unchanged.
  std::function<void(uint64_t offset, std::span<std::byte> out)> body_source;
  uint64_t body_source_size = 0;
  // When non-empty, a successful (2xx) response body is written here instead
  // of into HttpResponse::body; a body longer than the buffer is an error.
  std::span<std::byte> response_buffer;
  // The whole request, connection included, must finish within `timeout`;
  // transfers slower than 1 KiB/s for `low_speed_time` are cut off too.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(10)};
  std::chrono::seconds low_speed_time{60};
};

struct HttpResponse {
  int status = 0;
  Headers headers;          // names lowercased, in the order received
  std::string body;         // empty when the body went to response_buffer
  uint64_t body_bytes = 0;  // bytes received, wherever they went
  // The value of the first header named `name` (case-insensitive).
  std::optional<std::string> header(std::string_view name) const;
};

// Requests sent by this process through every HttpClient (send() calls,
// whatever their outcome): benchmarks count storage requests with it.
uint64_t requests_sent();

class HttpClient {
 public:
  virtual ~HttpClient() = default;
  virtual HttpResponse send(const HttpRequest& request) = 0;
};

// The libcurl client. `max_connections` bounds the pooled connections.
std::shared_ptr<HttpClient> make_http_client(size_t max_connections = 64);

}  // namespace cairn::s3
