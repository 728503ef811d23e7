#include "util/hash.h"

#include <algorithm>
#include <charconv>

#include <fmt/format.h>
#include <xxhash.h>

#include "cairn/error.h"

namespace cairn {

struct Hasher::State {
  XXH3_state_t* s = XXH3_createState();
  ~State() { XXH3_freeState(s); }
};

Hasher::Hasher() : state_(std::make_unique<State>()) { XXH3_64bits_reset(state_->s); }
Hasher::~Hasher() = default;
Hasher::Hasher(Hasher&&) noexcept = default;
Hasher& Hasher::operator=(Hasher&&) noexcept = default;

void Hasher::update(std::span<const std::byte> data) {
  XXH3_64bits_update(state_->s, data.data(), data.size());
}

uint64_t Hasher::digest() const { return XXH3_64bits_digest(state_->s); }

BlockHasher::BlockHasher(uint64_t block_size) : block_size_(block_size) {}

void BlockHasher::update(std::span<const std::byte> data) {
  while (!data.empty()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(block_size_ - in_block_, data.size()));
    current_.update(data.first(n));
    in_block_ += n;
    data = data.subspan(n);
    if (in_block_ == block_size_) {
      done_.push_back(current_.digest());
      current_ = Hasher();
      in_block_ = 0;
    }
  }
}

std::vector<uint64_t> BlockHasher::finish() {
  std::vector<uint64_t> out = done_;
  if (in_block_ > 0) out.push_back(current_.digest());
  return out;
}

void check_file_digest(uint64_t digest, uint64_t expected, std::string_view source) {
  if (digest == expected) return;
  throw Error(ErrorCode::kCorruption,
              fmt::format("{}: checksum {} does not match the manifest's {} (the file changed "
                          "after it was committed)",
                          source, hash_to_hex(digest), hash_to_hex(expected)));
}

void check_block(std::span<const std::byte> data, uint64_t begin, uint64_t block, uint64_t expected,
                 std::string_view source) {
  Hasher h;
  h.update(data);
  if (h.digest() == expected) return;
  throw Error(ErrorCode::kCorruption,
              fmt::format("{}: bytes [{}, {}) (checksum block {}) do not match the manifest's "
                          "checksum (the file changed after it was committed)",
                          source, begin, begin + data.size(), block));
}

uint64_t xxh3_64(std::string_view data) { return XXH3_64bits(data.data(), data.size()); }

std::string hash_to_hex(uint64_t h) { return fmt::format("{:016x}", h); }

bool hash_from_hex(std::string_view hex, uint64_t& out) {
  if (hex.size() != 16) return false;
  for (char c : hex) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  auto [ptr, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), out, 16);
  return ec == std::errc() && ptr == hex.data() + hex.size();
}

}  // namespace cairn
