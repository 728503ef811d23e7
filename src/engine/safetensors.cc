// safetensors parsing, validation and layout: pure logic, no I/O, so it is
// unit-tested and fuzzed on its own (fuzz/safetensors_header_fuzz.cc).
#include "cairn/safetensors.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <tuple>
#include <unordered_set>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cairn/error.h"
#include "engine/header_scan.h"
#include "util/json.h"

namespace cairn {

namespace {

struct DTypeName {
  DType dtype;
  std::string_view name;
  size_t size;
};

constexpr std::array<DTypeName, 15> kDTypes = {{
    {DType::kBool, "BOOL", 1},
    {DType::kU8, "U8", 1},
    {DType::kI8, "I8", 1},
    {DType::kI16, "I16", 2},
    {DType::kU16, "U16", 2},
    {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},
    {DType::kI32, "I32", 4},
    {DType::kU32, "U32", 4},
    {DType::kF32, "F32", 4},
    {DType::kF64, "F64", 8},
    {DType::kI64, "I64", 8},
    {DType::kU64, "U64", 8},
    {DType::kF8_E4M3, "F8_E4M3", 1},
    {DType::kF8_E5M2, "F8_E5M2", 1},
}};

const DTypeName& lookup(DType d) {
  for (const auto& e : kDTypes) {
    if (e.dtype == d) return e;
  }
  throw Error(ErrorCode::kInternal,
              fmt::format("unknown DType value {}", static_cast<int>(d)));  // a bug in the caller
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t& out) {
  return __builtin_mul_overflow(a, b, &out);
}

Error corrupt(std::string_view source, std::string message) {
  return Error(ErrorCode::kCorruption, fmt::format("{}: {}", source, message));
}

// The byte offset in the file of a tensor's key in the header text, found by
// searching for its JSON-quoted name followed by ':' (best effort: a writer
// that escapes differently gets the header's start).
uint64_t key_offset(std::string_view header, std::string_view name) {
  std::string quoted;
  try {
    quoted = nlohmann::json(std::string(name)).dump();
  } catch (const nlohmann::json::exception&) {
    return 8;  // ignore-error: only used to point at a place in a message
  }
  size_t pos = 0;
  while ((pos = header.find(quoted, pos)) != std::string_view::npos) {
    size_t after = pos + quoted.size();
    while (after < header.size() && (header[after] == ' ' || header[after] == '\t' ||
                                     header[after] == '\n' || header[after] == '\r')) {
      ++after;
    }
    if (after < header.size() && header[after] == ':') return 8 + pos;
    pos += 1;
  }
  return 8;
}

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// The problem with one tensor entry of a header, or "" when it is valid.
// Fills t.dtype, t.shape (from `dims`), t.begin and t.end.
struct RawEntry {
  bool dtype_seen = false, dtype_is_string = false;
  std::string dtype;
  bool shape_seen = false, shape_is_array = false;
  std::string bad_dim;  // JSON of the first dimension that is not a size
  bool offsets_seen = false, offsets_is_array = false, offsets_ok = true;
  int offsets_count = 0;
  std::string unknown_field;  // the first field that is not one of the three
};

std::string check_entry(const RawEntry& e, const Shape& dims, TensorInfo& t) {
  if (!e.unknown_field.empty()) return fmt::format("unknown field \"{}\"", e.unknown_field);
  if (!e.dtype_seen || !e.dtype_is_string) return "missing or non-string \"dtype\"";
  auto dt = parse_dtype(e.dtype);
  if (!dt) return fmt::format("unknown dtype {}", nlohmann::json(e.dtype).dump());
  t.dtype = *dt;
  if (!e.shape_seen || !e.shape_is_array) return "missing or non-array \"shape\"";
  if (!e.bad_dim.empty()) return fmt::format("shape dimension {} is not a size", e.bad_dim);
  t.shape = dims;
  if (!e.offsets_seen || !e.offsets_is_array || !e.offsets_ok || e.offsets_count != 2) {
    return "\"data_offsets\" is not a pair of byte offsets";
  }
  return format::entry_size_problem(t);
}

// Reads a header's SAX events from nlohmann's lexer straight into TensorInfo
// records, without building a JSON document: a document cost about ten
// allocations and a kilobyte of fresh memory per tensor, which was most of
// the time a 100,000-tensor load took. Each event costs O(1) amortized.
//
// Duplicate keys (nlohmann would keep the last one, letting a file say two
// things about one tensor) inside an entry or the metadata, and nesting
// deeper than a header needs, stop the parse at once; duplicate tensor names
// are found after it, from the name index parse_header sorts anyway. A
// malformed entry is remembered (the first one in the text) and reported
// only once the whole text has parsed and no name is duplicated, so that
// text that is not JSON is reported as such wherever the problem lies.
class HeaderSax {
 public:
  using json = nlohmann::json;

