#include "checkpoint/copy.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

#include "cairn/error.h"
#include "util/hash.h"
#include "util/json.h"

namespace cairn {

ManifestEntry stream_object(Storage& src, std::string_view key, Writer* dst) {
  const uint64_t kBlock = src.preferred_read_size();
  auto reader = src.open_reader(key);
  const uint64_t size = reader->size();
  // Reused per thread: first touch of fresh pages is slow on virtual
  // machines (docs/ARCHITECTURE.md), and copies run back to back.
  thread_local std::vector<std::byte> buf;
  if (buf.size() < std::min(size, kBlock)) buf.resize(static_cast<size_t>(std::min(size, kBlock)));
  Hasher hasher;
  for (uint64_t off = 0; off < size;) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(kBlock, size - off));
    std::span<std::byte> block(buf.data(), n);
    reader->read_at(off, block);
    hasher.update(block);
    if (dst) dst->append(block);
    off += n;
  }
  return ManifestEntry{std::string(key), size, hasher.digest()};
}

namespace {

bool is_cairn_key(std::string_view key) {
  return key == kCairnDir || key.rfind(std::string(kCairnDir) + "/", 0) == 0;
}

}  // namespace

// A file name a manifest can hold: a safe key, outside .cairn/, and valid
// UTF-8 (manifests are JSON, which has no way to spell other bytes).
void check_user_path(std::string_view path) {
  validate_key(path);
  if (is_cairn_key(path)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("\"{}\": names under .cairn/ are reserved for Cairn", path));
  }
  if (!is_valid_utf8(path)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("\"{}\": file name is not valid UTF-8; checkpoint file names must be "
                            "(rename the file)",
                            printable(path)));
  }
}

// A local source's file must not be a link that leads outside the source:
// the user asked to save that directory, not what a link points to.
void check_inside(const Storage& source, std::string_view key) {
  auto root = source.local_path("");
  if (!root) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path real_root = fs::canonical(*root, ec);
  if (ec) return;  // reported by the read that follows
  fs::path real = fs::canonical(*source.local_path(key), ec);
  if (ec) return;
  auto [r, q] = std::mismatch(real_root.begin(), real_root.end(), real.begin(), real.end());
  if (r != real_root.end()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: a symbolic link leads outside the source checkpoint (to {})",
                            source.uri_of(key), real.string()));
  }
}

std::vector<ManifestEntry> copy_files(const Checkpoint& source, Storage& dest) {
  check_root_exists(source.storage());
  std::optional<Manifest> source_manifest;
  if (source.is_committed()) source_manifest = source.manifest();
  std::vector<ManifestEntry> expected;
  if (source_manifest) {
    expected = source_manifest->files;
  } else {
    for (const auto& f : source.files()) expected.push_back({f.key, f.size, 0});
  }
  // Every name is checked before anything is written.
  for (const auto& want : expected) {
    try {
      check_user_path(want.path);
      if (!source_manifest) check_inside(source.storage(), want.path);
    } catch (const Error& e) {
      throw with_context(e, fmt::format("copying {}", source.uri()));
    }
  }
  std::vector<ManifestEntry> copied;
  for (const auto& want : expected) {
    auto w = dest.open_writer(want.path);
    ManifestEntry got;
    try {
      got = stream_object(source.storage(), want.path, w.get());
    } catch (const Error& e) {
      throw with_context(e, fmt::format("copying {}", source.storage().uri_of(want.path)));
    }
    if (source_manifest && (got.size != want.size || got.xxh3 != want.xxh3)) {
      throw Error(
          ErrorCode::kCorruption,
          fmt::format("{}: does not match its manifest (size {}, checksum {}; manifest says "
                      "size {}, checksum {})",
                      source.storage().uri_of(want.path), got.size, hash_to_hex(got.xxh3),
                      want.size, hash_to_hex(want.xxh3)));
    }
    if (source_manifest) {  // the whole file matched: its blocks' checksums hold too
      got.block_size = want.block_size;
      got.block_xxh3 = want.block_xxh3;
    }
    w->commit();
    copied.push_back(std::move(got));
  }
  return copied;
}

}  // namespace cairn
