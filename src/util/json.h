// Bounded JSON parsing for everything Cairn reads back: manifests, histories,
// metadata, trainer state, safetensors headers and control-plane messages.
//
// nlohmann::json parses iteratively, but copying, comparing, dumping and
// destroying a document recurse once per nesting level, so a stored file
// nested 100,000 levels deep overflows the stack long after it was
// "parsed". Its lexer also treats a NUL byte as the end of the input, so
// `{} \0 garbage` parses as `{}`. parse_json() refuses both up front, and
// bounds the size, before nlohmann sees the text.
//
// Pure functions, no I/O; thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace cairn {

struct JsonLimits {
  // Deepest nesting of arrays and objects accepted. Cairn's own documents
  // need fewer than 10 levels; user metrics and metadata get room to spare.
  size_t max_depth = 128;
  // Largest text accepted, in bytes.
  size_t max_bytes = size_t{256} << 20;
};

// Parses `text` as one JSON document. Throws Error kCorruption naming `source`
// (a URI, or a peer) and the byte offset at fault when the text is too large,
// nested too deeply, contains a NUL byte, or is not valid JSON (including
// invalid UTF-8 in a string).
nlohmann::json parse_json(std::string_view text, std::string_view source, JsonLimits limits = {});

// The checks parse_json() makes before it parses (size, depth, NUL bytes),
// for parsers that need their own nlohmann callback. `base_offset` is added
// to the byte offsets in messages (a safetensors header starts at byte 8).
void check_json_text(std::string_view text, std::string_view source, JsonLimits limits = {},
                     size_t base_offset = 0);

// Checks that a document built in memory (user metrics, metadata) can be
// stored and read back: nesting within limits.max_depth and every string
// valid UTF-8. Throws Error kInvalidArgument naming `what` otherwise.
void check_storable_json(const nlohmann::json& value, std::string_view what,
                         JsonLimits limits = {});

// `value` serialized; never throws on invalid UTF-8 (such bytes become
// U+FFFD), for output meant for people and scripts rather than storage.
std::string dump_for_output(const nlohmann::json& value, int indent = -1);

// Whether `s` is well-formed UTF-8 (no overlong forms, no surrogates).
bool is_valid_utf8(std::string_view s);

// `s` with every byte that is not part of well-formed UTF-8 written as \xNN,
// for error messages that name a file whose name is not UTF-8.
std::string printable(std::string_view s);

}  // namespace cairn
