#include "util/json.h"

#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cairn/error.h"

namespace cairn {

namespace {

[[noreturn]] void corrupt(std::string_view source, std::string_view why) {
  throw Error(ErrorCode::kCorruption, fmt::format("{}: {}", source, why));
}

}  // namespace

// One pass over the text outside nlohmann: nesting depth and NUL bytes.
// Strings are skipped with their escapes, so brackets inside them do not
// count; whatever else is malformed is left for the parser to report.
void check_json_text(std::string_view text, std::string_view source, JsonLimits limits,
                     size_t base_offset) {
  if (text.size() > limits.max_bytes) {
    corrupt(source, fmt::format("JSON of {} bytes exceeds the limit of {} bytes", text.size(),
                                limits.max_bytes));
  }
  const size_t b = base_offset;
  size_t depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\0') corrupt(source, fmt::format("NUL byte at byte offset {} in JSON", b + i));
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, whatever it is; a NUL there is caught below
        if (i < text.size() && text[i] == '\0') {
          corrupt(source, fmt::format("NUL byte at byte offset {} in JSON", b + i));
        }
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        if (++depth > limits.max_depth) {
          corrupt(source, fmt::format("JSON nested deeper than {} levels at byte offset {}",
                                      limits.max_depth, b + i));
        }
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;
        break;
      default:
        break;
    }
  }
}

nlohmann::json parse_json(std::string_view text, std::string_view source, JsonLimits limits) {
  check_json_text(text, source, limits);
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    corrupt(source, fmt::format("not valid JSON at byte offset {}: {}", e.byte > 0 ? e.byte - 1 : 0,
                                e.what()));
  } catch (const nlohmann::json::exception& e) {
    corrupt(source, fmt::format("not valid JSON: {}", e.what()));
  }
}

namespace {

// Length of the well-formed UTF-8 sequence at s[i], or 0 if there is none.
size_t utf8_sequence_at(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return 1;
  size_t n;
  uint32_t cp;
  if ((b & 0xE0) == 0xC0) {
    n = 1;
    cp = b & 0x1F;
  } else if ((b & 0xF0) == 0xE0) {
    n = 2;
    cp = b & 0x0F;
  } else if ((b & 0xF8) == 0xF0) {
    n = 3;
    cp = b & 0x07;
  } else {
    return 0;
  }
  if (i + n >= s.size()) return 0;  // truncated sequence
  for (size_t k = 1; k <= n; ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    if ((c & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (c & 0x3F);
  }
  static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n + 1;
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence_at(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string printable(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence_at(s, i);
    if (n == 0) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(s[i]));
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

void check_storable_json(const nlohmann::json& value, std::string_view what, JsonLimits limits) {
  // Iterative, so a document too deep to recurse over is refused, not a crash.
  std::vector<std::pair<const nlohmann::json*, size_t>> stack{{&value, 0}};
  while (!stack.empty()) {
    auto [j, depth] = stack.back();
    stack.pop_back();
    if (j->is_string() && !is_valid_utf8(j->get_ref<const std::string&>())) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: a string value is not valid UTF-8", what));
    }
    if (!j->is_structured()) continue;
    if (depth + 1 > limits.max_depth) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: JSON nested deeper than {} levels", what, limits.max_depth));
    }
    if (j->is_object()) {
      for (auto it = j->begin(); it != j->end(); ++it) {
        if (!is_valid_utf8(it.key())) {
          throw Error(ErrorCode::kInvalidArgument,
                      fmt::format("{}: a key is not valid UTF-8", what));
        }
      }
    }
    for (const auto& child : *j) stack.emplace_back(&child, depth + 1);
  }
}

std::string dump_for_output(const nlohmann::json& value, int indent) {
  return value.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace cairn
