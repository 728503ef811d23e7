// The fast path of the safetensors header parser.
//
// Every writer in use (Cairn, the reference Python and Rust writers, Hugging
// Face) emits headers in one plain form; a general JSON parser spends most
// of a 100,000-tensor load lexing them (nlohmann: ~100 MB/s). The scanner
// reads that form only, in one pass, and hands anything else — valid JSON or
// not — to the general parser, whose verdict and messages stand. It never
// refuses a header on its own. Pure functions, no I/O; thread-safe.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/safetensors.h"

namespace cairn::format {

struct HeaderEntries {
  std::vector<TensorInfo> tensors;  // in the order of the text
  std::map<std::string, std::string> metadata;
};

// Reads `text` (any bytes) if it has the plain form: one JSON object of "__metadata__" (an object
// of strings, each key once) and tensor entries, each an object with exactly "dtype" (a known
// dtype), "shape" (an array of integers) and "data_offsets" (two integers),
// in any order, whose byte counts agree (entry_size_problem() is empty);
// strings without escapes and in well-formed UTF-8; integers without sign,
// fraction or exponent that fit 64 bits; JSON whitespace between any tokens
// and after the object (so no NUL byte anywhere, and three levels of
// nesting at most). Returns nullopt for any other text. Whatever it
// accepts, the general parser reads to the same tensors and metadata (the
// fuzz target checks this). Duplicate tensor names are left to the caller,
// which checks them for both parsers.
std::optional<HeaderEntries> scan_plain_header(std::string_view text);

// What is wrong with the sizes of an entry whose dtype, shape and offsets
// were read: offsets that end before they begin, a shape whose byte count
// overflows, or a byte count that differs from the offsets. "" if nothing.
std::string entry_size_problem(const TensorInfo& t);

// parse_header() without the scanner: the general parser alone. For tests
// and the fuzz target, which check that both give the same answer.
SafetensorsHeader parse_header_general(std::string_view text, uint64_t file_size,
                                       std::string_view source);

}  // namespace cairn::format
