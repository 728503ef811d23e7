// Block checksums: the same hashes however the stream is cut into pieces,
// and the blocks a byte range lies in.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "util/hash.h"

namespace cairn::testing {
namespace {

std::span<const std::byte> bytes_of(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

TEST(BlockHasher, HashesEveryBlockWhateverThePiecesAndTheShortLastBlock) {
  std::string data(10 * 4096 + 123, '\0');
  std::mt19937 rng(7);
  for (char& c : data) c = static_cast<char>(rng());
  std::vector<uint64_t> want;
  for (size_t off = 0; off < data.size(); off += 4096)
    want.push_back(xxh3_64(data.substr(off, 4096)));
  for (size_t piece : {size_t{1}, size_t{1000}, size_t{4096}, size_t{5000}, data.size()}) {
    BlockHasher h(4096);
    for (size_t off = 0; off < data.size(); off += piece) {
      h.update(bytes_of(data).subspan(off, std::min(piece, data.size() - off)));
    }
    EXPECT_EQ(h.finish(), want) << "pieces of " << piece;
  }
  EXPECT_TRUE(BlockHasher(4096).finish().empty());
}

TEST(BlocksCovering, RoundsOutToWholeBlocks) {
  EXPECT_EQ(blocks_covering(0, 1, 4096), (std::pair<uint64_t, uint64_t>{0, 1}));
  EXPECT_EQ(blocks_covering(4095, 2, 4096), (std::pair<uint64_t, uint64_t>{0, 2}));
  EXPECT_EQ(blocks_covering(4096, 4096, 4096), (std::pair<uint64_t, uint64_t>{1, 2}));
  EXPECT_EQ(blocks_covering(10, 0, 4096), (std::pair<uint64_t, uint64_t>{0, 0}));
}

}  // namespace
}  // namespace cairn::testing
