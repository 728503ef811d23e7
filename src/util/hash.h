// Checksums for manifests: XXH3-64 from Debian's libxxhash, streamed.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

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

uint64_t xxh3_64(std::string_view data);
// 16 lowercase hex digits, as stored in manifests.
std::string hash_to_hex(uint64_t h);
// Parses hash_to_hex's form; returns false if `hex` is not 16 hex digits.
bool hash_from_hex(std::string_view hex, uint64_t& out);

}  // namespace cairn
