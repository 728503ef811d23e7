// Re-sharding (cairn_bench --reshard): the transformer state is saved by 2
// ranks (every tensor split along its first dimension) and loaded by 4, each
// new rank from a cold page cache. Reports the bytes read from the disk
// (/proc/self/io read_bytes) against the bytes loaded: with the manifest's
// block checksums a rank reads and verifies only the part of a rank file it
// needs (target <= 1.1x), where checking the whole file's checksum read
// every rank file whole (2x).
#pragma once

#include <vector>

#include "bench_util.h"

namespace cairn::bench {

int bench_reshard(const Options& opts, const std::vector<TensorSpec>& specs,
                  const std::vector<FloatBuffer>& state);

}  // namespace cairn::bench
