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

}  // namespace cairn
