#include "util/json.h"

#include <gtest/gtest.h>

#include <string>

#include "cairn/error.h"
#include "support/errors.h"

namespace cairn::testing {
namespace {

using nlohmann::json;

std::string nested(size_t depth, char open = '[', char close = ']') {
  return std::string(depth, open) + std::string(depth, close);
}

TEST(ParseJson, ParsesWhatNlohmannParses) {
  json j = parse_json(R"({"a": [1, {"b": "x]}"}], "c": null})", "src");
  EXPECT_EQ(j["a"][1]["b"], "x]}");
}

TEST(ParseJson, DeepNestingIsCorruptionNamingTheSourceAndOffset) {
  std::string msg = error_message_of([] { (void)parse_json(nested(100000), "file:///m.json"); },
                                     ErrorCode::kCorruption);
  EXPECT_NE(msg.find("file:///m.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("byte offset 128"), std::string::npos) << msg;
  EXPECT_NO_THROW((void)parse_json(nested(128), "x"));
  error_message_of([] { (void)parse_json(nested(129, '{', '}'), "x"); }, ErrorCode::kCorruption);
}

TEST(ParseJson, BracketsInsideStringsDoNotCount) {
  std::string text = "[\"" + std::string(1000, '[') + "\\\"" + std::string(1000, '{') + "\"]";
  EXPECT_NO_THROW((void)parse_json(text, "x"));
}

TEST(ParseJson, ANulByteAnywhereIsCorruptionNamingItsOffset) {
  std::string text = std::string("{}") + '\0' + "garbage";
  std::string msg = error_message_of([&] { (void)parse_json(text, "x"); }, ErrorCode::kCorruption);
  EXPECT_NE(msg.find("NUL byte at byte offset 2"), std::string::npos) << msg;
  std::string in_string = std::string("{\"a\":\"b") + '\0' + "\"}";
  error_message_of([&] { (void)parse_json(in_string, "x"); }, ErrorCode::kCorruption);
}

TEST(ParseJson, SizeAndSyntaxErrorsAreCorruption) {
  error_message_of(
      [] { (void)parse_json("[1,2,3]", "x", JsonLimits{.max_depth = 8, .max_bytes = 4}); },
      ErrorCode::kCorruption);
  std::string msg =
      error_message_of([] { (void)parse_json("{\"a\": tru}", "x"); }, ErrorCode::kCorruption);
  EXPECT_NE(msg.find("byte offset"), std::string::npos) << msg;
  error_message_of([] { (void)parse_json("\"\xff\"", "x"); }, ErrorCode::kCorruption);
}

TEST(CheckStorableJson, RefusesDeepDocumentsAndInvalidUtf8) {
  json deep = 1;
  for (int i = 0; i < 1000; ++i) deep = json::array({std::move(deep)});
  std::string msg =
      error_message_of([&] { check_storable_json(deep, "metrics"); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("metrics"), std::string::npos) << msg;
  error_message_of([] { check_storable_json({{"k", "\xc3"}}, "m"); }, ErrorCode::kInvalidArgument);
  error_message_of([] { check_storable_json({{"\xff", 1}}, "m"); }, ErrorCode::kInvalidArgument);
  EXPECT_NO_THROW(check_storable_json({{"caf\xc3\xa9", {1, 2, "\xe2\x82\xac"}}}, "m"));
}

TEST(Utf8, ValidatesLikeTheStandard) {
  EXPECT_TRUE(is_valid_utf8(""));
  EXPECT_TRUE(is_valid_utf8("plain"));
  EXPECT_TRUE(is_valid_utf8("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("\xff"));
  EXPECT_FALSE(is_valid_utf8("\xc3"));              // truncated
  EXPECT_FALSE(is_valid_utf8("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(is_valid_utf8("\xed\xa0\x80"));      // surrogate
  EXPECT_FALSE(is_valid_utf8("\xf4\x90\x80\x80"));  // past U+10FFFF
}

TEST(Utf8, PrintableEscapesOnlyTheInvalidBytes) {
  EXPECT_EQ(printable("caf\xe9.bin"), "caf\\xe9.bin");
  EXPECT_EQ(printable("caf\xc3\xa9"), "caf\xc3\xa9");
  EXPECT_EQ(printable("\xc3"), "\\xc3");
}

}  // namespace
}  // namespace cairn::testing
