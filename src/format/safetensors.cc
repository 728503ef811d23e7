// safetensors parsing, validation and layout: pure logic, no I/O, so it is
// unit-tested and fuzzed on its own (fuzz/safetensors_header_fuzz.cc).
#include "cairn/safetensors.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <tuple>
#include <unordered_set>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cairn/error.h"
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

// Builds a JSON document from nlohmann's SAX events, refusing duplicate object
// keys (nlohmann keeps the last one, which would let a file say two things
// about one tensor) and nesting deeper than a valid header needs.
//
// Why not nlohmann::json::parse with a callback: its callback parser, after
// every object ends, walks the parent object looking for a discarded value to
// erase, so a header of n tensors costs O(n^2) (measured: 16 s for 40,000
// tensors). Here each event costs O(log n) at most: a key is checked against
// its object (a std::map) once, when it is read, and nothing is re-scanned.
class StrictHeaderSax {
 public:
  using json = nlohmann::json;

  json& result() { return root_; }
  const std::string& problem() const { return problem_; }
  bool syntax_error() const { return syntax_error_; }
  size_t error_byte() const { return error_byte_; }

  bool null() { return put(json(nullptr)); }
  bool boolean(bool v) { return put(json(v)); }
  bool number_integer(json::number_integer_t v) { return put(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return put(json(v)); }
  bool number_float(json::number_float_t v, const json::string_t&) { return put(json(v)); }
  bool string(json::string_t& v) { return put(json(std::move(v))); }
  bool binary(json::binary_t& v) { return put(json(json::binary_t(std::move(v)))); }
  bool start_object(size_t) { return open(json::value_t::object); }
  bool start_array(size_t) { return open(json::value_t::array); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& k) {
    if (stack_.back()->contains(k)) {
      problem_ = fmt::format("duplicate key {} in the header", json(k).dump());
      return false;
    }
    key_ = std::move(k);
    return true;
  }
  bool parse_error(size_t position, const std::string&, const nlohmann::detail::exception& e) {
    syntax_error_ = true;
    error_byte_ = position;
    problem_ = e.what();
    return false;
  }

 private:
  // Stores a finished value in its parent (or as the root) and returns it.
  json* place(json&& v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    // The key is new: key() refused a duplicate.
    return &(parent[std::move(key_)] = std::move(v));
  }
  bool put(json&& v) {
    place(std::move(v));
    return true;
  }
  bool open(json::value_t type) {
    // The root object, a tensor entry, its shape: three levels at most.
    if (stack_.size() + 1 > 3) {
      problem_ = "the header nests JSON deeper than a safetensors header can";
      return false;
    }
    // Pointers stay valid: a parent is not touched again until this child is
    // closed, so an array's reallocation never moves an open value.
    stack_.push_back(place(json(type)));
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }

  json root_;
  std::vector<json*> stack_;
  std::string key_;
  std::string problem_;
  bool syntax_error_ = false;
  size_t error_byte_ = 0;
};

// Parses the header text strictly (see StrictHeaderSax), after the checks
// every stored JSON gets (size, depth, NUL bytes).
nlohmann::json parse_strict_json(std::string_view text, std::string_view source) {
  // nlohmann's lexer takes a NUL byte for the end of input, so "{...}\0junk"
  // would pass; the format (and its reference implementation) refuse it.
  check_json_text(text, source, JsonLimits{}, 8);
  StrictHeaderSax sax;
  bool ok = false;
  try {
    ok = nlohmann::json::sax_parse(text.begin(), text.end(), &sax);
  } catch (const nlohmann::json::exception& e) {
    throw corrupt(source, fmt::format("the header is not valid JSON: {}", e.what()));
  }
  if (sax.syntax_error()) {
    const size_t byte = sax.error_byte();
    throw corrupt(source, fmt::format("the header is not valid JSON at byte offset {}: {}",
                                      8 + (byte > 0 ? byte - 1 : 0), sax.problem()));
  }
  if (!sax.problem().empty()) throw corrupt(source, sax.problem());
  if (!ok) throw corrupt(source, "the header is not valid JSON");
  return std::move(sax.result());
}

bool get_u64(const nlohmann::json& j, uint64_t& out) {
  if (!j.is_number_unsigned()) {
    if (j.is_number_integer() && j.get<int64_t>() >= 0) {
      out = static_cast<uint64_t>(j.get<int64_t>());
      return true;
    }
    return false;
  }
  out = j.get<uint64_t>();
  return true;
}

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

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

void SafetensorsHeader::reindex() {
  by_name.resize(tensors.size());
  for (size_t i = 0; i < by_name.size(); ++i) by_name[i] = i;
  std::sort(by_name.begin(), by_name.end(),
            [&](size_t a, size_t b) { return tensors[a].name < tensors[b].name; });
}

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

SafetensorsHeader parse_header(std::string_view text, uint64_t file_size, std::string_view source) {
  SafetensorsHeader h;
  h.header_size = text.size();
  if (8 + text.size() > file_size) {
    throw corrupt(source, fmt::format("header of {} bytes runs past the end of the file ({} bytes)",
                                      text.size(), file_size));
  }
  if (text.empty() || text[0] != '{') {
    throw corrupt(source, "the header does not start with '{' at byte offset 8");
  }
  nlohmann::json j = parse_strict_json(text, source);
  if (!j.is_object()) throw corrupt(source, "the header is not a JSON object");

  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == kMetadataKeyName) {
      if (!v.is_object()) {
        throw corrupt(source,
                      fmt::format("\"__metadata__\" at byte offset {} is not an object of strings",
                                  key_offset(text, name)));
      }
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          throw corrupt(source,
                        fmt::format("\"__metadata__\" entry \"{}\" at byte offset {} is a {}, not "
                                    "a string",
                                    m.key(), key_offset(text, m.key()), m.value().type_name()));
        }
        h.metadata.emplace(m.key(), m.value().get<std::string>());
      }
      continue;
    }
    auto bad = [&](const std::string& what) {
      return corrupt(source, fmt::format("tensor \"{}\" at header byte offset {}: {}", name,
                                         key_offset(text, name), what));
    };
    if (!v.is_object()) throw bad(fmt::format("entry is a {}, not an object", v.type_name()));
    for (auto f = v.begin(); f != v.end(); ++f) {
      if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets") {
        throw bad(fmt::format("unknown field \"{}\"", f.key()));
      }
    }
    TensorInfo t;
    t.name = name;
    auto d = v.find("dtype");
    if (d == v.end() || !d->is_string()) throw bad("missing or non-string \"dtype\"");
    auto dt = parse_dtype(d->get<std::string>());
    if (!dt) throw bad(fmt::format("unknown dtype {}", d->dump()));
    t.dtype = *dt;
    auto s = v.find("shape");
    if (s == v.end() || !s->is_array()) throw bad("missing or non-array \"shape\"");
    for (const auto& dim : *s) {
      uint64_t x;
      if (!get_u64(dim, x)) throw bad(fmt::format("shape dimension {} is not a size", dim.dump()));
      t.shape.push_back(x);
    }
    auto o = v.find("data_offsets");
    if (o == v.end() || !o->is_array() || o->size() != 2 || !get_u64((*o)[0], t.begin) ||
        !get_u64((*o)[1], t.end)) {
      throw bad("\"data_offsets\" is not a pair of byte offsets");
    }
    if (t.end < t.begin) {
      throw bad(fmt::format("data_offsets [{}, {}] end before they begin", t.begin, t.end));
    }
    uint64_t n = 1, bytes = 0;
    bool overflow = false;
    for (uint64_t dim : t.shape) overflow = overflow || mul_overflows(n, dim, n);
    overflow = overflow || mul_overflows(n, dtype_size(t.dtype), bytes);
    if (overflow) throw bad(fmt::format("shape {} is too large", shape_str(t.shape)));
    if (bytes != t.nbytes()) {
      throw bad(fmt::format("{}{} needs {} bytes but data_offsets [{}, {}] hold {}",
                            dtype_name(t.dtype), shape_str(t.shape), bytes, t.begin, t.end,
                            t.nbytes()));
    }
    h.tensors.push_back(std::move(t));
  }

  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
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
  h.reindex();
  return h;
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

