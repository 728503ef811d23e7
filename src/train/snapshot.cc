#include "train/snapshot.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "cairn/error.h"
#include "checkpoint/copy.h"
#include "util/fs.h"

namespace cairn::train_internal {

namespace fs = std::filesystem;

namespace {

// Hard-links `from` as `to`, or copies it when the file system will not link.
void link_or_copy(const fs::path& from, const fs::path& to, std::string_view uri) {
  std::error_code ec;
  fs::create_directories(to.parent_path(), ec);
  if (ec) throw errno_error(ec.value(), "mkdir", to.parent_path().string());
  // The real file: a link inside the source is frozen as what it points to.
  const fs::path real = fs::canonical(from, ec);
  if (ec) throw errno_error(ec.value(), "stat", std::string(uri));
  fs::create_hard_link(real, to, ec);
  if (!ec) return;
  fs::copy_file(real, to, ec);
  if (ec) {
    throw Error(ErrorCode::kIO, fmt::format("{}: could not be snapshotted into {}: {}", uri,
                                            to.string(), ec.message()));
  }
}

// Copies object `key` of `storage` to the local file `to` (not made
// durable: the upload that reads it makes its copy durable).
void copy_object(Storage& storage, const std::string& key, const fs::path& to) {
  std::error_code ec;
  fs::create_directories(to.parent_path(), ec);
  if (ec) throw errno_error(ec.value(), "mkdir", to.parent_path().string());
  auto reader = storage.open_reader(key);
  const uint64_t size = reader->size();
  UniqueFd fd = open_file(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC);
  std::vector<std::byte> buf(static_cast<size_t>(std::min<uint64_t>(size, uint64_t{8} << 20)));
  for (uint64_t off = 0; off < size;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - off));
    std::span<std::byte> block(buf.data(), n);
    reader->read_at(off, block);
    write_all(fd.get(), block, to.string());
    off += n;
  }
}

}  // namespace

Snapshot snapshot_checkpoint(const Checkpoint& source, const fs::path& dir) {
  // In memory: its objects are immutable, so holding them is the snapshot.
  const std::shared_ptr<Storage> frozen = freeze_memory_storage(source.storage());
  const Checkpoint from = frozen ? Checkpoint(frozen) : source;
  Storage& storage = from.storage();
  check_root_exists(storage);
  const bool committed = from.is_committed();
  std::vector<std::string> keys;
  if (committed) {
    for (const ManifestEntry& f : from.manifest().files) keys.push_back(f.path);
  } else {
    for (const ObjectInfo& f : from.files()) keys.push_back(f.key);
  }
  // Every name is checked before anything is frozen, as an upload does.
  for (const std::string& key : keys) {
    try {
      check_user_path(key);
      if (!committed) check_inside(storage, key);
    } catch (const Error& e) {
      throw with_context(e, fmt::format("snapshotting {}", source.uri()));
    }
  }
  Snapshot out{frozen ? from : Checkpoint::from_directory(dir.string()), from.get_metadata()};
  if (frozen) return out;
  // A committed source's manifest comes along: the upload verifies against it.
  if (committed) keys.emplace_back(kManifestKey);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw errno_error(ec.value(), "mkdir", dir.string());
  const bool local = storage.local_path("").has_value();
  for (const std::string& key : keys) {
    if (local) {
      link_or_copy(*storage.local_path(key), dir / key, storage.uri_of(key));
    } else {
      copy_object(storage, key, dir / key);
    }
  }
  return out;
}

}  // namespace cairn::train_internal
