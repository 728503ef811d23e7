// The libcurl HTTP client: a pool of easy handles, each keeping its own
// keep-alive connection, handed to one request at a time.
#include "storage/s3/http.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstring>
#include <exception>
#include <mutex>

#include <curl/curl.h>
#include <fmt/format.h>
#include <unistd.h>

#include "cairn/error.h"
#include "util/fork_safe.h"

namespace cairn::s3 {

std::optional<std::string> HttpResponse::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k.size() == name.size() && std::equal(k.begin(), k.end(), name.begin(), [](char a, char b) {
          return std::tolower(a) == std::tolower(b);
        })) {
      return v;
    }
  }
  return std::nullopt;
}

namespace {

std::atomic<uint64_t> g_requests_sent{0};

// Request bodies up to this size are sent with the headers (libcurl's limit
// for doing so is 64 KiB).
constexpr size_t kInlineBody = 60 * 1024;

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
      throw Error(ErrorCode::kInternal, "libcurl: global initialisation failed");
    }
  });
}

struct Transfer {
  const HttpRequest* request = nullptr;
  HttpResponse* response = nullptr;
  CURL* handle = nullptr;
  uint64_t sent = 0;                // request body bytes handed to curl
  bool overflow = false;            // the response body did not fit response_buffer
  std::exception_ptr source_error;  // what body_source threw

  uint64_t body_size() const {
    return request->body_source ? request->body_source_size : request->body.size();
  }
};

size_t on_read(char* out, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = static_cast<size_t>(std::min<uint64_t>(size * count, t->body_size() - t->sent));
  if (t->request->body_source) {
    try {
      t->request->body_source(t->sent, std::span<std::byte>(reinterpret_cast<std::byte*>(out), n));
    } catch (...) {
      t->source_error = std::current_exception();
      return CURL_READFUNC_ABORT;
    }
  } else {
    std::memcpy(out, t->request->body.data() + t->sent, n);
  }
  t->sent += n;
  return n;
}

int on_seek(void* user, curl_off_t offset, int origin) {
  auto* t = static_cast<Transfer*>(user);
  if (origin != SEEK_SET || offset < 0 || static_cast<uint64_t>(offset) > t->body_size()) {
    return CURL_SEEKFUNC_CANTSEEK;
  }
  t->sent = static_cast<uint64_t>(offset);
  return CURL_SEEKFUNC_OK;
}

size_t on_header(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string_view line(data, size * count);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  if (line.starts_with("HTTP/")) {
    // A new status line (after "100 Continue" or a redirect): start over.
    t->response->headers.clear();
    return size * count;
  }
  size_t colon = line.find(':');
  if (colon == std::string_view::npos) return size * count;
  std::string name(line.substr(0, colon));
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  std::string_view value = line.substr(colon + 1);
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
  t->response->headers.emplace_back(std::move(name), std::string(value));
  return size * count;
}

size_t on_write(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t n = size * count;
  long status = 0;
  curl_easy_getinfo(t->handle, CURLINFO_RESPONSE_CODE, &status);
  std::span<std::byte> buffer = t->request->response_buffer;
  if (!buffer.empty() && status >= 200 && status < 300) {
    uint64_t at = t->response->body_bytes;
    if (at + n > buffer.size()) {
      t->overflow = true;
      return 0;  // aborts the transfer with CURLE_WRITE_ERROR
    }
    std::memcpy(buffer.data() + at, data, n);
  } else {
    t->response->body.append(data, n);
  }
  t->response->body_bytes += n;
  return n;
}

class CurlClient final : public HttpClient {
 public:
  explicit CurlClient(size_t max_connections) : max_connections_(max_connections) { global_init(); }
  ~CurlClient() override {
    for (CURL* h : idle_) curl_easy_cleanup(h);
  }

  HttpResponse send(const HttpRequest& request) override {
    g_requests_sent.fetch_add(1, std::memory_order_relaxed);
    CURL* h = take();
    HttpResponse response;
    try {
      perform(h, request, response);
    } catch (...) {
      give_back(h);
      throw;
    }
    give_back(h);
    return response;
  }

