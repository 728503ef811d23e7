// The safetensors header parser and layout: every malformed-file case is
// refused with kCorruption naming the source, the tensor and a byte offset.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstring>
#include <string>
#include <vector>

#include "cairn/error.h"
#include "cairn/safetensors.h"

namespace cairn::testing {
namespace {

// A file image: 8-byte little-endian length, `header` (padded with spaces
// to 8-byte alignment unless `pad` is false) and `data_bytes` zero bytes.
std::string image(const std::string& header, size_t data_bytes, bool pad = true) {
  std::string h = header;
  if (pad) h.resize((h.size() + 8 + 7) / 8 * 8 - 8, ' ');
  std::string out(8, '\0');
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + h + std::string(data_bytes, '\0');
}

std::span<const std::byte> bytes_of(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

SafetensorsHeader parse(const std::string& file) {
  return parse_file_header(bytes_of(file), "t.st");
}

// Parses `file`, expecting kCorruption whose message contains every needle.
void expect_corrupt(const std::string& file, std::initializer_list<std::string> needles) {
  try {
    parse(file);
    FAIL() << "parsed a malformed file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruption) << e.what();
    std::string msg = e.what();
    EXPECT_NE(msg.find("t.st"), std::string::npos) << msg;
    for (const auto& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "no '" << n << "' in: " << msg;
  }
}

TEST(DType, EveryFileNameRoundTripsWithItsElementSize) {
  const std::pair<const char*, size_t> names[] = {
      {"BOOL", 1}, {"U8", 1},   {"I8", 1},  {"I16", 2},     {"U16", 2},
      {"F16", 2},  {"BF16", 2}, {"I32", 4}, {"U32", 4},     {"F32", 4},
      {"F64", 8},  {"I64", 8},  {"U64", 8}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  for (const auto& [name, size] : names) {
    auto d = parse_dtype(name);
    ASSERT_TRUE(d) << name;
    EXPECT_EQ(dtype_name(*d), name);
    EXPECT_EQ(dtype_size(*d), size) << name;
  }
  EXPECT_FALSE(parse_dtype("F4"));
  EXPECT_FALSE(parse_dtype("f32"));
  EXPECT_EQ(dtype_of<float>(), DType::kF32);
  EXPECT_EQ(dtype_of<int64_t>(), DType::kI64);
}

TEST(Layout, ProducesAHeaderThatParsesBackToTheSameTensors) {
  FileLayout l =
      layout_file({{"w", DType::kF32, {2, 3}}, {"b", DType::kU8, {5}}, {"s", DType::kF64, {}}},
                  {{"format", "pt"}});
  std::string file = l.header + std::string(l.parsed.data_size, '\0');
  SafetensorsHeader h = parse(file);
  ASSERT_EQ(h.tensors.size(), 3u);
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.header_size, l.parsed.header_size);
  for (const auto& t : l.parsed.tensors) {
    const TensorInfo* p = h.find(t.name);
    ASSERT_NE(p, nullptr) << t.name;
    EXPECT_EQ(p->dtype, t.dtype);
    EXPECT_EQ(p->shape, t.shape);
    EXPECT_EQ(p->begin, t.begin);
    EXPECT_EQ(p->end, t.end);
  }
  EXPECT_EQ(h.data_size, 8u + 24u + 5u);
}

TEST(Layout, PadsTheHeaderWithSpacesToEightByteAlignment) {
  for (int n = 0; n < 9; ++n) {
    std::vector<TensorDescriptor> ts;
    for (int i = 0; i < n; ++i)
      ts.push_back({std::string(static_cast<size_t>(i + 1), 'x'), DType::kU8, {1}});
    FileLayout l = layout_file(ts, {});
    EXPECT_EQ(l.header.size() % 8, 0u);
    EXPECT_EQ(l.parsed.data_start() % 8, 0u);
    std::string json = l.header.substr(8);
    EXPECT_EQ(json.front(), '{');
    size_t end = json.find_last_not_of(' ');
    EXPECT_EQ(json[end], '}');
  }
}

TEST(Layout, AlignsEveryTensorToItsElementSize) {
  FileLayout l = layout_file({{"a", DType::kU8, {3}},
                              {"b", DType::kF64, {2}},
                              {"c", DType::kI16, {1}},
                              {"d", DType::kF32, {3}}},
                             {});
  for (const auto& t : l.parsed.tensors) EXPECT_EQ(t.begin % dtype_size(t.dtype), 0u) << t.name;
}

TEST(Layout, RefusesDuplicateOrReservedNames) {
  EXPECT_THROW(layout_file({{"a", DType::kU8, {1}}, {"a", DType::kF32, {1}}}, {}), Error);
  EXPECT_THROW(layout_file({{"__metadata__", DType::kU8, {1}}}, {}), Error);
}

TEST(Parse, AcceptsAnEmptyStateAndZeroSizedTensors) {
  EXPECT_TRUE(parse(image("{}", 0)).tensors.empty());
  auto h = parse(image(R"({"e":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},)"
                       R"("s":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})",
                       4));
  EXPECT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.find("s")->shape, Shape{});
}

TEST(Parse, AcceptsTensorsListedOutOfOffsetOrder) {
  auto h = parse(image(R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},)"
                       R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                       6));
  EXPECT_EQ(h.tensors[0].name, "a");
  EXPECT_EQ(h.tensors[1].name, "b");
}

TEST(ParseMalformed, FileShorterThanTheLengthPrefix) {
  expect_corrupt(std::string("\x02\0\0", 3), {"shorter than the 8-byte header length"});
}

TEST(ParseMalformed, HeaderLengthOverTheCap) {
  std::string f(16, '\0');
  uint64_t n = kMaxHeaderSize + 1;
  std::memcpy(f.data(), &n, 8);
  expect_corrupt(f, {"exceeds the limit", "byte offset 0"});
}

TEST(ParseMalformed, HeaderLengthPastTheEndOfTheFile) {
  std::string f = image("{}", 0);
  f[0] = 64;
  expect_corrupt(f, {"runs past the end of the file", "byte offset 0"});
}

TEST(ParseMalformed, HeaderThatIsNotJson) {
  expect_corrupt(image(R"({"a": {"dtype": "F32",,})", 0), {"not valid JSON", "byte offset"});
  expect_corrupt(image("[1,2]", 0), {"does not start with '{'"});
  expect_corrupt(image("{\"a\":\xff}", 0), {"not valid JSON"});
}

TEST(ParseMalformed, ANulByteInTheHeaderIsRefusedNamingItsFileOffset) {
  // NUL padding instead of spaces: the reference implementation refuses it.
  std::string header = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  std::string padded = header + std::string((8 - header.size() % 8) % 8 + 8, '\0');
  expect_corrupt(image(padded, 1, /*pad=*/false),
                 {"NUL byte", fmt::format("byte offset {}", 8 + header.size())});
  // A valid object, a NUL, then anything at all.
  expect_corrupt(image(header + std::string(1, '\0') + "{\"evil\": 1}", 1),
                 {"NUL byte", fmt::format("byte offset {}", 8 + header.size())});
}

TEST(ParseMalformed, UnknownDtypeNamesTheTensor) {
  expect_corrupt(image(R"({"w":{"dtype":"F4","shape":[1],"data_offsets":[0,1]}})", 1),
                 {"tensor \"w\"", "unknown dtype \"F4\"", "byte offset 9"});
}

TEST(ParseMalformed, OverlappingOffsetsNameBothTensorsAndTheOffset) {
  std::string hdr = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  auto f = image(hdr, 12);
  uint64_t data_start = f.size() - 12;
  expect_corrupt(f, {"tensor \"b\"", "overlaps tensor \"a\"",
                     "byte offset " + std::to_string(data_start + 4)});
}

TEST(ParseMalformed, HoleBetweenTensors) {
  expect_corrupt(image(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                       R"("b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})",
                       6),
                 {"tensor \"b\"", "hole of 2 bytes", "tensor \"a\""});
  expect_corrupt(image(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", 4),
                 {"tensor \"a\"", "hole of 2 bytes after the header"});
}

