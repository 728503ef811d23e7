#include "cairn/checkpoint.h"

#include <mutex>
#include <optional>

#include <fmt/format.h>

#include "cairn/error.h"
#include "checkpoint/copy.h"
#include "checkpoint/local_view.h"
#include "checkpoint/manifest_text.h"
#include "checkpoint/metadata.h"
#include "util/fork_safe.h"
#include "util/fs.h"
#include "util/hash.h"
#include "util/json.h"

namespace cairn {

namespace fs = std::filesystem;

namespace {

bool is_cairn_key(std::string_view key) {
  return key == kCairnDir || key.rfind(std::string(kCairnDir) + "/", 0) == 0;
}

// Serializes read-modify-write of metadata within this process.
ForkSafeMutex metadata_mu(10);

}  // namespace

Checkpoint::Checkpoint(std::shared_ptr<Storage> storage) : storage_(std::move(storage)) {
  if (!storage_) throw std::logic_error("Checkpoint: null storage");
}

Checkpoint Checkpoint::from_directory(std::string_view path_or_uri) {
  return Checkpoint(open_storage(path_or_uri));
}

Checkpoint Checkpoint::in_memory() { return Checkpoint(open_private_memory_storage()); }

Checkpoint Checkpoint::from_dict(const nlohmann::json& dict) {
  if (!dict.is_object()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("from_dict: the dict must be a JSON object, got {}", dict.type_name()));
  }
  check_storable_json(dict, "from_dict: the dict");
  Checkpoint checkpoint = in_memory();
  checkpoint.storage().put(kDictFileName, dict.dump());
  return checkpoint;
}

nlohmann::json Checkpoint::to_dict() const {
  const std::string where = storage_->uri_of(kDictFileName);
  if (!storage_->exists(kDictFileName)) {
    throw Error(ErrorCode::kNotFound, fmt::format("{}: the checkpoint holds no dict", where));
  }
  nlohmann::json j = parse_json(storage_->get(kDictFileName), where);
  if (!j.is_object()) {
    throw Error(ErrorCode::kCorruption, fmt::format("{}: the dict is not a JSON object", where));
  }
  return j;
}

LocalDirectory Checkpoint::as_directory() const {
  LocalDirectory view;
  if (auto local = storage_->local_path("")) {
    std::error_code ec;
    if (!fs::is_directory(*local, ec)) {
      throw Error(ErrorCode::kNotFound,
                  fmt::format("{}: checkpoint directory does not exist", uri()));
    }
    view.path_ = *local;
    return view;
  }
  // A source that does not exist fails in to_directory(), during the
  // download: an empty listing never gets a complete view.
  view.owner_ = acquire_shared_view(*this, view.path_);
  return view;
}

fs::path Checkpoint::to_directory(const fs::path& dest) const {
  check_root_exists(*storage_);
  const bool own_dest = dest.empty();
  fs::path target = own_dest ? make_temp_dir("cairn-checkpoint-") : fs::absolute(dest);
  try {
    std::error_code ec;
    if (!own_dest && fs::exists(target, ec) && !fs::is_empty(target, ec)) {
      throw Error(ErrorCode::kAlreadyExists,
                  fmt::format("{}: destination directory is not empty", target.string()));
    }
    auto out = open_storage(target.string());
    std::vector<std::string> keys;
    std::optional<Manifest> m;
    if (is_committed()) m = manifest();
    if (m) {
      for (const auto& f : m->files) keys.push_back(f.path);
    } else {
      for (const auto& f : files()) keys.push_back(f.key);
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      auto w = out->open_writer(keys[i]);
      ManifestEntry got = stream_object(*storage_, keys[i], w.get());
      if (m && (got.size != m->files[i].size || got.xxh3 != m->files[i].xxh3)) {
        throw Error(
            ErrorCode::kCorruption,
            fmt::format("{}: contents do not match the manifest (size {}, manifest says {})",
                        storage_->uri_of(keys[i]), got.size, m->files[i].size));
      }
      w->commit();
    }
    if (storage_->exists(kMetadataKey)) out->put(kMetadataKey, storage_->get(kMetadataKey));
  } catch (...) {
    if (own_dest) {
      std::error_code ec;
      fs::remove_all(target, ec);  // ignore-error: cleaning up after the error being thrown
    }
    throw;
  }
  return target;
}

namespace {

// The metadata object stored at `key`, or nullopt when there is none.
// Unparseable text or a value other than an object is kCorruption naming it.
std::optional<StoredMetadata> read_metadata_object(Storage& storage, std::string_view key) {
  std::optional<std::string> text;
  try {
    text = storage.get(key);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kNotFound) throw;
    return std::nullopt;
  }
  const std::string where = storage.uri_of(key);
  nlohmann::json j = parse_json(*text, where);
  if (!j.is_object()) {
    throw Error(ErrorCode::kCorruption, fmt::format("{}: metadata is not a JSON object", where));
  }
  return StoredMetadata{std::move(*text), std::move(j)};
}

