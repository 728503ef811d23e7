// The contents the crash worker writes, derived from a seed stored in the
// checkpoint's metrics, so the test can tell whether a loaded file is exactly
// what was saved.
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <string>

#include "cairn/checkpoint.h"

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

// What is wrong with the metadata of the crash worker's committed
// checkpoint, if anything. A kill in one of its metadata updates must leave
// the metadata before or after it, never neither: none, the first update's
// (the seed and an 8 KiB pad) or both's (the seed again), each carrying the
// seed of the checkpoint's own metrics.
inline std::optional<std::string> crash_metadata_problem(const Checkpoint& checkpoint) {
  try {
    const nlohmann::json meta = checkpoint.get_metadata();
    const uint64_t seed = checkpoint.manifest().metrics.at("seed").get<uint64_t>();
    if (meta.empty()) return std::nullopt;
    const bool whole = meta.value("touched", uint64_t{0}) == seed &&
                       meta.value("pad", std::string()).size() == 8192 &&
                       meta.value("again", seed) == seed && meta.size() <= 3;
    if (!whole) return checkpoint.uri() + ": metadata of neither update: " + meta.dump();
    return std::nullopt;
  } catch (const std::exception& e) {
    return checkpoint.uri() + ": metadata lost to the kill: " + e.what();
  }
}

}  // namespace cairn::testing