  explicit HeaderSax(std::string_view text) : text_(text) {
    // No valid entry is shorter than "":{"dtype":"U8","shape":[],"data_offsets":[0,0]},
    // so this is room for any valid header (a broken one may grow it); pages
    // never filled are never touched.
    entries_.reserve(text.size() / 48 + 1);
  }

  bool syntax_error() const { return syntax_error_; }
  size_t error_byte() const { return error_byte_; }
  const std::string& fatal() const { return fatal_; }
  const std::string& problem() const { return problem_; }
  std::vector<TensorInfo>& entries() { return entries_; }
  std::map<std::string, std::string>& metadata() { return metadata_; }

  bool null() { return scalar("null", "null"); }
  bool boolean(bool v) { return scalar("boolean", v ? "true" : "false"); }
  bool number_integer(json::number_integer_t v) {
    if (v >= 0) return size_value(static_cast<uint64_t>(v));
    return scalar("number", std::to_string(v));
  }
  bool number_unsigned(json::number_unsigned_t v) { return size_value(v); }
  bool number_float(json::number_float_t v, const json::string_t&) {
    return scalar("number", json(v).dump());
  }
  bool string(json::string_t& v) {
    if (skipping()) return true;
    if (depth_ == 2 && in_ == In::kMetadata) {
      metadata_.emplace(key_, std::move(v));
      return true;
    }
    if (depth_ == 2 && in_ == In::kEntry && field_ == Field::kDtype) {
      raw_.dtype_is_string = true;
      raw_.dtype = v;
      return true;
    }
    return scalar("string", json(v).dump());
  }
  bool binary(json::binary_t&) { return scalar("binary", "binary"); }
  bool start_object(size_t) { return open(/*object=*/true); }
  bool start_array(size_t) { return open(/*object=*/false); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& k) {
    if (skipping()) {
      if (skipped_keys_.empty() || skipped_keys_.back().insert(k).second) return true;
      return duplicate(k);
    }
    if (depth_ == 1) return top_level_key(k);
    if (in_ == In::kMetadata) {
      if (!metadata_keys_.insert(k).second) return duplicate(k);
      key_ = std::move(k);
      return true;
    }
    // In a tensor entry (depth 2).
    field_ = k == "dtype"          ? Field::kDtype
             : k == "shape"        ? Field::kShape
             : k == "data_offsets" ? Field::kOffsets
                                   : Field::kOther;
    bool seen = false;
    switch (field_) {
      case Field::kDtype:
        seen = std::exchange(raw_.dtype_seen, true);
        break;
      case Field::kShape:
        seen = std::exchange(raw_.shape_seen, true);
        break;
      case Field::kOffsets:
        seen = std::exchange(raw_.offsets_seen, true);
        break;
      default:
        seen = !entry_other_keys_.insert(k).second;
        if (raw_.unknown_field.empty()) raw_.unknown_field = k;
        break;
    }
    return seen ? duplicate(k) : true;
  }
  bool parse_error(size_t position, const std::string&, const nlohmann::detail::exception& e) {
    syntax_error_ = true;
    error_byte_ = position;
    fatal_ = e.what();
    return false;
  }

 private:
  enum class In { kRoot, kMetadata, kEntry };
  enum class Field { kNone, kDtype, kShape, kOffsets, kOther };

  bool skipping() const { return skip_below_ >= 0 && depth_ > skip_below_; }