// Replaces the metadata with `next`. On a store that tears writes, the text
// being replaced is kept first (kMetadataPreviousKey), so that a torn replace
// leaves it readable; a torn copy of it is never kept over a whole one.
void replace_metadata(Storage& storage, const nlohmann::json& next) {
  if (storage.capabilities().torn_writes) {
    std::optional<StoredMetadata> current;
    try {
      current = read_metadata_object(storage, kMetadataKey);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kCorruption) throw;  // torn: the kept copy stays
    }
    if (current) storage.put(kMetadataPreviousKey, current->text);
  }
  storage.put(kMetadataKey, next.dump(2));
}

}  // namespace

std::optional<StoredMetadata> read_checkpoint_metadata(Storage& storage) {
  try {
    return read_metadata_object(storage, kMetadataKey);
  } catch (const Error& e) {
    // A replace torn by a killed writer: the metadata it was replacing.
    if (e.code() != ErrorCode::kCorruption || !storage.capabilities().torn_writes) throw;
    std::optional<StoredMetadata> previous;
    try {
      previous = read_metadata_object(storage, kMetadataPreviousKey);
    } catch (const Error&) {
      // ignore-error: neither is readable; the rethrown error names the metadata
    }
    if (!previous) throw;
    return previous;
  }
}

nlohmann::json Checkpoint::get_metadata() const {
  std::optional<StoredMetadata> m = read_checkpoint_metadata(*storage_);
  return m ? std::move(m->value) : nlohmann::json::object();
}

void Checkpoint::set_metadata(const nlohmann::json& metadata) const {
  if (!metadata.is_object()) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("{}: metadata must be a JSON object, got {}", uri(), metadata.type_name()));
  }
  check_storable_json(metadata, fmt::format("{}: metadata", uri()));
  std::lock_guard<ForkSafeMutex> g(metadata_mu);
  replace_metadata(*storage_, metadata);
}

void Checkpoint::update_metadata(const nlohmann::json& patch) const {
  if (!patch.is_object()) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("{}: metadata update must be a JSON object, got {}", uri(), patch.type_name()));
  }
  std::lock_guard<ForkSafeMutex> g(metadata_mu);
  nlohmann::json current = get_metadata();
  for (auto it = patch.begin(); it != patch.end(); ++it) current[it.key()] = it.value();
  check_storable_json(current, fmt::format("{}: metadata", uri()));
  replace_metadata(*storage_, current);
}

std::vector<ObjectInfo> Checkpoint::files() const {
  std::vector<ObjectInfo> out;
  for (auto& o : storage_->list("")) {
    if (!is_cairn_key(o.key)) out.push_back(std::move(o));
  }
  return out;
}

bool Checkpoint::is_committed() const {
  std::optional<std::string> text = read_manifest_text(*storage_);
  return text && (!storage_->capabilities().torn_writes || !Manifest::torn(*text));
}

Manifest Checkpoint::manifest() const {
  std::optional<std::string> text = read_manifest_text(*storage_);
  if (!text) {
    throw Error(ErrorCode::kNotFound,
                fmt::format("{}: not a committed checkpoint (no manifest)", uri()));
  }
  std::optional<std::string> why = Manifest::torn(*text);
  if (why && !storage_->capabilities().torn_writes) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("{}: damaged: its manifest is unreadable ({}); this store writes "
                            "whole objects, so the checkpoint was committed and damaged "
                            "afterwards. Its files are kept: `cairn show {}` lists them",
                            storage_->uri_of(kManifestKey), *why, uri()));
  }
  if (why) {
    throw Error(ErrorCode::kNotFound,
                fmt::format("{}: not a committed checkpoint: its manifest is torn, the remains of "
                            "an interrupted commit ({}); the manager's next open or `cairn gc` "
                            "removes it",
                            uri(), *why));
  }
  return Manifest::parse(*text, storage_->uri_of(kManifestKey));
}

std::vector<VerifyProblem> Checkpoint::verify() const { return verify(manifest()); }

std::vector<VerifyProblem> Checkpoint::verify(const Manifest& m) const {
  std::vector<VerifyProblem> problems;
  for (const auto& f : m.files) {
    try {
      auto info = storage_->stat(f.path);
      if (!info) {
        problems.push_back({f.path, "missing"});
        continue;
      }
      if (info->size != f.size) {
        problems.push_back({f.path, fmt::format("size {}, manifest says {}", info->size, f.size)});
        continue;
      }
      ManifestEntry got = stream_object(*storage_, f.path, nullptr);
      if (got.xxh3 != f.xxh3) {
        problems.push_back({f.path, fmt::format("checksum {}, manifest says {}",
                                                hash_to_hex(got.xxh3), hash_to_hex(f.xxh3))});
      }
    } catch (const Error& e) {
      problems.push_back({f.path, e.what()});
    }
  }
  return problems;
}

}  // namespace cairn
