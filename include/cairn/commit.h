// Writing and committing checkpoints. The protocol is written out at the top
// of src/checkpoint/commit.cc; in short: every file is written and made
// durable first, the manifest is written last and is what makes the
// checkpoint visible, and deletion removes the manifest first.
//
// Thread-safety: a CheckpointWriter may be fed from several threads at once
// (each file by one thread); commit() must be called once, after every file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cairn/checkpoint.h"

namespace cairn {

// Streams files into an uncommitted checkpoint, checksumming them on the way.
class CheckpointWriter {
 public:
  // `dest` must not be committed (kAlreadyExists otherwise).
  explicit CheckpointWriter(Checkpoint dest);

  // Writes `bytes` as file `path` (a safe relative key) and returns its entry.
  ManifestEntry write_file(std::string_view path, std::string_view bytes);
  // Copies a local file in, in large blocks.
  ManifestEntry copy_local_file(std::string_view path, const std::filesystem::path& local);
  // Copies every user file of `source` (a local or remote checkpoint) and
  // returns their entries. Files of a committed source are checked against
  // its manifest while copied. Before anything is written: a source that does
  // not exist is kNotFound (a local path that is not a directory
  // kInvalidArgument); a file name that is not valid UTF-8, or a symbolic
  // link whose target leaves a local source, is kInvalidArgument naming it.
  std::vector<ManifestEntry> copy_from(const Checkpoint& source);
  // Records a file already written by someone else (a worker process) into
  // the destination, after checking that it exists with the given size.
  void add_written(const ManifestEntry& entry);
  // The same for many files, checked against one listing of the destination
  // (on S3 one request per 1,000 files instead of one per file: a commit of
  // 1,024 ranks' files is 2 requests, not 1,024); a file the listing does
  // not show is looked up on its own before it counts as missing, so a
  // listing that lags behind a write is no false alarm. Throws as above,
  // naming the first file at fault; nothing is recorded then.
  void add_written(const std::vector<ManifestEntry>& entries);
  // Records files that other hosts hold in their own copies of the
  // destination, unchecked: whoever wrote and moved them checked their
  // sizes and checksums (the memory tier across hosts, docs/memory-tier.md).
  // kInvalidArgument naming a path a manifest cannot hold.
  void add_held_elsewhere(const std::vector<ManifestEntry>& entries);

  // Sets Manifest::layout for the commit (a sharded save's global layout).
  void set_layout(nlohmann::json layout);
  // Sets Manifest::ranks for the commit (the ranks of a distributed save).
  void set_ranks(nlohmann::json ranks);

  // Writes metadata (optional), then the manifest: the checkpoint is visible
  // and durable when this returns. `created_at` is seconds since the epoch.
  Manifest commit(const nlohmann::json& metrics, double created_at,
                  const nlohmann::json* metadata = nullptr);

  const Checkpoint& destination() const { return dest_; }

 private:
  ManifestEntry record(ManifestEntry entry);
  Checkpoint dest_;
  std::mutex mu_;
  std::vector<ManifestEntry> entries_;
  nlohmann::json layout_;
  nlohmann::json ranks_;
  bool committed_ = false;
};

// Streams one file into an uncommitted checkpoint piece by piece, so that a
// writer whose bytes are never all in memory at once (a rank of a
// torch.distributed.checkpoint save) gets the file's size and XXH3-64 as it
// goes, for the committer's CheckpointWriter::add_written.
//
// Thread-safety: one thread at a time per object; objects for different
// files may be used concurrently, from several processes.
class CheckpointFileWriter {
 public:
  // Opens `path` (a safe relative key: kInvalidArgument otherwise) in
  // `dest`, which must not be committed (kAlreadyExists).
  CheckpointFileWriter(const Checkpoint& dest, std::string_view path);
  // Abandons the file unless commit() returned: nothing of it is visible.
  ~CheckpointFileWriter();
  CheckpointFileWriter(const CheckpointFileWriter&) = delete;
  CheckpointFileWriter& operator=(const CheckpointFileWriter&) = delete;

  void append(std::span<const std::byte> data);
  uint64_t size() const;
  // Makes the file durable and visible, and returns its entry. Later calls
  // are kFailedPrecondition.
  ManifestEntry commit();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Deletes a checkpoint so that it is never visible half-deleted: the manifest
// goes first (durably), then the rest. Deleting a missing one is a no-op.
void delete_checkpoint(const Checkpoint& checkpoint);

// Removes everything under an uncommitted location (leftovers of an
// interrupted save), every incomplete write under it and, on a file system,
// the location's folder itself once empty (unless it is the root the storage
// was opened at). Returns the keys removed. kFailedPrecondition if the
// location is committed.
std::vector<std::string> remove_uncommitted(const Checkpoint& leftover);

}  // namespace cairn
