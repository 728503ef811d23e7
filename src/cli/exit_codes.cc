#include "cli/exit_codes.h"

namespace cairn::cli {

ExitCode exit_code_for(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return kExitUsage;
    case ErrorCode::kNotFound:
      return kExitNotFound;
    case ErrorCode::kCorruption:
      return kExitCorruption;
    case ErrorCode::kAlreadyExists:
      return kExitAlreadyExists;
    case ErrorCode::kPermissionDenied:
    case ErrorCode::kNoSpace:
    case ErrorCode::kIO:
    case ErrorCode::kLocked:
    case ErrorCode::kTimeout:
    case ErrorCode::kUnavailable:
    case ErrorCode::kFailedPrecondition:
    case ErrorCode::kInternal:
      return kExitOtherError;
  }
  return kExitOtherError;
}

}  // namespace cairn::cli
