// Test support: run a call that must throw cairn::Error with a given code.
#pragma once

#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "cairn/error.h"

namespace cairn::testing {

// Runs `fn`, expects a cairn::Error with code `want` (a test failure
// otherwise) and returns its message, for checks of what it names.
inline std::string error_message_of(const std::function<void()>& fn, ErrorCode want) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), want) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

// The code of the cairn::Error `fn` throws (a test failure if it throws none).
inline ErrorCode code_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.code();
  }
  ADD_FAILURE() << "no error thrown";
  return ErrorCode::kInternal;
}

// Runs `fn` and expects a cairn::Error with code `want` whose message holds
// `words` (what the error must name).
inline void expect_error_naming(ErrorCode want, const std::string& words,
                                const std::function<void()>& fn) {
  const std::string message = error_message_of(fn, want);
  EXPECT_NE(message.find(words), std::string::npos)
      << "expected an error naming \"" << words << "\", got: " << message;
}

// The same for kInvalidArgument, the error of a bad option or argument.
inline void expect_invalid_argument(const std::function<void()>& fn, const std::string& words) {
  expect_error_naming(ErrorCode::kInvalidArgument, words, fn);
}

}  // namespace cairn::testing