TEST(ParseMalformed, OffsetsPastTheEndOfTheFile) {
  expect_corrupt(image(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", 4),
                 {"tensor \"a\"", "past the end of the file"});
}

TEST(ParseMalformed, TrailingBytesAfterTheLastTensor) {
  expect_corrupt(image(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 5),
                 {"3 bytes of trailing data"});
}

TEST(ParseMalformed, ShapeThatDoesNotMatchTheByteLength) {
  expect_corrupt(image(R"({"x":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 12),
                 {"tensor \"x\"", "needs 16 bytes", "hold 12", "byte offset 9"});
}

TEST(ParseMalformed, ShapeWhoseSizeOverflows) {
  expect_corrupt(
      image(R"({"x":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0),
      {"tensor \"x\"", "too large"});
}

TEST(ParseMalformed, BadShapeOrOffsetValues) {
  expect_corrupt(image(R"({"x":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", 0),
                 {"tensor \"x\"", "not a size"});
  expect_corrupt(image(R"({"x":{"dtype":"U8","shape":[1.5],"data_offsets":[0,0]}})", 0),
                 {"tensor \"x\"", "not a size"});
  expect_corrupt(image(R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 0),
                 {"tensor \"x\"", "data_offsets"});
  expect_corrupt(image(R"({"x":{"dtype":"U8","shape":[0],"data_offsets":[2,1]}})", 2),
                 {"tensor \"x\"", "end before they begin"});
  expect_corrupt(image(R"({"x":{"dtype":"U8","shape":[1]}})", 1), {"tensor \"x\"", "data_offsets"});
  expect_corrupt(image(R"({"x":[1,2]})", 0), {"tensor \"x\"", "not an object"});
}

TEST(ParseMalformed, UnknownFieldInATensorEntry) {
  expect_corrupt(
      image(R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"code":"rm -rf"}})", 1),
      {"tensor \"x\"", "unknown field \"code\""});
}

TEST(ParseMalformed, MetadataThatIsNotAMapOfStrings) {
  expect_corrupt(image(R"({"__metadata__":["a"]})", 0), {"__metadata__", "byte offset 9"});
  expect_corrupt(image(R"({"__metadata__":{"epoch":3}})", 0),
                 {"__metadata__", "\"epoch\"", "not a string", "byte offset"});
}

TEST(ParseMalformed, DuplicateKeys) {
  expect_corrupt(image(R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                       R"("x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
                       1),
                 {"duplicate key \"x\""});
}

TEST(ParseMalformed, NestingDeeperThanAHeaderNeeds) {
  expect_corrupt(image(R"({"x":{"dtype":"U8","shape":[[[1]]],"data_offsets":[0,1]}})", 1),
                 {"nests"});
}

// ---- many tensors: headers, layouts and lookups must not be quadratic ----
//
// 100,000 tensors would take minutes with per-entry linear work (a re-scan of
// the header object, a linear find()); these tests only have to finish, and
// take well under a second each, so they bound the cost without timing it.

constexpr size_t kMany = 100'000;

std::string many_name(size_t i) { return fmt::format("layer.{:06d}.w", i); }

// A header of `n` one-byte U8 tensors listed in name order, with data offsets
// in reverse name order (so header order and offset order differ), plus
// `extra` appended verbatim before the closing brace.
std::string many_header(size_t n, const std::string& extra = "") {
  std::string h = "{";
  for (size_t i = 0; i < n; ++i) {
    const size_t at = n - 1 - i;
    h += fmt::format(R"({}"{}":{{"dtype":"U8","shape":[1],"data_offsets":[{},{}]}})", i ? "," : "",
                     many_name(i), at, at + 1);
  }
  return h + extra + "}";
}

TEST(Parse, AHundredThousandTensorsParseAndAreEachFoundByName) {
  const SafetensorsHeader h = parse(image(many_header(kMany), kMany));
  ASSERT_EQ(h.tensors.size(), kMany);
  EXPECT_EQ(h.data_size, kMany);
  for (size_t i = 0; i < kMany; ++i) {
    const TensorInfo* t = h.find(many_name(i));
    ASSERT_NE(t, nullptr) << many_name(i);
    EXPECT_EQ(t->begin, kMany - 1 - i);
    EXPECT_EQ(t->name, many_name(i));
  }
  EXPECT_EQ(h.find("layer.w"), nullptr);
  EXPECT_EQ(h.find(""), nullptr);
  // A copy's index still points into the copy.
  const SafetensorsHeader copy = h;
  const TensorInfo* t = copy.find(many_name(7));
  ASSERT_NE(t, nullptr);
  EXPECT_GE(t, copy.tensors.data());
  EXPECT_LT(t, copy.tensors.data() + copy.tensors.size());
}

TEST(ParseMalformed, ADuplicateAmongAHundredThousandTensorsIsNamed) {
  const std::string dup =
      fmt::format(R"(,"{}":{{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", many_name(0));
  expect_corrupt(image(many_header(kMany, dup), kMany),
                 {fmt::format("duplicate key \"{}\"", many_name(0))});
}

TEST(ParseMalformed, AnOverlapAmongAHundredThousandTensorsNamesBothAndTheOffset) {
  // Tensor "z" covers the byte of layer.099999.w (data offset 0).
  const std::string file =
      image(many_header(kMany, R"(,"z":{"dtype":"U8","shape":[1],"data_offsets":[0,1]})"), kMany);
  const uint64_t data_start = file.size() - kMany;
  expect_corrupt(
      file, {"overlaps", "\"z\"", many_name(kMany - 1), fmt::format("byte offset {}", data_start)});
}

TEST(Layout, AHundredThousandTensorsLayOutAndParseBack) {
  std::vector<TensorDescriptor> d;
  d.reserve(kMany);
  // Mixed element sizes, so the layout reorders them.
  for (size_t i = 0; i < kMany; ++i) {
    d.push_back({many_name(i), i % 3 == 0 ? DType::kF32 : DType::kU8, {1}});
  }
  const FileLayout l = layout_file(d, {{"format", "pt"}});
  ASSERT_EQ(l.parsed.tensors.size(), kMany);
  std::string file = l.header + std::string(l.parsed.data_size, '\0');
  const SafetensorsHeader h = parse(file);
  ASSERT_EQ(h.tensors.size(), kMany);
  EXPECT_EQ(h.metadata, l.parsed.metadata);
  for (const auto& t : d) {
    const TensorInfo* a = l.parsed.find(t.name);
    const TensorInfo* b = h.find(t.name);
    ASSERT_NE(a, nullptr) << t.name;
    ASSERT_NE(b, nullptr) << t.name;
    EXPECT_EQ(a->begin, b->begin);
    EXPECT_EQ(b->dtype, t.dtype);
  }
}

TEST(Layout, RefusesADuplicateAmongAHundredThousandNamesNamingIt) {
  std::vector<TensorDescriptor> d;
  for (size_t i = 0; i < kMany; ++i) d.push_back({many_name(i), DType::kU8, {1}});
  // Sorted by element size first, so the two are far apart in the layout.
  d.push_back({many_name(kMany / 2), DType::kF64, {1}});
  try {
    layout_file(d, {});
    FAIL() << "laid out a duplicate name";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(many_name(kMany / 2)), std::string::npos) << e.what();
  }
}

