// Rounding for direct I/O, whose offsets, lengths and buffers must be
// multiples of an alignment.
#pragma once

#include <cstdint>

namespace cairn {

// The smallest multiple of `a` (> 0) that is at least `n`.
constexpr uint64_t round_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

}  // namespace cairn
