// Checkpoint: a directory of the user's files at some (storage, path).
//
// A checkpoint's contents are the user's: any files, any format. Cairn keeps
// its own files under ".cairn/" inside the directory:
//
//   .cairn/manifest.json   written last by a commit; lists every file with its
//                          size and xxh3-64 checksum. Its presence, whole
//                          (Manifest::torn), is what makes a checkpoint
//                          committed (visible). See commit.h.
//   .cairn/metadata.json   the user's JSON metadata (get/set/update_metadata).
//
// A Checkpoint object is a cheap, copyable handle; it holds no open files.
//
// Thread-safety: const methods may run concurrently. Metadata updates through
// one process are serialized; across processes the last writer wins, but a
// reader never sees a torn metadata file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cairn/storage.h"

namespace cairn {

inline constexpr std::string_view kManifestKey = ".cairn/manifest.json";
inline constexpr std::string_view kMetadataKey = ".cairn/metadata.json";
// On a store that can tear a write (StorageCapabilities::torn_writes), the
// metadata a replace is about to overwrite, kept until the next replace so
// that a torn kMetadataKey still leaves the previous metadata readable.
inline constexpr std::string_view kMetadataPreviousKey = ".cairn/metadata.previous.json";
// The file from_dict() writes and to_dict() reads.
inline constexpr std::string_view kDictFileName = "dict.json";
inline constexpr std::string_view kCairnDir = ".cairn";

struct ManifestEntry {
  std::string path;  // relative key inside the checkpoint
  uint64_t size = 0;
  uint64_t xxh3 = 0;  // XXH3-64 of the contents
  // Optional: the XXH3-64 of every `block_size` bytes (the last block may be
  // shorter), so that a partial read verifies the blocks it reads without
  // reading the rest. Written by the tensor engine's saves; empty (and
  // block_size 0) for other files and for checkpoints from older versions.
  uint64_t block_size = 0;
  std::vector<uint64_t> block_xxh3 = {};
};
// Bytes per block of ManifestEntry::block_xxh3 in the engine's saves.
inline constexpr uint64_t kChecksumBlockSize = uint64_t{128} << 10;

struct Manifest {
  int version = 1;
  double created_at = 0.0;           // seconds since the Unix epoch
  nlohmann::json metrics;            // what was reported with the checkpoint (object or null)
  nlohmann::json layout;             // optional writer-defined layout, e.g. a sharded
                                     // save's global tensor layout (null when unused)
  std::vector<ManifestEntry> files;  // sorted by path
  // For a checkpoint a Trainer's ranks wrote together: {"world_size": W,
  // "contributed": [ranks that passed files, ascending]} (null otherwise).
  // The driver commits only a round whose ranks all agreed on what they were
  // saving (docs/train.md, "Preemption"); this says who took part.
  nlohmann::json ranks;

  uint64_t total_bytes() const;
  // The manifest's text. It proves itself whole: its last member,
  // "self_check": {"bytes": N, "xxh3": H}, holds the length N and XXH3-64 H
  // of every byte before the member (docs/format.md, "The manifest").
  std::string to_json() const;
  // Why `text` is not a whole manifest, or nullopt when it is. Not whole:
  // empty, holding NUL bytes, or not JSON (a write cut short: no proper
  // prefix of the manifest is JSON). Whole JSON whose "self_check" its bytes
  // do not match was damaged after the commit: that is corruption, which
  // parse() reports and nothing removes. (Too large or nested too deeply is
  // malformed, not torn.) A JSON object without "self_check" (written by an
  // earlier version) is whole. A text that is not whole is a commit's only
  // where the store can tear a write (StorageCapabilities::torn_writes): there
  // readers treat its checkpoint as uncommitted, a leftover that the manager's
  // open and `cairn gc` remove unless the history lists it. Everywhere else
  // it is damage after the commit, reported and never removed. (A whole text
  // can still be a malformed manifest, which parse() refuses.)
  static std::optional<std::string> torn(std::string_view text);
  // Parses and validates: a whole text (torn() is nullopt), well-formed JSON,
  // known version, every path a safe relative key (no "..", no absolute
  // path), no duplicates. Throws kCorruption naming `source` and the entry
  // at fault.
  static Manifest parse(std::string_view text, std::string_view source);
};

struct VerifyProblem {
  std::string path;    // the file at fault, relative to the checkpoint
  std::string reason;  // "missing", "size 10, manifest says 12", ...
};

// A scoped local view of a checkpoint (as_directory). For a checkpoint on the
// local file system path() is the checkpoint's own directory. Otherwise it is
// a node-local copy under $CAIRN_CACHE_DIR (default $TMPDIR/cairn-views-<uid>)
// shared by every process on the node that asks for the same checkpoint:
// exactly one downloads, the others wait and receive the same directory, and
// it is removed when the last user, in any process, releases it. Treat it as
// read-only. Copies of a LocalDirectory share one hold.
class LocalDirectory {
 public:
  LocalDirectory() = default;
  const std::filesystem::path& path() const { return path_; }