TEST(Layout, WritesTheSameHeaderBytesAsBefore) {
  // The exact text the writer has always produced (compact JSON, metadata
  // first, then tensors by decreasing element size and name); checksums of
  // committed checkpoints depend on it.
  const FileLayout l =
      layout_file({{"b", DType::kU8, {}}, {"a\"q", DType::kF32, {2, 3}}, {"c", DType::kI64, {0}}},
                  {{"k", "v"}, {"a", "x\ty"}});
  const std::string want = R"({"__metadata__":{"a":"x\ty","k":"v"},)"
                           R"("c":{"dtype":"I64","shape":[0],"data_offsets":[0,0]},)"
                           R"("a\"q":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                           R"("b":{"dtype":"U8","shape":[],"data_offsets":[24,25]}})";
  ASSERT_GE(l.header.size(), 8 + want.size());
  EXPECT_EQ(l.header.substr(8, want.size()), want);
  EXPECT_EQ(l.header.find_first_not_of(' ', 8 + want.size()), std::string::npos);
}

TEST(Layout, RefusesANameThatIsNotUtf8) {
  EXPECT_THROW(layout_file({{"\xff", DType::kU8, {1}}}, {}), Error);
  EXPECT_THROW(layout_file({}, {{"k", "\xc3"}}), Error);
}