  bool duplicate(const std::string& k) {
    fatal_ = fmt::format("duplicate key {} in the header", json(k).dump());
    return false;
  }

  void note(std::string message) {
    if (problem_.empty()) problem_ = std::move(message);
  }
  void note_entry(std::string_view name, const std::string& what) {
    note(fmt::format("tensor \"{}\" at header byte offset {}: {}", name, key_offset(text_, name),
                     what));
  }

  bool top_level_key(json::string_t& k) {
    if (k == kMetadataKeyName) {
      if (metadata_seen_) return duplicate(k);
      metadata_seen_ = true;
      in_ = In::kMetadata;
      return true;
    }
    // A copy, not a move: the lexer keeps its buffer's capacity for the next
    // token. Duplicate names are found after the parse (parse_header).
    entries_.emplace_back();
    entries_.back().name = k;
    in_ = In::kEntry;
    return true;
  }

  // A scalar value; `type` and `text` name it in messages.
  bool scalar(const char* type, const std::string& text) {
    if (skipping()) return true;
    if (depth_ == 1) {
      value_is_not_an_object(type);
    } else if (depth_ == 2 && in_ == In::kMetadata) {
      note(fmt::format("\"__metadata__\" entry \"{}\" at byte offset {} is a {}, not a string",
                       key_, key_offset(text_, key_), type));
    } else if (depth_ == 2 && in_ == In::kEntry) {
      // dtype that is not a string, shape or data_offsets that is not an array:
      // seen, with the wrong type (check_entry says so).
    } else if (depth_ == 3 && field_ == Field::kShape) {
      if (raw_.bad_dim.empty()) raw_.bad_dim = text;
    } else if (depth_ == 3 && field_ == Field::kOffsets) {
      raw_.offsets_ok = false;
      ++raw_.offsets_count;
    }
    return true;
  }

  bool size_value(uint64_t v) {
    if (skipping()) return true;
    if (depth_ == 3 && field_ == Field::kShape) {
      dims_.push_back(v);
      return true;
    }
    if (depth_ == 3 && field_ == Field::kOffsets) {
      TensorInfo& t = entries_.back();
      if (raw_.offsets_count == 0) t.begin = v;
      if (raw_.offsets_count == 1) t.end = v;
      ++raw_.offsets_count;
      return true;
    }
    return scalar("number", std::to_string(v));
  }

  // The value of a top-level key is not an object.
  void value_is_not_an_object(const char* type) {
    if (in_ == In::kMetadata) {
      note(fmt::format("\"__metadata__\" at byte offset {} is not an object of strings",
                       key_offset(text_, kMetadataKeyName)));
    } else {
      note_entry(entries_.back().name, fmt::format("entry is a {}, not an object", type));
    }
  }

  bool open(bool object) {
    // The root object, a tensor entry, its shape: three levels at most.
    if (depth_ + 1 > 3) {
      fatal_ = "the header nests JSON deeper than a safetensors header can";
      return false;
    }
    ++depth_;
    if (skipping()) {
      if (object) skipped_keys_.emplace_back();
      open_objects_.push_back(object);
      return true;
    }
    open_objects_.push_back(object);
    if (depth_ == 1) return true;  // the root: parse_header checked that it is '{'
    if (depth_ == 2) {
      if (!object) {
        value_is_not_an_object("array");
        skip_from(1, object);
      } else if (in_ == In::kEntry) {
        raw_ = RawEntry{};
        entry_other_keys_.clear();
        field_ = Field::kNone;
      }
      return true;
    }
    if (depth_ == 3 && in_ == In::kEntry && !object &&
        (field_ == Field::kShape || field_ == Field::kOffsets)) {
      if (field_ == Field::kShape) {
        raw_.shape_is_array = true;
        dims_.clear();
      } else {
        raw_.offsets_is_array = true;
      }
      return true;
    }
    // An object or array where a header has none: a metadata value, a
    // dtype, a shape that is an object, or an unknown field's value.
    if (in_ == In::kMetadata) {
      note(fmt::format("\"__metadata__\" entry \"{}\" at byte offset {} is a {}, not a string",
                       key_, key_offset(text_, key_), object ? "object" : "array"));
    }
    skip_from(2, object);
    return true;
  }