 private:
  CURL* take() {
    {
      std::lock_guard<ForkSafeMutex> g(mu_);
      if (owner_ != ::getpid()) {
        // A forked child inherited the parent's pooled connections: using
        // them would interleave both processes' requests on one socket, and
        // closing them could end the parent's TLS sessions. Abandon them.
        idle_.clear();
        owner_ = ::getpid();
      }
      if (!idle_.empty()) {
        CURL* h = idle_.back();
        idle_.pop_back();
        return h;
      }
    }
    CURL* h = curl_easy_init();
    if (h == nullptr) throw Error(ErrorCode::kInternal, "libcurl: cannot create a handle");
    return h;
  }

  void give_back(CURL* h) {
    std::lock_guard<ForkSafeMutex> g(mu_);
    if (owner_ == ::getpid() && idle_.size() < max_connections_) {
      idle_.push_back(h);
    } else {
      curl_easy_cleanup(h);
    }
  }

  static void perform(CURL* h, const HttpRequest& request, HttpResponse& response) {
    curl_easy_reset(h);  // keeps the connection cache
    Transfer t;
    t.request = &request;
    t.response = &response;
    t.handle = h;
    curl_slist* headers = nullptr;
    bool has_content_type = false;
    for (const auto& [k, v] : request.headers) {
      headers = curl_slist_append(headers, fmt::format("{}: {}", k, v).c_str());
      if (k.size() == 12 && strncasecmp(k.c_str(), "content-type", 12) == 0)
        has_content_type = true;
    }
    headers = curl_slist_append(headers, "Expect:");
    headers = curl_slist_append(headers, "Accept:");
    if (!has_content_type) headers = curl_slist_append(headers, "Content-Type:");
    std::unique_ptr<curl_slist, decltype(&curl_slist_free_all)> guard(headers,
                                                                      &curl_slist_free_all);

    curl_easy_setopt(h, CURLOPT_URL, request.url.c_str());
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(request.timeout.count()));
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(request.connect_timeout.count()));
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, static_cast<long>(request.low_speed_time.count()));
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, &on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
    // Responses are read as sent: no decompression, no redirects.
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);

    const std::string& m = request.method;
    if (m == "HEAD") {
      curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if ((m == "PUT" || m == "POST") && !request.body_source &&
               request.body.size() <= kInlineBody) {
      // Small bodies leave in the same send() as the headers: a client
      // killed mid-request then never leaves a server holding the headers of
      // a PUT without its body (which servers that write objects in place,
      // such as s3rver, store as an empty object).
      curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE,
                       static_cast<curl_off_t>(request.body.size()));
      curl_easy_setopt(h, CURLOPT_POSTFIELDS, request.body.data());
      curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, m.c_str());
    } else if (m == "PUT" || m == "POST") {
      curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
      curl_easy_setopt(h, CURLOPT_READFUNCTION, &on_read);
      curl_easy_setopt(h, CURLOPT_READDATA, &t);
      curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, &on_seek);
      curl_easy_setopt(h, CURLOPT_SEEKDATA, &t);
      curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(t.body_size()));
      if (m == "POST") curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "POST");
    } else if (m != "GET") {
      curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, m.c_str());
    }

    CURLcode rc = curl_easy_perform(h);
    if (t.source_error) std::rethrow_exception(t.source_error);
    if (t.overflow) {
      throw Error(ErrorCode::kCorruption,
                  fmt::format("{} {}: the response body is longer than the {} bytes expected", m,
                              request.url, request.response_buffer.size()));
    }
    if (rc != CURLE_OK) {
      ErrorCode code =
          rc == CURLE_OPERATION_TIMEDOUT ? ErrorCode::kTimeout : ErrorCode::kUnavailable;
      throw Error(code,
                  fmt::format("{} {}: {} (curl error {})", m, request.url, curl_easy_strerror(rc),
                              static_cast<int>(rc)),
                  /*retryable=*/true);
    }
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    response.status = static_cast<int>(status);
  }

  const size_t max_connections_;
  ForkSafeMutex mu_{50};      // a heartbeat or persister may hold it at a fork
  pid_t owner_ = ::getpid();  // the process whose connections idle_ holds
  std::vector<CURL*> idle_;
};

}  // namespace

uint64_t requests_sent() { return g_requests_sent.load(std::memory_order_relaxed); }

std::shared_ptr<HttpClient> make_http_client(size_t max_connections) {
  return std::make_shared<CurlClient>(max_connections);
}

}  // namespace cairn::s3
