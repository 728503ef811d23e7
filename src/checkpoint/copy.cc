#include "checkpoint/copy.h"

#include <vector>

#include "util/hash.h"

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

}  // namespace cairn
