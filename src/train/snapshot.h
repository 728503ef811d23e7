// A rank's checkpoint frozen by an asynchronous report() (docs/train.md,
// "Asynchronous report"): once the snapshot exists the caller may change or
// delete its checkpoint directory while the upload reads the snapshot.
#pragma once

#include <filesystem>

#include <nlohmann/json.hpp>

#include "cairn/checkpoint.h"

namespace cairn::train_internal {

struct Snapshot {
  Checkpoint checkpoint;      // a local directory holding the frozen files
  nlohmann::json metadata;    // the source's metadata when it was frozen
  uint64_t linked_files = 0;  // hard links: no data copied
  uint64_t copied_files = 0;
};

// Freezes `source` into the new directory `dir`. The files of a source on
// the local file system are hard-linked (copied where a link cannot be made:
// another file system, a link-count limit), so the snapshot costs no data
// copy; a committed source's manifest comes along so the upload verifies
// against it. An in-memory source (Checkpoint::in_memory, from_dict) is
// frozen without a copy (its objects are immutable and shared; `dir` is not
// used). A source elsewhere (S3) is copied. File names
// pass the checks an upload makes (safe keys, no link leading outside a
// local source). Throws cairn::Error naming the file at fault; `dir` may then
// hold part of the snapshot (the caller removes it).
Snapshot snapshot_checkpoint(const Checkpoint& source, const std::filesystem::path& dir);

}  // namespace cairn::train_internal
