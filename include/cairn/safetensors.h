// The safetensors file format, exactly as the Python ecosystem reads it.
//
// Layout of a file:
//
//   bytes [0, 8)        N, the header length, unsigned 64-bit little-endian
//   bytes [8, 8 + N)    the header: a UTF-8 JSON object, padded with spaces so
//                       that 8 + N is a multiple of 8
//   bytes [8 + N, end)  the data buffer: every tensor's bytes, back to back
//
// The header maps each tensor name to {"dtype": "F32", "shape": [2, 3],
// "data_offsets": [begin, end]} (offsets relative to the data buffer) and may
// hold "__metadata__", a map of strings to strings.
//
// This header is pure logic: no I/O. Parsing validates everything a reader
// must trust before touching data, and executes nothing from the file:
//   - N <= kMaxHeaderSize (100 MB, as the reference implementation) and
//     8 + N <= the file size;
//   - the header is a JSON object without duplicate keys; each tensor entry
//     has exactly dtype, shape and data_offsets; dtypes are known; shapes are
//     non-negative integers whose element count times the dtype size does not
//     overflow and equals end - begin;
//   - sorted by offsets, tensors tile the data buffer exactly: the first starts
//     at 0, each starts where the previous ended (no holes, no overlaps), and
//     the last ends at the end of the file (no trailing bytes);
//   - "__metadata__", if present, is an object whose values are all strings.
// Any violation throws cairn::Error(kCorruption) whose message names the
// source (file or URI), the tensor and the byte offset in the file.
//
// Thread-safety: every function here is pure and may be called concurrently.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace cairn {

// Element types, with the names used in files ("F32", "BF16", ...).
enum class DType : uint8_t {
  kBool,
  kU8,
  kI8,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
  kF8_E4M3,
  kF8_E5M2,
};

// The file's name for `dtype` ("F32").
std::string_view dtype_name(DType dtype);
// The dtype named `name` in a file, or nullopt if unknown.
std::optional<DType> parse_dtype(std::string_view name);
// Bytes per element (1 for BOOL and the F8 types).
size_t dtype_size(DType dtype);

// The DType of a C++ element type (bool, uint8_t ... double).
template <class T>
constexpr DType dtype_of();

using Shape = std::vector<uint64_t>;

// Product of the dimensions (1 for a scalar, shape []). Throws
// kInvalidArgument if it overflows 64 bits.
uint64_t num_elements(const Shape& shape);
// num_elements(shape) * dtype_size(dtype), overflow-checked the same way.
uint64_t byte_size(DType dtype, const Shape& shape);

inline constexpr uint64_t kMaxHeaderSize = 100'000'000;
inline constexpr std::string_view kMetadataKeyName = "__metadata__";

// One tensor as described by a header.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  Shape shape;
  uint64_t begin = 0;  // data_offsets, relative to the data buffer
  uint64_t end = 0;
  uint64_t nbytes() const { return end - begin; }
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;              // in data-offset order
  std::map<std::string, std::string> metadata;  // "__metadata__" (empty if absent)
  uint64_t header_size = 0;                     // N, including padding
  uint64_t data_size = 0;                       // bytes in the data buffer

  // Where the data buffer starts in the file: 8 + N.
  uint64_t data_start() const { return 8 + header_size; }
  uint64_t file_size() const { return data_start() + data_size; }
  // The tensor named `name`, or nullptr. O(log n) through `by_name`; a linear
  // scan when `by_name` does not have one entry per tensor.
  const TensorInfo* find(std::string_view name) const;

  // The name index find() searches: positions in `tensors`, ordered by name.
  // parse_header(), parse_file_header() and layout_file() build it, once, in
  // O(n log n). Positions rather than pointers, so a copy of the header stays
  // valid. Code that fills or changes `tensors` itself calls reindex()
  // afterwards (an index of the wrong size is ignored; one of the right size
  // but stale may miss a name, never return a wrong tensor).
  std::vector<size_t> by_name;
  // Rebuilds `by_name` from `tensors`.
  void reindex();
};

// Reads N from the first 8 bytes of a file of `file_size` bytes and checks it
// against kMaxHeaderSize and the file size. Throws kCorruption naming `source`.
uint64_t parse_header_length(std::span<const std::byte, 8> prefix, uint64_t file_size,
                             std::string_view source);

// Parses and validates the JSON header text (the N bytes after the prefix) of
// a file of `file_size` bytes. Throws kCorruption naming `source`, the tensor
// and the byte offset in the file.
SafetensorsHeader parse_header(std::string_view header_json, uint64_t file_size,
                               std::string_view source);

// Parses a whole in-memory file image's header (prefix + JSON). The data
// buffer is not read, only its size is checked.
SafetensorsHeader parse_file_header(std::span<const std::byte> file, std::string_view source);

// What a writer knows about a tensor before laying out the file.
struct TensorDescriptor {
  std::string name;
  DType dtype = DType::kU8;
  Shape shape;
};

// A file layout: the prefix + padded header bytes, and where each tensor's
// bytes go (TensorInfo offsets are relative to the data buffer).
struct FileLayout {
  std::string header;  // 8-byte length prefix + JSON + padding; size % 8 == 0
  SafetensorsHeader parsed;
};

// Lays out a file for `tensors` with `metadata` as "__metadata__" (omitted
// when empty). Tensors are placed by decreasing element size, then by name,
// so every tensor starts at an offset aligned to its element size (as the
// reference writer does); the data buffer starts 8-byte aligned. Throws
// kInvalidArgument for a duplicate name, a name equal to "__metadata__", or
// a size that overflows. An empty name is accepted ("" is a valid JSON key,
// and the reference implementation writes and reads it).
FileLayout layout_file(std::vector<TensorDescriptor> tensors,
                       const std::map<std::string, std::string>& metadata);

// Gives a layout from layout_file() new "__metadata__" strings: the header
// is rewritten in place and every tensor keeps its data offsets, so it is
// exactly what layout_file() would return for the same tensors with
// `metadata`, at the cost of one move of the header text instead of laying
// out every tensor again (a save loop changes its metadata, not its tensors).
// Throws kInvalidArgument, leaving `layout` as it was, for a string that is
// not valid UTF-8 or a header over kMaxHeaderSize.
void set_layout_metadata(FileLayout& layout, const std::map<std::string, std::string>& metadata);

// ---- implementation details of dtype_of ----
template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, bool>)
    return DType::kBool;
  else if constexpr (std::is_same_v<T, uint8_t>)
    return DType::kU8;
  else if constexpr (std::is_same_v<T, int8_t>)
    return DType::kI8;
  else if constexpr (std::is_same_v<T, int16_t>)
    return DType::kI16;
  else if constexpr (std::is_same_v<T, uint16_t>)
    return DType::kU16;
  else if constexpr (std::is_same_v<T, int32_t>)
    return DType::kI32;
  else if constexpr (std::is_same_v<T, uint32_t>)
    return DType::kU32;
  else if constexpr (std::is_same_v<T, float>)
    return DType::kF32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::kF64;
  else if constexpr (std::is_same_v<T, int64_t>)
    return DType::kI64;
  else if constexpr (std::is_same_v<T, uint64_t>)
    return DType::kU64;
  else
    static_assert(sizeof(T) == 0, "no safetensors dtype for this C++ type");
}

}  // namespace cairn
