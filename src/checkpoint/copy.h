// Streaming object copies with checksums, shared by checkpoint copies,
// verification and commits.
#pragma once

#include <string_view>

#include "cairn/checkpoint.h"
#include "cairn/storage.h"

namespace cairn {

// Reads object `key` of `src` front to back in large blocks, feeding `dst`
// when given, and returns its size and XXH3-64. `dst` is not committed.
ManifestEntry stream_object(Storage& src, std::string_view key, Writer* dst);

}  // namespace cairn
