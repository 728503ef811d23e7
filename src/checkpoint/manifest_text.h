// Internal: reading a checkpoint's manifest as stored, for the readers that
// decide what is committed (Checkpoint, the manager's open and gc, `cairn`
// ls/verify, copies). A manifest that is not whole (Manifest::torn) is never
// a commit: its checkpoint is a leftover of an interrupted commit.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "cairn/checkpoint.h"
#include "cairn/storage.h"

namespace cairn {

// The bytes at `key` (a checkpoint's kManifestKey by default), or nullopt
// when there is no such object (also when it went away since a listing).
// Other storage errors propagate.
std::optional<std::string> read_manifest_text(Storage& storage,
                                              std::string_view key = kManifestKey);

// The bytes at `key` when they are a whole manifest; nullopt when absent or
// torn, with `why` (when given) set to the reason for a torn one.
std::optional<std::string> read_whole_manifest(Storage& storage,
                                               std::string_view key = kManifestKey,
                                               std::string* why = nullptr);

}  // namespace cairn
