// Streaming object copies with checksums, shared by checkpoint copies,
// verification and commits.
#pragma once

#include <string_view>
#include <vector>

#include "cairn/checkpoint.h"
#include "cairn/storage.h"

namespace cairn {

// Reads object `key` of `src` front to back in large blocks, feeding `dst`
// when given, and returns its size and XXH3-64. `dst` is not committed.
ManifestEntry stream_object(Storage& src, std::string_view key, Writer* dst);

// Copies every user file of `source` into `dest` and returns their entries:
// what CheckpointWriter::copy_from does (and documents), without its check
// that the destination is no committed checkpoint, for a caller that owns
// the destination (a location its driver reserved) and records the entries
// itself. Nothing is committed.
std::vector<ManifestEntry> copy_files(const Checkpoint& source, Storage& dest);

// A file name a manifest can hold: a safe key, outside .cairn/, valid UTF-8.
// kInvalidArgument naming the path otherwise.
void check_user_path(std::string_view path);

// For a source on the local file system: kInvalidArgument naming the file if
// `key` is a symbolic link that leads outside the source's root (the user
// asked to save that directory, not what a link points to).
void check_inside(const Storage& source, std::string_view key);

}  // namespace cairn
