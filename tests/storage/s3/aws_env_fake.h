// Test support for the AWS configuration and credentials tests: an
// AwsEnvironment over a map of variables, a clock the test moves, and a
// scripted HttpClient that records what it was sent.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cairn/error.h"
#include "storage/s3/aws_config.h"
#include "storage/s3/http.h"

namespace cairn::s3::testing {

// Answers requests with a handler the test sets; keeps every request.
class FakeHttp : public HttpClient {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  HttpResponse send(const HttpRequest& request) override {
    Handler h;
    {
      std::lock_guard lock(mu_);
      requests_.push_back(request);
      h = handler_;
    }
    if (!h) {
      throw Error(ErrorCode::kUnavailable,
                  fmt::format("{} {}: connection refused", request.method, request.url), true);
    }
    return h(request);
  }

  void set_handler(Handler h) {
    std::lock_guard lock(mu_);
    handler_ = std::move(h);
  }
  std::vector<HttpRequest> requests() const {
    std::lock_guard lock(mu_);
    return requests_;
  }
  size_t count() const {
    std::lock_guard lock(mu_);
    return requests_.size();
  }

 private:
  mutable std::mutex mu_;
  Handler handler_;
  std::vector<HttpRequest> requests_;
};

inline HttpResponse respond(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  r.body_bytes = r.body.size();
  return r;
}

// The value of the first header named `name` (case-insensitive) in `h`.
inline std::optional<std::string> header_of(const Headers& h, std::string_view name) {
  auto lower = [](std::string_view s) {
    std::string out(s);
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
  };
  for (const auto& [n, v] : h) {
    if (lower(n) == lower(name)) return v;
  }
  return std::nullopt;
}

struct FakeWorld {
  std::map<std::string, std::string> vars;
  std::chrono::system_clock::time_point now =
      std::chrono::system_clock::from_time_t(1795000000);  // 2026-11-18
  std::shared_ptr<FakeHttp> http = std::make_shared<FakeHttp>();
  std::function<std::string(const std::string&)> process = [](const std::string& c) -> std::string {
    throw Error(ErrorCode::kFailedPrecondition, "unexpected credential_process " + c);
  };
  mutable std::mutex mu;  // guards `now` for the threaded tests

  AwsEnvironment env() {
    AwsEnvironment e;
    e.getenv = [this](std::string_view name) -> std::optional<std::string> {
      const auto it = vars.find(std::string(name));
      if (it == vars.end()) return std::nullopt;
      return it->second;
    };
    e.now = [this] {
      std::lock_guard lock(mu);
      return now;
    };
    e.http = http;
    e.run_process = [this](const std::string& command) { return process(command); };
    return e;
  }

  void advance(std::chrono::seconds d) {
    std::lock_guard lock(mu);
    now += d;
  }
};

}  // namespace cairn::s3::testing
