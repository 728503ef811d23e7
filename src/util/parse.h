// Small pure parsers shared by the parts of Cairn that read names and keys.
#pragma once

#include <charconv>
#include <cstdint>
#include <optional>
#include <string_view>
#include <system_error>

namespace cairn {

// The value of `digits` when it is one or more decimal digits and nothing
// else (no sign, no space) that fit in 64 bits; nullopt otherwise.
inline std::optional<uint64_t> parse_decimal(std::string_view digits) {
  uint64_t v = 0;
  if (digits.empty() || digits.front() < '0' || digits.front() > '9') return std::nullopt;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return v;
}

}  // namespace cairn
