// The plain-form scanner of safetensors headers: it reads what the known
// writers emit, leaves every other text to the general parser, and never
// changes a verdict or a message (parse_header with and without it agree on
// generated headers, valid and broken).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cairn/error.h"
#include "cairn/safetensors.h"
#include "engine/header_scan.h"

namespace cairn::testing {
namespace {

using format::parse_header_general;
using format::scan_plain_header;

// The outcome of a parse: the header, or the error's code and message.
struct Outcome {
  std::optional<SafetensorsHeader> header;
  std::string error;
};

template <class Parse>
Outcome outcome_of(Parse parse) {
  Outcome o;
  try {
    o.header = parse();
  } catch (const Error& e) {
    o.error = fmt::format("{}: {}", static_cast<int>(e.code()), e.what());
  }
  return o;
}

void expect_same(const Outcome& a, const Outcome& b, const std::string& text) {
  ASSERT_EQ(a.header.has_value(), b.header.has_value()) << text << "\n"
                                                        << a.error << "\n"
                                                        << b.error;
  EXPECT_EQ(a.error, b.error) << text;
  if (!a.header) return;
  const SafetensorsHeader &x = *a.header, &y = *b.header;
  EXPECT_EQ(x.metadata, y.metadata) << text;
  EXPECT_EQ(x.header_size, y.header_size) << text;
  EXPECT_EQ(x.data_size, y.data_size) << text;
  EXPECT_EQ(x.by_name, y.by_name) << text;
  ASSERT_EQ(x.tensors.size(), y.tensors.size()) << text;
  for (size_t i = 0; i < x.tensors.size(); ++i) {
    const TensorInfo &s = x.tensors[i], &t = y.tensors[i];
    EXPECT_EQ(s.name, t.name) << text;
    EXPECT_EQ(s.dtype, t.dtype) << text;
    EXPECT_EQ(s.shape, t.shape) << text;
    EXPECT_EQ(s.begin, t.begin) << text;
    EXPECT_EQ(s.end, t.end) << text;
  }
}

// Parses `text` as the header of a file with `data` bytes after it, with the
// scanner and without, and expects the same outcome. Returns whether the
// scanner read the text itself.
bool parse_both_ways(const std::string& text, uint64_t data) {
  const uint64_t file_size = 8 + text.size() + data;
  const Outcome fast = outcome_of([&] { return parse_header(text, file_size, "h.st"); });
  const Outcome general = outcome_of([&] { return parse_header_general(text, file_size, "h.st"); });
  expect_same(fast, general, text);
  return scan_plain_header(text).has_value();
}

TEST(ScanPlainHeader, ReadsTheHeadersKnownWritersEmit) {
  // Cairn's own layout, metadata first.
  FileLayout cairn = layout_file({{"b", DType::kF32, {2, 3}}, {"a", DType::kU8, {5}}},
                                 {{"format", "pt"}, {"step", "7"}});
  const std::string cairn_text = cairn.header.substr(8);
  auto read = scan_plain_header(cairn_text);
  ASSERT_TRUE(read);
  ASSERT_EQ(read->tensors.size(), 2u);
  EXPECT_EQ(read->tensors[0].name, "b");
  EXPECT_EQ(read->tensors[0].shape, (Shape{2, 3}));
  EXPECT_EQ(read->tensors[1].end, 29u);
  EXPECT_EQ(read->metadata.at("format"), "pt");
  EXPECT_TRUE(parse_both_ways(cairn_text, cairn.parsed.data_size));

  // The reference Python writer: compact, padded with spaces, any key order;
  // a scalar's shape is [], names may be UTF-8.
  const std::string python =
      R"({"__metadata__":{"format":"pt"},"w\u00e9":{"dtype":"F16","shape":[],"data_offsets":[0,2]}})";
  EXPECT_FALSE(scan_plain_header(python)) << "an escape is the general parser's";
  const std::string utf8 =
      "{\"__metadata__\":{\"format\":\"pt\"},\"w\xc3\xa9\":{\"shape\":[],\"dtype\":\"F16\","
      "\"data_offsets\":[0,2]}}        ";
  EXPECT_TRUE(parse_both_ways(utf8, 2));
  // Pretty-printed, with every kind of JSON whitespace.
  const std::string pretty =
      "{\r\n\t\"x\" : { \"data_offsets\" : [ 0 , 8 ] ,\n \"dtype\" : \"I64\" , \"shape\" : "
      "[ 1 ] } ,\n \"__metadata__\" : { } \n}\n";
  EXPECT_TRUE(parse_both_ways(pretty, 8));
  EXPECT_TRUE(parse_both_ways("{}", 0));
  EXPECT_TRUE(parse_both_ways(R"({"__metadata__":{}})", 0));
}

TEST(ScanPlainHeader, LeavesEveryOtherTextToTheGeneralParser) {
  const std::string entry = R"("dtype":"U8","shape":[2],"data_offsets":[0,2])";
  const std::vector<std::string> others = {
      // Escapes, control characters, broken UTF-8.
      R"({"a\"b":{)" + entry + "}}",
      R"({"a":{"dtype":"U\u0038","shape":[2],"data_offsets":[0,2]}})",
      "{\"a\tb\":{" + entry + "}}",
      "{\"a\xff\":{" + entry + "}}",
      "{\"a\xc0\xaf\":{" + entry + "}}",
      std::string("{\"a\0\":{", 7) + entry + "}}",
      "{\"a\":{" + entry + std::string("}}\0", 3),
      // Numbers that are not sizes in the plain form.
      R"({"a":{"dtype":"U8","shape":[02],"data_offsets":[0,2]}})",
      R"({"a":{"dtype":"U8","shape":[2.0],"data_offsets":[0,2]}})",
      R"({"a":{"dtype":"U8","shape":[2e0],"data_offsets":[0,2]}})",
      R"({"a":{"dtype":"U8","shape":[-2],"data_offsets":[0,2]}})",
      R"({"a":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,2]}})",
      R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2,4]}})",
      R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0]}})",
      // Entries that are wrong or not entries.
      R"({"a":{"dtype":"U9","shape":[2],"data_offsets":[0,2]}})",
      R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[0,2]}})",
      R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[2,0]}})",
      R"({"a":{"dtype":"U8","shape":[2]}})",
      R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":1}})",
      R"({"a":{"dtype":"U8","dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
      R"({"a":{}})",
      R"({"a":[]})",
      R"({"a":null})",
      R"({"a":{"dtype":"U8","shape":[[2]],"data_offsets":[0,2]}})",
      // Metadata that is not an object of strings, or repeats a key.
      R"({"__metadata__":{"k":1}})",
      R"({"__metadata__":{"k":"v","k":"w"}})",
      R"({"__metadata__":{},"__metadata__":{}})",
      R"({"__metadata__":"v"})",
      // Not JSON, or more than one value.
      R"({"a":{)" + entry + "}",
      R"({"a":{)" + entry + "},}",
      R"({"a":{)" + entry + "}} x",
      R"({"a":{)" + entry + "}}{}",
      "{",
      "",
  };
  for (const auto& text : others) {
    EXPECT_FALSE(scan_plain_header(text)) << text;
    parse_both_ways(text, 2);
  }
}

