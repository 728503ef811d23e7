#include <fmt/format.h>

#include "cairn/manager.h"
#include "util/parse.h"

namespace cairn {

namespace {
constexpr std::string_view kPrefix = "checkpoint_";
}

// Six digits up to 999,999; past that a letter says how many more digits follow
// ('a' = 7, 'b' = 8, ...), so byte order stays index order.
std::string checkpoint_name(uint64_t index) {
  if (index <= 999'999) return fmt::format("{}{:06d}", kPrefix, index);
  std::string digits = std::to_string(index);
  char width = static_cast<char>('a' + (digits.size() - 7));
  return fmt::format("{}{}{}", kPrefix, width, digits);
}

std::optional<uint64_t> parse_checkpoint_name(std::string_view name) {
  if (name.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  std::string_view rest = name.substr(kPrefix.size());
  size_t width = 6;
  if (!rest.empty() && rest.front() >= 'a' && rest.front() <= 'n') {
    width = 7 + static_cast<size_t>(rest.front() - 'a');
    rest.remove_prefix(1);
    if (rest.empty() || rest.front() == '0') return std::nullopt;
  }
  if (rest.size() != width) return std::nullopt;
  std::optional<uint64_t> value = parse_decimal(rest);
  if (!value || (width > 6 && *value <= 999'999)) return std::nullopt;
  return value;
}

}  // namespace cairn