TEST(Parse, FindWorksOnAHeaderFilledInByHand) {
  SafetensorsHeader h;
  h.tensors.push_back({"b", DType::kU8, {1}, 0, 1});
  h.tensors.push_back({"a", DType::kU8, {1}, 1, 2});
  ASSERT_NE(h.find("a"), nullptr);  // no index yet: the linear scan
  EXPECT_EQ(h.find("a")->begin, 1u);
  h.reindex();
  ASSERT_EQ(h.by_name.size(), 2u);
  EXPECT_EQ(h.find("b")->begin, 0u);
  EXPECT_EQ(h.find("c"), nullptr);
}

TEST(SafetensorsLayout, NewMetadataGivesExactlyTheLayoutOfAFreshOne) {
  using Meta = std::map<std::string, std::string>;
  const std::vector<Meta> metas = {
      {}, {{"format", "pt"}}, {{"a", std::string(100, 'x')}, {"b", "\"q\""}}, {{"z", ""}}};
  const std::vector<std::vector<TensorDescriptor>> states = {
      {}, {{"w", DType::kF32, {2, 3}}, {"b", DType::kU8, {5}}, {"é", DType::kF64, {}}}};
  for (const auto& tensors : states) {
    for (const auto& from : metas) {
      for (const auto& to : metas) {
        FileLayout l = layout_file(tensors, from);
        set_layout_metadata(l, to);
        const FileLayout fresh = layout_file(tensors, to);
        EXPECT_EQ(l.header, fresh.header) << tensors.size() << " tensors";
        EXPECT_EQ(l.parsed.header_size, fresh.parsed.header_size);
        EXPECT_EQ(l.parsed.metadata, to);
        // And it parses back to the same tensors.
        std::string file = l.header + std::string(l.parsed.data_size, '\0');
        SafetensorsHeader h = parse_file_header(bytes_of(file), "relaid");
        EXPECT_EQ(h.metadata, to);
        ASSERT_EQ(h.tensors.size(), tensors.size());
        for (const auto& t : fresh.parsed.tensors) {
          ASSERT_NE(h.find(t.name), nullptr) << t.name;
          EXPECT_EQ(h.find(t.name)->begin, t.begin);
        }
      }
    }
  }
}

TEST(SafetensorsLayout, InvalidNewMetadataLeavesTheLayoutAsItWas) {
  FileLayout l = layout_file({{"w", DType::kF32, {2}}}, {{"format", "pt"}});
  const FileLayout before = l;
  EXPECT_THROW(set_layout_metadata(l, {{"k", "\xc3"}}), Error);
  EXPECT_EQ(l.header, before.header);
  EXPECT_EQ(l.parsed.metadata, before.parsed.metadata);
}

}  // namespace
}  // namespace cairn::testing