  // Ignores everything inside the container just opened at depth_ (> level).
  void skip_from(int level, bool object) {
    skip_below_ = level;
    if (object) skipped_keys_.emplace_back();
  }

  bool close() {
    const bool object = open_objects_.back();
    open_objects_.pop_back();
    if (skipping()) {
      if (object) skipped_keys_.pop_back();
      --depth_;
      if (depth_ <= skip_below_) skip_below_ = -1;
      return true;
    }
    if (depth_ == 2 && in_ == In::kEntry) {
      TensorInfo& t = entries_.back();
      std::string why = check_entry(raw_, dims_, t);
      if (!why.empty()) note_entry(t.name, why);
    }
    if (depth_ == 2) in_ = In::kRoot;
    --depth_;
    return true;
  }

  std::string_view text_;
  int depth_ = 0;
  int skip_below_ = -1;  // while >= 0, events deeper than this level are ignored
  std::vector<bool> open_objects_;
  std::vector<std::set<std::string>> skipped_keys_;  // duplicate checks while skipping
  In in_ = In::kRoot;
  Field field_ = Field::kNone;
  std::vector<TensorInfo> entries_;
  bool metadata_seen_ = false;
  std::map<std::string, std::string> metadata_;
  std::set<std::string> metadata_keys_;
  std::string key_;  // the metadata key whose value comes next
  RawEntry raw_;
  std::set<std::string> entry_other_keys_;
  Shape dims_;
  std::string fatal_, problem_;
  bool syntax_error_ = false;
  size_t error_byte_ = 0;
};

// Positions of `items` (anything with a `name`) in name order: the index
// SafetensorsHeader::find() searches. Input already in name order (a
// StateDict's) costs one pass.
template <class T>
std::vector<size_t> name_order(const std::vector<T>& items) {
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), size_t{0});
  auto less = [&](size_t a, size_t b) { return items[a].name < items[b].name; };
  if (!std::is_sorted(order.begin(), order.end(), less)) {
    std::sort(order.begin(), order.end(), less);
  }
  return order;
}

// A name two of `items` share (neighbours in `by_name`), or nullptr.
template <class T>
const std::string* shared_name(const std::vector<T>& items, const std::vector<size_t>& by_name) {
  for (size_t i = 1; i < by_name.size(); ++i) {
    if (items[by_name[i]].name == items[by_name[i - 1]].name) return &items[by_name[i]].name;
  }
  return nullptr;
}

}  // namespace

std::string_view dtype_name(DType dtype) { return lookup(dtype).name; }

std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& e : kDTypes) {
    if (e.name == name) return e.dtype;
  }
  return std::nullopt;
}

size_t dtype_size(DType dtype) { return lookup(dtype).size; }

uint64_t num_elements(const Shape& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) {
    if (mul_overflows(n, d, n)) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("shape {} has more than 2^64 elements", shape_str(shape)));
    }
  }
  return n;
}

uint64_t byte_size(DType dtype, const Shape& shape) {
  uint64_t bytes;
  if (mul_overflows(num_elements(shape), dtype_size(dtype), bytes)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}{} is larger than 2^64 bytes", dtype_name(dtype), shape_str(shape)));
  }
  return bytes;
}

void SafetensorsHeader::reindex() { by_name = name_order(tensors); }

const TensorInfo* SafetensorsHeader::find(std::string_view name) const {
  if (by_name.size() != tensors.size()) {
    // Not indexed (a header filled in by hand): the slow way, still correct.
    for (const auto& t : tensors) {
      if (t.name == name) return &t;
    }
    return nullptr;
  }
  auto it = std::lower_bound(by_name.begin(), by_name.end(), name,
                             [&](size_t i, std::string_view n) { return tensors[i].name < n; });
  if (it == by_name.end() || *it >= tensors.size() || tensors[*it].name != name) return nullptr;
  return &tensors[*it];
}

