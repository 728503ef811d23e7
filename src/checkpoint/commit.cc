// The commit protocol. A checkpoint is a location (a directory, or a key
// prefix on an object store) holding the user's files and Cairn's manifest.
//
// Save:
//   1. The destination is a fresh location that is not committed: it has no
//      ".cairn/manifest.json". (The manager never reuses a checkpoint index,
//      so a leftover of an earlier crash is never written into.)
//   2. Every file is written with Storage::open_writer and committed one by
//      one: each is durable (fsync'd with its directory, or an object store's
//      completed upload) before the next step. Its size and XXH3-64 are
//      computed from the bytes as they are written. Files written by other
//      processes (the ranks of a distributed save) are added by size and
//      checksum after a stat shows them present with that size.
//   3. The user's metadata, if any, is written to ".cairn/metadata.json".
//   4. The manifest, listing every file with its size and checksum, is written
//      last with an atomic replace (Storage::put). When put() returns the
//      checkpoint is committed: visible to readers and durable. The manifest
//      proves itself whole (its "self_check" member, Manifest::to_json), so
//      a server that keeps an interrupted PUT empty or in part never makes
//      it a commit: a torn manifest (Manifest::torn) is no manifest.
// A crash before step 4, or during it, leaves an uncommitted location.
// Readers ignore it (no whole manifest, no checkpoint); the manager removes it
// the next time the experiment is opened, and `cairn gc` removes it on
// request.
//
// Delete:
//   1. Remove the manifest, durably. From here on the checkpoint is invisible.
//   2. Remove the other objects, then any incomplete writes under it.
// A crash in step 2 leaves an uncommitted location, cleaned as above. Because
// the manifest goes first, a half-deleted checkpoint is never visible.
//
// Read: a reader trusts only files named in the manifest and checks sizes and
// checksums (Checkpoint::verify, to_directory); an extra file, a missing one
// or a changed one never passes unnoticed.
#include "cairn/commit.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <unordered_map>

#include <fmt/format.h>

#include "cairn/error.h"
#include "checkpoint/copy.h"
#include "util/hash.h"
#include "util/json.h"

namespace cairn {

CheckpointWriter::CheckpointWriter(Checkpoint dest) : dest_(std::move(dest)) {
  if (dest_.is_committed()) {
    throw Error(
        ErrorCode::kAlreadyExists,
        fmt::format("{}: already a committed checkpoint; refusing to write into it", dest_.uri()));
  }
}

ManifestEntry CheckpointWriter::record(ManifestEntry entry) {
  std::lock_guard<std::mutex> g(mu_);
  if (committed_) {
    throw Error(ErrorCode::kFailedPrecondition, fmt::format("{}: already committed", dest_.uri()));
  }
  auto same = std::find_if(entries_.begin(), entries_.end(),
                           [&](const ManifestEntry& e) { return e.path == entry.path; });
  if (same != entries_.end())
    *same = entry;
  else
    entries_.push_back(entry);
  return entry;
}

ManifestEntry CheckpointWriter::write_file(std::string_view path, std::string_view bytes) {
  check_user_path(path);
  auto w = dest_.storage().open_writer(path);
  w->append(as_bytes(bytes));
  w->commit();
  return record(ManifestEntry{std::string(path), bytes.size(), xxh3_64(bytes)});
}

ManifestEntry CheckpointWriter::copy_local_file(std::string_view path,
                                                const std::filesystem::path& local) {
  check_user_path(path);
  auto src = open_storage(local.parent_path().string());
  auto w = dest_.storage().open_writer(path);
  ManifestEntry e = stream_object(*src, local.filename().string(), w.get());
  w->commit();
  e.path = std::string(path);
  return record(std::move(e));
}

std::vector<ManifestEntry> CheckpointWriter::copy_from(const Checkpoint& source) {
  std::vector<ManifestEntry> copied;
  for (auto& e : copy_files(source, dest_.storage())) copied.push_back(record(std::move(e)));
  return copied;
}

struct CheckpointFileWriter::State {
  std::string path;
  std::string uri;
  std::unique_ptr<Writer> out;
  Hasher hash;
  uint64_t size = 0;
  bool committed = false;
};

CheckpointFileWriter::CheckpointFileWriter(const Checkpoint& dest, std::string_view path)
    : state_(std::make_unique<State>()) {
  check_user_path(path);
  if (dest.is_committed()) {
    throw Error(
        ErrorCode::kAlreadyExists,
        fmt::format("{}: already a committed checkpoint; refusing to write into it", dest.uri()));
  }
  state_->path = std::string(path);
  state_->uri = dest.storage().uri_of(path);
  state_->out = dest.storage().open_writer(path);
}

// The storage writer's own destructor abandons an uncommitted write.
CheckpointFileWriter::~CheckpointFileWriter() = default;

void CheckpointFileWriter::append(std::span<const std::byte> data) {
  if (state_->committed) {
    throw Error(ErrorCode::kFailedPrecondition, fmt::format("{}: already committed", state_->uri));
  }
  state_->out->append(data);
  state_->hash.update(data);
  state_->size += data.size();
}

uint64_t CheckpointFileWriter::size() const { return state_->size; }

ManifestEntry CheckpointFileWriter::commit() {
  if (state_->committed) {
    throw Error(ErrorCode::kFailedPrecondition, fmt::format("{}: already committed", state_->uri));
  }
  state_->out->commit();
  state_->committed = true;
  return ManifestEntry{state_->path, state_->size, state_->hash.digest()};
}

namespace {

// Throws unless `entry` is on `storage` with its size: kNotFound or
// kCorruption naming the file. `listed`: the size a listing of the
// destination saw, if it saw the file (a listing may lag behind a write, so
// a file it did not show is looked up on its own).
void check_written(Storage& storage, const ManifestEntry& entry, std::optional<uint64_t> listed) {
  if (!listed) {
    auto info = storage.stat(entry.path);
    if (!info) {
      throw Error(ErrorCode::kNotFound,
                  fmt::format("{}: reported as written but not found", storage.uri_of(entry.path)));
    }
    listed = info->size;
  }
  if (*listed != entry.size) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("{}: size {} but the writer reported {}", storage.uri_of(entry.path),
                            *listed, entry.size));
  }
}

}  // namespace

