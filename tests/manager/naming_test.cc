#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "cairn/manager.h"

namespace cairn::testing {
namespace {

TEST(CheckpointNaming, SixDigitsUpToTheMillionth) {
  EXPECT_EQ(checkpoint_name(0), "checkpoint_000000");
  EXPECT_EQ(checkpoint_name(42), "checkpoint_000042");
  EXPECT_EQ(checkpoint_name(999'999), "checkpoint_999999");
}

TEST(CheckpointNaming, NamesPastTheMillionthStillSortInIndexOrder) {
  EXPECT_EQ(checkpoint_name(1'000'000), "checkpoint_a1000000");
  EXPECT_EQ(checkpoint_name(10'000'000), "checkpoint_b10000000");
  std::vector<uint64_t> indices = {
      0, 9, 10, 999'999, 1'000'000, 9'999'999, 10'000'000, 123'456'789'012ull, UINT64_MAX};
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) indices.push_back(rng() >> (rng() % 64));
  std::vector<std::string> names;
  for (uint64_t i : indices) names.push_back(checkpoint_name(i));
  std::sort(indices.begin(), indices.end());
  std::sort(names.begin(), names.end());
  for (size_t i = 0; i < names.size(); ++i)
    EXPECT_EQ(parse_checkpoint_name(names[i]), indices[i]) << names[i];
}

TEST(CheckpointNaming, ParsingRejectsWhatIsNotACanonicalName) {
  for (const char* bad : {"checkpoint_", "checkpoint_12345", "checkpoint_1234567",
                          "checkpoint_a999999", "checkpoint_a0100000", "checkpoint_00000x",
                          "ckpt_000001", "checkpoint_z12", "checkpoint_n99999999999999999999"}) {
    EXPECT_FALSE(parse_checkpoint_name(bad)) << bad;
  }
}

}  // namespace
}  // namespace cairn::testing
