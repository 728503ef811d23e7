#include "storage/s3/retry.h"

#include <algorithm>
#include <array>

namespace cairn::s3 {

std::chrono::milliseconds backoff_delay(const RetryPolicy& policy, int retry, double uniform01) {
  double ceiling = static_cast<double>(policy.base.count());
  for (int i = 1; i < retry && ceiling < static_cast<double>(policy.cap.count()); ++i) ceiling *= 2;
  ceiling = std::min(ceiling, static_cast<double>(policy.cap.count()));
  uniform01 = std::clamp(uniform01, 0.0, 1.0);
  return std::chrono::milliseconds(static_cast<long long>(ceiling * uniform01));
}

bool should_retry(const RetryPolicy& policy, int attempt, std::chrono::milliseconds elapsed,
                  std::chrono::milliseconds next_delay) {
  return attempt < policy.max_attempts && elapsed + next_delay < policy.budget;
}

bool is_retryable_status(int status, std::string_view code) {
  if (status == 500 || status == 502 || status == 503 || status == 504) return true;
  static constexpr std::array<std::string_view, 7> kCodes = {
      "RequestTimeout",       "SlowDown",      "Throttling",        "ThrottlingException",
      "RequestLimitExceeded", "InternalError", "ServiceUnavailable"};
  return std::find(kCodes.begin(), kCodes.end(), code) != kCodes.end();
}

}  // namespace cairn::s3