void CheckpointWriter::add_written(const ManifestEntry& entry) {
  check_user_path(entry.path);
  check_written(dest_.storage(), entry, std::nullopt);
  record(entry);
}

void CheckpointWriter::add_written(const std::vector<ManifestEntry>& entries) {
  if (entries.size() < 2) {
    for (const auto& e : entries) add_written(e);
    return;
  }
  for (const auto& e : entries) check_user_path(e.path);
  Storage& storage = dest_.storage();
  std::unordered_map<std::string, uint64_t> sizes;
  for (auto& o : storage.list("")) sizes.emplace(std::move(o.key), o.size);
  for (const auto& e : entries) {
    auto it = sizes.find(e.path);
    check_written(storage, e, it == sizes.end() ? std::nullopt : std::optional(it->second));
  }
  for (const auto& e : entries) record(e);
}

void CheckpointWriter::add_held_elsewhere(const std::vector<ManifestEntry>& entries) {
  for (const auto& e : entries) check_user_path(e.path);
  for (const auto& e : entries) record(e);
}

void CheckpointWriter::set_layout(nlohmann::json layout) {
  std::lock_guard<std::mutex> g(mu_);
  layout_ = std::move(layout);
}

void CheckpointWriter::set_ranks(nlohmann::json ranks) {
  std::lock_guard<std::mutex> g(mu_);
  ranks_ = std::move(ranks);
}

Manifest CheckpointWriter::commit(const nlohmann::json& metrics, double created_at,
                                  const nlohmann::json* metadata) {
  std::lock_guard<std::mutex> g(mu_);
  if (committed_) {
    throw Error(ErrorCode::kFailedPrecondition, fmt::format("{}: already committed", dest_.uri()));
  }
  if (!metrics.is_null() && !metrics.is_object()) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("{}: metrics must be a JSON object, got {}", dest_.uri(), metrics.type_name()));
  }
  check_storable_json(metrics, fmt::format("{}: metrics", dest_.uri()));
  if (!layout_.is_null()) check_storable_json(layout_, fmt::format("{}: layout", dest_.uri()));
  if (metadata) dest_.set_metadata(*metadata);
  Manifest m;
  m.created_at = created_at;
  m.metrics = metrics.is_null() ? nlohmann::json::object() : metrics;
  m.layout = layout_;
  m.ranks = ranks_;
  m.files = entries_;
  std::sort(m.files.begin(), m.files.end(),
            [](const auto& a, const auto& b) { return a.path < b.path; });
  dest_.storage().put(kManifestKey, m.to_json());
  committed_ = true;
  return m;
}

void delete_checkpoint(const Checkpoint& checkpoint) {
  Storage& s = checkpoint.storage();
  s.remove(kManifestKey);
  s.remove_prefix("");
  for (const auto& id : s.list_incomplete("")) s.discard_incomplete(id);
}

std::vector<std::string> remove_uncommitted(const Checkpoint& leftover) {
  Storage& s = leftover.storage();
  if (leftover.is_committed()) {
    throw Error(ErrorCode::kFailedPrecondition,
                fmt::format("{}: is a committed checkpoint, not a leftover", leftover.uri()));
  }
  std::vector<std::string> removed, keys;
  for (const auto& o : s.list("")) {
    keys.push_back(o.key);
    removed.push_back(s.uri_of(o.key));
  }
  s.remove_many(keys);
  for (const auto& id : s.list_incomplete("")) {
    s.discard_incomplete(id);
    removed.push_back(s.uri_of(id));
  }
  // A writer killed between making the folder and opening its first file
  // leaves the folder empty: no object or incomplete write marks it.
  s.remove_empty_folder("");
  return removed;
}

}  // namespace cairn