uint64_t parse_header_length(std::span<const std::byte, 8> prefix, uint64_t file_size,
                             std::string_view source) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(prefix[static_cast<size_t>(i)]);
  if (n > kMaxHeaderSize) {
    throw corrupt(source, fmt::format("header length {} at byte offset 0 exceeds the limit of {} "
                                      "bytes",
                                      n, kMaxHeaderSize));
  }
  if (n < 2) {
    throw corrupt(
        source, fmt::format("header length {} at byte offset 0 is too small for a JSON object", n));
  }
  if (8 + n > file_size) {
    throw corrupt(source, fmt::format("header length {} at byte offset 0 runs past the end of the "
                                      "file ({} bytes)",
                                      n, file_size));
  }
  return n;
}

namespace {

// The text's entries and metadata, read by the general parser, which
// handles any JSON. Throws kCorruption naming `source` for text that is not
// JSON, nests too deeply or repeats a key in an object other than the root;
// sets `problem` to what is wrong with the first malformed entry, which the
// caller reports unless a tensor name is repeated.
format::HeaderEntries read_general(std::string_view text, std::string_view source,
                                   std::string& problem) {
  HeaderSax sax(text);
  try {
    nlohmann::json::sax_parse(text.begin(), text.end(), &sax);
  } catch (const nlohmann::json::exception& e) {
    throw corrupt(source, fmt::format("the header is not valid JSON: {}", e.what()));
  }
  if (sax.syntax_error()) {
    const size_t byte = sax.error_byte();
    throw corrupt(source, fmt::format("the header is not valid JSON at byte offset {}: {}",
                                      8 + (byte > 0 ? byte - 1 : 0), sax.fatal()));
  }
  if (!sax.fatal().empty()) throw corrupt(source, sax.fatal());
  problem = sax.problem();
  return {std::move(sax.entries()), std::move(sax.metadata())};
}

SafetensorsHeader parse_header_with(std::string_view text, uint64_t file_size,
                                    std::string_view source, bool scan_first) {
  SafetensorsHeader h;
  h.header_size = text.size();
  if (8 + text.size() > file_size) {
    throw corrupt(source, fmt::format("header of {} bytes runs past the end of the file ({} bytes)",
                                      text.size(), file_size));
  }
  if (text.empty() || text[0] != '{') {
    throw corrupt(source, "the header does not start with '{' at byte offset 8");
  }
  // The plain form every known writer emits is scanned in one pass; any
  // other text goes to the general parser, whose verdict and messages stand.
  // The scanner accepts no NUL byte and nests three levels at most, so only
  // the general parser needs check_json_text(): nlohmann's lexer takes a NUL
  // for the end of the input, so "{...}\0junk" would pass, where the format
  // (and its reference implementation) refuse it.
  std::optional<format::HeaderEntries> read;
  if (scan_first) read = format::scan_plain_header(text);
  std::string problem;
  if (!read) {
    check_json_text(text, source, JsonLimits{}, 8);
    read = read_general(text, source, problem);
  }
  std::vector<size_t> by_name = name_order(read->tensors);
  if (const std::string* name = shared_name(read->tensors, by_name)) {
    throw corrupt(source,
                  fmt::format("duplicate key {} in the header", nlohmann::json(*name).dump()));
  }
  // A malformed entry is reported after a repeated name, which the general
  // parser finds only once it has read every entry.
  if (!problem.empty()) throw corrupt(source, problem);
  std::vector<TensorInfo> parsed = std::move(read->tensors);
  h.metadata = std::move(read->metadata);

  // Tensors in data-offset order; the name index follows them there. Writers
  // list them in that order already, which costs one pass to confirm.
  auto by_offset = [](const TensorInfo& x, const TensorInfo& y) {
    return std::tie(x.begin, x.end, x.name) < std::tie(y.begin, y.end, y.name);
  };
  if (std::is_sorted(parsed.begin(), parsed.end(), by_offset)) {
    h.tensors = std::move(parsed);
  } else {
    std::vector<size_t> order(parsed.size()), position(parsed.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return by_offset(parsed[a], parsed[b]); });
    h.tensors.reserve(parsed.size());
    for (size_t k = 0; k < order.size(); ++k) {
      position[order[k]] = k;
      h.tensors.push_back(std::move(parsed[order[k]]));
    }
    for (size_t& i : by_name) i = position[i];
  }
  h.by_name = std::move(by_name);
  const uint64_t data_start = h.data_start();
  const uint64_t data_size = file_size - data_start;
  uint64_t expected = 0;
  const TensorInfo* prev = nullptr;
  for (const auto& t : h.tensors) {
    const uint64_t file_begin = data_start + t.begin;
    if (t.end > data_size) {
      throw corrupt(source,
                    fmt::format("tensor \"{}\": data_offsets [{}, {}] end at file byte offset {}, "
                                "past the end of the file ({} bytes)",
                                t.name, t.begin, t.end, data_start + t.end, file_size));
    }
    if (t.begin < expected) {
      throw corrupt(source, fmt::format("tensor \"{}\": data at file byte offset {} overlaps "
                                        "tensor \"{}\", which ends at byte offset {}",
                                        t.name, file_begin, prev->name, data_start + expected));
    }
    if (t.begin > expected) {
      throw corrupt(
          source,
          fmt::format("tensor \"{}\": data starts at file byte offset {}, leaving a hole of {} "
                      "bytes after {} (data_offsets must be contiguous)",
                      t.name, file_begin, t.begin - expected,
                      prev ? fmt::format("tensor \"{}\"", prev->name) : "the header"));
    }
    expected = t.end;
    prev = &t;
  }
  if (expected != data_size) {
    throw corrupt(source, fmt::format("the tensors end at byte offset {} but the file has {} bytes "
                                      "({} bytes of trailing data)",
                                      data_start + expected, file_size, data_size - expected));
  }
  h.data_size = data_size;
  return h;
}

}  // namespace

