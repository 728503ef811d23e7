// When and how long the S3 backend waits before repeating a failed request:
// exponential backoff with full jitter ("Exponential Backoff And Jitter",
// the AWS SDKs' standard mode), bounded by attempts and by a time budget.
// Pure: randomness and time are the caller's.
#pragma once

#include <chrono>
#include <string_view>

namespace cairn::s3 {

struct RetryPolicy {
  int max_attempts = 8;  // the first try included
  std::chrono::milliseconds base{100};
  std::chrono::milliseconds cap{10'000};
  // No new attempt starts once this much time has passed since the first.
  std::chrono::milliseconds budget{std::chrono::minutes(3)};
};

// The wait before retry number `retry` (1 = the first retry): uniform in
// [0, min(cap, base * 2^(retry-1))], `uniform01` being a uniform draw in [0, 1).
std::chrono::milliseconds backoff_delay(const RetryPolicy& policy, int retry, double uniform01);

// Whether to try again after attempt number `attempt` (1-based) failed
// retryably, `elapsed` after the first started, given the next wait.
bool should_retry(const RetryPolicy& policy, int attempt, std::chrono::milliseconds elapsed,
                  std::chrono::milliseconds next_delay);

// Whether an HTTP status and S3 error code mean "the same request may succeed
// later": 500, 502, 503, 504, and the throttling and timeout codes S3 sends
// with 400 (RequestTimeout, SlowDown, Throttling, ...).
bool is_retryable_status(int status, std::string_view s3_code);

}  // namespace cairn::s3
