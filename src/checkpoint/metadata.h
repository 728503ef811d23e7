// A checkpoint's user metadata as stored (`.cairn/metadata.json`), for the
// readers that need its text as well as its value: Checkpoint::get_metadata
// and the copies of `cairn cp` (experiment/transfer.cc), which copy what
// get_metadata() reads.
//
// Thread-safety: as the Storage. Failure: throws cairn::Error (below).
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "cairn/storage.h"

namespace cairn {

struct StoredMetadata {
  std::string text;      // as stored
  nlohmann::json value;  // parsed: a JSON object
};

// The metadata of the checkpoint at `storage`: kMetadataKey, or, on a store
// that tears writes (StorageCapabilities::torn_writes) when a killed replace
// tore it, the metadata that replace was overwriting (kMetadataPreviousKey).
// nullopt when the checkpoint has none. kCorruption naming the metadata file
// when it is not a JSON object and nothing replaces it.
std::optional<StoredMetadata> read_checkpoint_metadata(Storage& storage);

}  // namespace cairn
