// Checksums for manifests: XXH3-64 from Debian's libxxhash, streamed.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cairn {

class Hasher {
 public:
  Hasher();
  ~Hasher();
  Hasher(Hasher&&) noexcept;
  Hasher& operator=(Hasher&&) noexcept;
  void update(std::span<const std::byte> data);
  uint64_t digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The XXH3-64 of every `block_size` bytes of a stream (the last block may be
// shorter), fed in pieces of any size: what a manifest records so that a
// partial read can verify just the blocks it reads.
class BlockHasher {
 public:
  explicit BlockHasher(uint64_t block_size);
  void update(std::span<const std::byte> data);
  // The hashes of every block so far, the unfinished last one included.
  std::vector<uint64_t> finish();

 private:
  uint64_t block_size_;
  uint64_t in_block_ = 0;  // bytes of the current block hashed so far
  Hasher current_;
  std::vector<uint64_t> done_;
};

// The blocks [first, last) that bytes [offset, offset + length) lie in (pure).
inline std::pair<uint64_t, uint64_t> blocks_covering(uint64_t offset, uint64_t length,
                                                     uint64_t block_size) {
  if (length == 0) return {0, 0};
  return {offset / block_size, (offset + length + block_size - 1) / block_size};
}

// Whether `count` block checksums of `block_size` bytes each cover a file of
// `size` bytes (ManifestEntry::block_xxh3 as read from a manifest).
inline bool blocks_cover(uint64_t size, uint64_t block_size, size_t count) {
  return block_size > 0 && count == (size + block_size - 1) / block_size;
}

// kCorruption "<source>: checksum D does not match the manifest's E (the
// file changed after it was committed)" unless `digest` equals `expected`.
void check_file_digest(uint64_t digest, uint64_t expected, std::string_view source);
// Checks block `block` of a file, whose bytes `data` start at byte `begin`,
// against `expected`: kCorruption naming `source`, the byte range and the
// block otherwise.
void check_block(std::span<const std::byte> data, uint64_t begin, uint64_t block, uint64_t expected,
                 std::string_view source);

uint64_t xxh3_64(std::string_view data);
// 16 lowercase hex digits, as stored in manifests.
std::string hash_to_hex(uint64_t h);
// Parses hash_to_hex's form; returns false if `hex` is not 16 hex digits.
bool hash_from_hex(std::string_view hex, uint64_t& out);

}  // namespace cairn
