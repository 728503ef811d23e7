// Cairn's one error model.
//
// Every fallible operation in Cairn reports failure by throwing cairn::Error
// (or, for programming errors such as a null argument, std::logic_error).
// Nothing returns error codes, and no error is swallowed silently: where code
// deliberately ignores an error it says so with `// ignore-error:` and a reason,
// so such places are searchable.
//
// An Error carries:
//   - code():      what kind of failure, for programs (see ErrorCode);
//   - what():      one line for people, naming the thing at fault: the path,
//                  object key, rank, tensor or byte offset;
//   - retryable(): whether repeating the same call may succeed (transient I/O,
//                  a lock held by a live peer, a throttled object store).
//
// Errors raised while an outer operation is in progress are wrapped with
// context ("saving checkpoint_000004: writing model.bin: No space left on
// device") by with_context(), which keeps the code and retryability.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace cairn {

enum class ErrorCode {
  kInvalidArgument,     // the caller passed something unusable (bad option, bad URI)
  kNotFound,            // a file, object, checkpoint or key does not exist
  kAlreadyExists,       // a create-only operation found the target present
  kCorruption,          // stored data fails validation (checksum, size, parse, traversal)
  kPermissionDenied,    // the OS or object store refused access
  kNoSpace,             // the device or quota is full
  kIO,                  // any other I/O failure
  kLocked,              // another process holds the experiment's lock
  kTimeout,             // a peer or operation did not answer in time
  kUnavailable,         // a service is temporarily unavailable (5xx, throttling)
  kFailedPrecondition,  // the system is not in a state the call needs
  kInternal,            // a bug in Cairn
};

// A stable lowercase name for `code` ("not_found", "corruption", ...), used in
// CLI --json output and log lines.
std::string_view error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string message, bool retryable = false);

  ErrorCode code() const noexcept { return code_; }
  bool retryable() const noexcept { return retryable_; }

 private:
  ErrorCode code_;
  bool retryable_;
};

// Returns a copy of `e` whose message is "<context>: <e.what()>".
Error with_context(const Error& e, std::string_view context);

// Maps an errno value to an Error naming `subject` (usually a path) and the
// operation ("open", "fsync", ...). ENOSPC/EDQUOT -> kNoSpace, EACCES/EPERM/EROFS
// -> kPermissionDenied, ENOENT -> kNotFound, EEXIST -> kAlreadyExists,
// EINTR/EAGAIN -> retryable kIO.
Error errno_error(int err, std::string_view op, std::string_view subject);

}  // namespace cairn