SafetensorsHeader parse_header(std::string_view text, uint64_t file_size, std::string_view source) {
  return parse_header_with(text, file_size, source, /*scan_first=*/true);
}

SafetensorsHeader format::parse_header_general(std::string_view text, uint64_t file_size,
                                               std::string_view source) {
  return parse_header_with(text, file_size, source, /*scan_first=*/false);
}

SafetensorsHeader parse_file_header(std::span<const std::byte> file, std::string_view source) {
  if (file.size() < 8) {
    throw corrupt(source, fmt::format("file of {} bytes is shorter than the 8-byte header length",
                                      file.size()));
  }
  uint64_t n = parse_header_length(file.first<8>(), file.size(), source);
  std::string_view text(reinterpret_cast<const char*>(file.data()) + 8, n);
  return parse_header(text, file.size(), source);
}

namespace {

// The "__metadata__" member as layout_file() writes it, without the comma.
std::string metadata_member(const std::map<std::string, std::string>& metadata) {
  try {
    return fmt::format("\"{}\":{}", kMetadataKeyName, nlohmann::json(metadata).dump());
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("a metadata string is not valid UTF-8: {}", e.what()));
  }
}

// Pads the header text (after the 8-byte prefix) with spaces so that the data
// buffer starts 8-byte aligned, checks its size and writes the prefix.
void finish_header(FileLayout& out) {
  std::string& text = out.header;
  text.resize((text.size() + 7) / 8 * 8, ' ');
  const uint64_t len = text.size() - 8;
  if (len > kMaxHeaderSize) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("the header would be {} bytes, over the {} byte limit", len, kMaxHeaderSize));
  }
  for (size_t i = 0; i < 8; ++i) text[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  out.parsed.header_size = len;
}

}  // namespace