TEST(ScanPlainHeader, RepeatedTensorNamesAreRefusedWhicheverParserReadsThem) {
  const std::string text = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                           R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  EXPECT_TRUE(scan_plain_header(text));
  parse_both_ways(text, 2);
  try {
    parse_header(text, 8 + text.size() + 2, "h.st");
    FAIL() << "a repeated name was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruption);
    EXPECT_NE(std::string(e.what()).find("duplicate key \"a\""), std::string::npos) << e.what();
  }
}

// A random header: a few tensors (some zero-sized, names with spaces, UTF-8
// or escapes), metadata anywhere, keys in any order, random whitespace, and
// now and then one change that breaks it or moves it out of the plain form.
std::string random_header(std::mt19937_64& rng, uint64_t& data) {
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  auto ws = [&] {
    static const char* kSpaces[] = {"", "", "", " ", "\n", "\t", "\r\n  "};
    return std::string(kSpaces[pick(7)]);
  };
  static const char* kNames[] = {"w",     "layer.0.weight", "b",   "w\xc3\xa9",  "a b",
                                 "q\\\"", "x\\u0041",       "emb", "layer.10.w", ""};
  static const char* kDTypes[] = {"F32", "U8", "BF16", "I64", "BOOL", "F8_E4M3"};
  static const size_t kSizes[] = {4, 1, 2, 8, 1, 1};
  const size_t count = pick(5);
  std::vector<std::string> members;
  data = 0;
  for (size_t i = 0; i < count; ++i) {
    const size_t d = pick(6);
    std::vector<uint64_t> shape(pick(3));
    uint64_t bytes = kSizes[d];
    for (auto& s : shape) bytes *= (s = pick(4));
    std::vector<std::string> fields = {
        fmt::format("\"dtype\"{}:{}\"{}\"", ws(), ws(), kDTypes[d]),
        fmt::format("\"shape\"{}:{}[{}]", ws(), ws(), fmt::join(shape, fmt::format(",{}", ws()))),
        fmt::format("\"data_offsets\"{}:{}[{},{}{}]", ws(), ws(), data, ws(), data + bytes)};
    std::shuffle(fields.begin(), fields.end(), rng);
    data += bytes;
    members.push_back(fmt::format("\"{}{}\"{}:{}{{{}{}}}", kNames[pick(10)], i, ws(), ws(),
                                  fmt::join(fields, fmt::format("{},{}", ws(), ws())), ws()));
  }
  if (pick(2) == 0) {
    members.insert(members.begin() + static_cast<long>(pick(members.size() + 1)),
                   fmt::format("\"__metadata__\"{}:{}{{\"format\":{}\"pt\"{}}}", ws(), ws(), ws(),
                               pick(2) ? ",\"step\":\"3\"" : ""));
  }
  std::string text = fmt::format("{{{}{}{}}}{}", ws(), fmt::join(members, ","), ws(), ws());
  if (pick(3) == 0 && !text.empty()) {
    static const char* kJunk[] = {"\"", "{",   "}",  "[",    "]",    ",",         ":",        "0",
                                  "-",  "1.5", "\\", "\x01", "\xff", "\"dtype\"", "\"shape\""};
    const size_t at = pick(text.size());
    if (pick(2) == 0) {
      text.insert(at, kJunk[pick(15)]);
    } else {
      text.erase(at, 1 + pick(3));
    }
  }
  return text;
}

TEST(ScanPlainHeader, ParsingWithAndWithoutTheScannerAgreesOnGeneratedHeaders) {
  std::mt19937_64 rng(20261124);
  size_t scanned = 0, total = 5000;
  for (size_t i = 0; i < total; ++i) {
    uint64_t data = 0;
    const std::string text = random_header(rng, data);
    if (parse_both_ways(text, data)) ++scanned;
    if (::testing::Test::HasFailure()) return;
  }
  // Both paths were exercised.
  EXPECT_GT(scanned, total / 4);
  EXPECT_LT(scanned, total * 9 / 10);
}

}  // namespace
}  // namespace cairn::testing
