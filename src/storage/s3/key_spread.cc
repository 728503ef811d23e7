#include "storage/s3/key_spread.h"

#include <charconv>

#include <fmt/format.h>

#include "cairn/error.h"
#include "util/hash.h"

namespace cairn::s3 {

KeySpread::KeySpread(uint32_t prefixes) : n_(prefixes), digits_(1) {
  if (prefixes < 1 || prefixes > kMaxPrefixes) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{} key prefixes: expected 1 to {}", prefixes, kMaxPrefixes));
  }
  for (uint32_t top = n_ - 1; top >= 16; top /= 16) ++digits_;
}

std::string KeySpread::prefix(uint32_t i) const {
  if (n_ == 1) return "";
  return fmt::format("{:0{}x}-of-{}/", i, digits_, n_);
}

std::string KeySpread::stored(std::string_view key) const {
  if (n_ == 1) return std::string(key);
  return prefix(static_cast<uint32_t>(xxh3_64(key) % n_)) + std::string(key);
}

std::optional<std::string> KeySpread::key_of(std::string_view stored) const {
  if (n_ == 1) return std::string(stored);
  const size_t slash = stored.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  const std::string_view head = stored.substr(0, slash);
  const std::string suffix = fmt::format("-of-{}", n_);
  if (head.size() != static_cast<size_t>(digits_) + suffix.size() || !head.ends_with(suffix)) {
    return std::nullopt;
  }
  uint32_t i = 0;
  const char* begin = head.data();
  const char* end = begin + digits_;
  auto [p, ec] = std::from_chars(begin, end, i, 16);
  if (ec != std::errc() || p != end || i >= n_ || stored.substr(0, slash + 1) != prefix(i)) {
    return std::nullopt;
  }
  std::string key(stored.substr(slash + 1));
  // Only the name this key is stored under: a key placed by hand under
  // another prefix is not one of ours.
  if (xxh3_64(key) % n_ != i) return std::nullopt;
  return key;
}

std::vector<std::string> KeySpread::listing_prefixes(std::string_view key_prefix) const {
  std::vector<std::string> out;
  out.reserve(n_);
  for (uint32_t i = 0; i < n_; ++i) out.push_back(prefix(i) + std::string(key_prefix));
  return out;
}

}  // namespace cairn::s3
