// Internal: a manifest entry's JSON form, shared by manifests and by the
// sharded engine's per-rank reports (which carry entries between processes).
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "cairn/checkpoint.h"

namespace cairn {

// {"path", "size", "xxh3"} and, when the entry has block checksums,
// "blocks": {"size": B, "xxh3": "<16 hex digits per block>"}.
nlohmann::json entry_to_json(const ManifestEntry& e);
// Reads "blocks" of `f` into `e` (e.size already set); absent is fine.
// kCorruption "<source>: <where> ..." when malformed.
void parse_entry_blocks(const nlohmann::json& f, ManifestEntry& e, std::string_view source,
                        std::string_view where);

}  // namespace cairn
