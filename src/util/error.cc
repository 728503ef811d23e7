#include "cairn/error.h"

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace cairn {

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid_argument";
    case ErrorCode::kNotFound:
      return "not_found";
    case ErrorCode::kAlreadyExists:
      return "already_exists";
    case ErrorCode::kCorruption:
      return "corruption";
    case ErrorCode::kPermissionDenied:
      return "permission_denied";
    case ErrorCode::kNoSpace:
      return "no_space";
    case ErrorCode::kIO:
      return "io";
    case ErrorCode::kLocked:
      return "locked";
    case ErrorCode::kTimeout:
      return "timeout";
    case ErrorCode::kUnavailable:
      return "unavailable";
    case ErrorCode::kFailedPrecondition:
      return "failed_precondition";
    case ErrorCode::kInternal:
      return "internal";
  }
  return "unknown";
}

Error::Error(ErrorCode code, std::string message, bool retryable)
    : std::runtime_error(std::move(message)), code_(code), retryable_(retryable) {}

Error with_context(const Error& e, std::string_view context) {
  return Error(e.code(), fmt::format("{}: {}", context, e.what()), e.retryable());
}

Error errno_error(int err, std::string_view op, std::string_view subject) {
  ErrorCode code = ErrorCode::kIO;
  bool retryable = false;
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      code = ErrorCode::kNoSpace;
      break;
    case EACCES:
    case EPERM:
    case EROFS:
      code = ErrorCode::kPermissionDenied;
      break;
    case ENOENT:
    case ENOTDIR:
      code = ErrorCode::kNotFound;
      break;
    case EEXIST:
      code = ErrorCode::kAlreadyExists;
      break;
    case EINTR:
    case EAGAIN:
      retryable = true;
      break;
    default:
      break;
  }
  return Error(code, fmt::format("{} {}: {}", op, subject, std::strerror(err)), retryable);
}

}  // namespace cairn
