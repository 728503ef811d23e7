// The contents the crash worker writes, derived from a seed stored in the
// checkpoint's metrics, so the test can tell whether a loaded file is exactly
// what was saved.
#pragma once

#include <cstdint>
#include <string>

namespace cairn::testing {

inline std::string crash_pattern(uint64_t seed, int file, uint64_t size) {
  std::string out(size, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(file) + 1;
  for (uint64_t i = 0; i < size; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[i] = static_cast<char>(x);
  }
  return out;
}

}  // namespace cairn::testing