FileLayout layout_file(std::vector<TensorDescriptor> tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) {
    size_t sa = dtype_size(a.dtype), sb = dtype_size(b.dtype);
    if (sa != sb) return sa > sb;
    return a.name < b.name;
  });
  FileLayout out;
  out.parsed.tensors.reserve(tensors.size());
  // Names seen so far, to refuse duplicates in O(1) each; views into
  // `tensors`, which is not changed after the sort.
  std::unordered_set<std::string_view> seen;
  seen.reserve(tensors.size());
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name == kMetadataKeyName) {
      throw Error(ErrorCode::kInvalidArgument, "a tensor may not be named \"__metadata__\"");
    }
    if (!seen.insert(t.name).second) {
      throw Error(ErrorCode::kInvalidArgument, fmt::format("duplicate tensor \"{}\"", t.name));
    }
    TensorInfo info;
    info.name = t.name;
    info.dtype = t.dtype;
    info.shape = t.shape;
    info.begin = offset;
    uint64_t bytes = byte_size(t.dtype, t.shape);
    if (__builtin_add_overflow(offset, bytes, &info.end)) {
      throw Error(ErrorCode::kInvalidArgument, "the state is larger than 2^64 bytes");
    }
    offset = info.end;
    out.parsed.tensors.push_back(std::move(info));
  }
  // The header text, written entry by entry in the same bytes as dumping one
  // nlohmann::ordered_json object would give (compact, keys in this order),
  // without building that object: its lookups are linear, so n tensors cost
  // O(n^2).
  std::string text = "{";
  try {
    if (!metadata.empty()) {
      text += nlohmann::json(std::string(kMetadataKeyName)).dump();
      text += ':';
      text += nlohmann::json(metadata).dump();
    }
    for (const auto& t : out.parsed.tensors) {
      if (text.size() > 1) text += ',';
      text += nlohmann::json(t.name).dump();
      text += fmt::format(R"(:{{"dtype":"{}","shape":[{}],"data_offsets":[{},{}]}})",
                          dtype_name(t.dtype), fmt::join(t.shape, ","), t.begin, t.end);
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("a tensor name or metadata string is not valid UTF-8: {}", e.what()));
  }
  text += '}';
  size_t padded = (text.size() + 8 + 7) / 8 * 8 - 8;
  text.resize(padded, ' ');
  if (text.size() > kMaxHeaderSize) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("the header would be {} bytes, over the {} byte limit", text.size(),
                            kMaxHeaderSize));
  }
  out.header.resize(8);
  uint64_t n = text.size();
  for (size_t i = 0; i < 8; ++i) out.header[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out.header += text;
  out.parsed.header_size = n;
  out.parsed.data_size = offset;
  out.parsed.metadata = metadata;
  out.parsed.reindex();
  return out;
}

}  // namespace cairn