FileLayout layout_file(std::vector<TensorDescriptor> tensors,
                       const std::map<std::string, std::string>& metadata) {
  const size_t n = tensors.size();
  for (const auto& t : tensors) {
    if (t.name == kMetadataKeyName) {
      throw Error(ErrorCode::kInvalidArgument, "a tensor may not be named \"__metadata__\"");
    }
  }
  std::vector<size_t> by_name = name_order(tensors);
  if (const std::string* name = shared_name(tensors, by_name)) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("duplicate tensor \"{}\"", *name));
  }
  // Placement: by decreasing element size, then by name.
  std::vector<size_t> order = by_name;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtype_size(tensors[a].dtype) > dtype_size(tensors[b].dtype);
  });
  std::vector<size_t> position(n);
  FileLayout out;
  out.parsed.tensors.reserve(n);
  uint64_t offset = 0;
  for (size_t k = 0; k < n; ++k) {
    TensorDescriptor& t = tensors[order[k]];
    position[order[k]] = k;
    TensorInfo info;
    info.dtype = t.dtype;
    info.begin = offset;
    uint64_t bytes = byte_size(t.dtype, t.shape);
    if (__builtin_add_overflow(offset, bytes, &info.end)) {
      throw Error(ErrorCode::kInvalidArgument, "the state is larger than 2^64 bytes");
    }
    info.name = std::move(t.name);
    info.shape = std::move(t.shape);
    offset = info.end;
    out.parsed.tensors.push_back(std::move(info));
  }
  for (size_t& i : by_name) i = position[i];
  // The header, written entry by entry straight into place after the length
  // prefix, in the same bytes as dumping one nlohmann::ordered_json object
  // would give (compact, keys in this order), without building that object:
  // its lookups are linear, so n tensors would cost O(n^2).
  std::string& text = out.header;
  // Room for the longest text these could need (escaped names aside), so the
  // string is never copied while it grows; pages never written stay untouched.
  size_t room = 64;
  for (const auto& [k, v] : metadata) room += 2 * (k.size() + v.size()) + 8;
  for (const auto& t : out.parsed.tensors) room += t.name.size() + 110 + 21 * t.shape.size();
  text.reserve(room);
  text.assign(8, '\0');
  text += '{';
  auto append_json_string = [&](const std::string& s) {
    // Printable ASCII without quote or backslash is written as it is (what
    // nlohmann would write); anything else is escaped and UTF-8-checked there.
    const bool plain = std::all_of(
        s.begin(), s.end(), [](char c) { return c >= 0x20 && c < 0x7f && c != '"' && c != '\\'; });
    if (plain) {
      text += '"';
      text += s;
      text += '"';
    } else {
      text += nlohmann::json(s).dump();
    }
  };
  if (!metadata.empty()) text += metadata_member(metadata);
  try {
    for (const auto& t : out.parsed.tensors) {
      if (text.size() > 9) text += ',';
      append_json_string(t.name);
      text += R"(:{"dtype":")";
      text += dtype_name(t.dtype);
      text += R"(","shape":[)";
      for (size_t d = 0; d < t.shape.size(); ++d) {
        if (d > 0) text += ',';
        text += fmt::format_int(t.shape[d]).str();
      }
      text += R"(],"data_offsets":[)";
      text += fmt::format_int(t.begin).str();
      text += ',';
      text += fmt::format_int(t.end).str();
      text += "]}";
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("a tensor name or metadata string is not valid UTF-8: {}", e.what()));
  }
  text += '}';
  finish_header(out);
  out.parsed.data_size = offset;
  out.parsed.metadata = metadata;
  out.parsed.by_name = std::move(by_name);
  return out;
}

void set_layout_metadata(FileLayout& layout, const std::map<std::string, std::string>& metadata) {
  if (metadata == layout.parsed.metadata) return;
  const bool any_tensor = !layout.parsed.tensors.empty();
  auto member = [&](const std::map<std::string, std::string>& m) {
    return m.empty() ? std::string() : metadata_member(m) + (any_tensor ? "," : "");
  };
  const std::string fresh = member(metadata);
  const size_t stale = member(layout.parsed.metadata).size();
  std::string& text = layout.header;
  // The root object's '}' ends the JSON; only padding follows it.
  const size_t json_end = text.find_last_not_of(' ') + 1;
  const uint64_t len = (json_end - stale + fresh.size() + 7) / 8 * 8 - 8;
  if (len > kMaxHeaderSize) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("the header would be {} bytes, over the {} byte limit", len, kMaxHeaderSize));
  }
  text.erase(json_end);
  // The member sits right after the prefix and '{'; the tensors follow it.
  text.replace(9, stale, fresh);
  finish_header(layout);
  layout.parsed.metadata = metadata;
}

}  // namespace cairn