 private:
  friend class Checkpoint;
  std::filesystem::path path_;
  std::shared_ptr<void> owner_;  // removes a temporary copy on release
};

class Checkpoint {
 public:
  // A checkpoint at a local path or URI ("file:///x", "memory://m/x"). The
  // directory need not exist yet (a new checkpoint to fill) unless read.
  static Checkpoint from_directory(std::string_view path_or_uri);
  // The checkpoint rooted at `storage` (see Storage::child).
  explicit Checkpoint(std::shared_ptr<Storage> storage);

  // In-memory checkpoints, for small state, without a temporary directory
  // (Ray's Checkpoint.from_dict). in_memory() is an empty one to fill with
  // any writer; from_dict() one holding `dict` as kDictFileName (a JSON
  // object; kInvalidArgument otherwise). Each lives in memory of its own,
  // shared by its copies and freed with the last; its uri() is for messages
  // only. Reported through train::report(), its files are uploaded like any
  // other checkpoint's.
  static Checkpoint in_memory();
  static Checkpoint from_dict(const nlohmann::json& dict);
  // The dict a from_dict() checkpoint holds, from any checkpoint (in memory,
  // local, or stored): kNotFound naming the file if it has no
  // kDictFileName, kCorruption if that is not a JSON object.
  nlohmann::json to_dict() const;

  std::string uri() const { return storage_->uri(); }
  Storage& storage() const { return *storage_; }
  const std::shared_ptr<Storage>& storage_ptr() const { return storage_; }

  // Local view; see LocalDirectory. Throws if the checkpoint cannot be read.
  LocalDirectory as_directory() const;
  // A full copy into `dest` (created if missing; must be empty), or into a new
  // temporary directory the caller owns when `dest` is empty. Cairn's manifest
  // is not copied (the copy is a plain, uncommitted directory); metadata is.
  // Committed checkpoints are verified while copied.
  std::filesystem::path to_directory(const std::filesystem::path& dest = {}) const;

  // Metadata. get_metadata() of a checkpoint without metadata is an empty
  // object; metadata that is not a JSON object is kCorruption naming the file.
  // Replacing it is crash-safe: a process killed in set_metadata() or
  // update_metadata() leaves the previous metadata or the new one, never
  // neither. Stores replace objects atomically (storage.h); on one that can
  // tear a write, the metadata being replaced is first kept as
  // kMetadataPreviousKey, and get_metadata() reads it when kMetadataKey is
  // torn (not a whole JSON object).
  nlohmann::json get_metadata() const;
  void set_metadata(const nlohmann::json& metadata) const;  // atomic replace
  // Merges the top-level keys of `patch` into the metadata; atomic.
  void update_metadata(const nlohmann::json& patch) const;

  // The user's files (everything except Cairn's manifest and metadata).
  std::vector<ObjectInfo> files() const;

  // Whether the checkpoint was committed: it holds a manifest that is whole
  // (Manifest::torn), or any manifest at all on a store that never tears a
  // write (StorageCapabilities::torn_writes), where an unreadable one is
  // damage to a commit. One read of the manifest.
  bool is_committed() const;
  // The manifest of a committed checkpoint; kNotFound if it is not committed
  // (no manifest, or a torn one on a store that tears writes: the message
  // says which); kCorruption naming the manifest if it is malformed or,
  // where stores never tear writes, unreadable (damaged after the commit).
  Manifest manifest() const;
  // Checks every file in the manifest. Empty result: the checkpoint is whole.
  std::vector<VerifyProblem> verify() const;
  // The same against `manifest`, already read by the caller (manifest()).
  std::vector<VerifyProblem> verify(const Manifest& manifest) const;

 private:
  std::shared_ptr<Storage> storage_;
};

}  // namespace cairn
