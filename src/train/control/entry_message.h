// A manifest entry as the control messages carry it between processes (a
// rank's "uploaded", the memory tier's operations across hosts):
// {"path", "size", "xxh3"}, the checksum as a number. nlohmann's exceptions
// for a field missing or of the wrong type reach the caller, which names the
// peer that sent it.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "cairn/checkpoint.h"

namespace cairn::train_internal {

inline nlohmann::json entry_message(const ManifestEntry& e) {
  return {{"path", e.path}, {"size", e.size}, {"xxh3", e.xxh3}};
}

inline ManifestEntry entry_of_message(const nlohmann::json& j) {
  ManifestEntry e;
  e.path = j.at("path").get<std::string>();
  e.size = j.at("size").get<uint64_t>();
  e.xxh3 = j.at("xxh3").get<uint64_t>();
  return e;
}

}  // namespace cairn::train_internal
