// Spreading keys across S3 prefixes (storage/s3/key_spread.h): the stored
// names, their inverse, and how evenly a checkpoint's rank files spread.
#include "storage/s3/key_spread.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "cairn/error.h"
#include "support/errors.h"

namespace cairn::s3 {
namespace {

using cairn::testing::code_of;

TEST(KeySpread, OnePrefixStoresKeysAsTheyAre) {
  KeySpread one;
  EXPECT_FALSE(one.spread());
  EXPECT_EQ(one.stored("runs/exp/manifest.json"), "runs/exp/manifest.json");
  EXPECT_EQ(one.key_of("runs/exp/manifest.json"), "runs/exp/manifest.json");
  EXPECT_EQ(one.listing_prefixes("runs/"), std::vector<std::string>{"runs/"});
}

TEST(KeySpread, StoredNamesCarryTheirPrefixAndMapBackToTheirKeys) {
  for (uint32_t n : {2u, 16u, 17u, 256u, 257u, 4096u}) {
    KeySpread s(n);
    const size_t digits = n <= 16 ? 1 : n <= 256 ? 2 : 3;
    for (int i = 0; i < 200; ++i) {
      std::string key = fmt::format("runs/exp/checkpoints/checkpoint_000042/rank_{:05}.bin", i);
      std::string stored = s.stored(key);
      ASSERT_TRUE(stored.ends_with("/" + key)) << stored;
      const std::string head = stored.substr(0, stored.size() - key.size());
      EXPECT_EQ(head.size(), digits + fmt::format("-of-{}/", n).size()) << head;
      EXPECT_TRUE(head.ends_with(fmt::format("-of-{}/", n))) << head;
      EXPECT_EQ(s.key_of(stored), key);
      EXPECT_EQ(s.stored(key), stored) << "the same key, the same name";
    }
  }
  EXPECT_EQ(KeySpread(16).prefix(10), "a-of-16/");
  EXPECT_EQ(KeySpread(256).prefix(10), "0a-of-256/");
  EXPECT_EQ(KeySpread(300).prefix(299), "12b-of-300/");
}

TEST(KeySpread, NamesThatAreNotThisSpreadsAreNotKeys) {
  KeySpread s(16);
  const std::string key = "runs/exp/model.bin";
  const std::string stored = s.stored(key);
  const std::string wrong_prefix =
      KeySpread(16).prefix(
          (static_cast<uint32_t>(std::stoul(stored.substr(0, 1), nullptr, 16)) + 1) % 16) +
      key;
  EXPECT_FALSE(s.key_of(wrong_prefix)) << "placed under a prefix its hash does not give";
  EXPECT_FALSE(s.key_of(key)) << "not spread at all";
  EXPECT_FALSE(s.key_of("no-slash"));
  EXPECT_FALSE(s.key_of(KeySpread(8).stored(key))) << "another count";
  std::string upper = stored;
  upper[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(upper[0])));
  if (upper != stored) {
    EXPECT_FALSE(s.key_of(upper));
  }
  EXPECT_FALSE(s.key_of("g-of-16/" + key));
  EXPECT_FALSE(s.key_of("10-of-16/" + key));
}

TEST(KeySpread, AListingAsksEveryPrefixOnce) {
  KeySpread s(16);
  std::vector<std::string> p = s.listing_prefixes("runs/exp/");
  ASSERT_EQ(p.size(), 16u);
  EXPECT_EQ(std::set<std::string>(p.begin(), p.end()).size(), 16u);
  EXPECT_EQ(p.front(), "0-of-16/runs/exp/");
  EXPECT_EQ(p.back(), "f-of-16/runs/exp/");
  // Every stored name of a key under the folder lies under one of them.
  for (int i = 0; i < 100; ++i) {
    std::string stored = s.stored(fmt::format("runs/exp/f{}", i));
    EXPECT_EQ(
        std::count_if(p.begin(), p.end(), [&](const auto& x) { return stored.starts_with(x); }), 1);
  }
}

// What the spread is for: the rank files of one checkpoint of 16,384 ranks
// over 64 prefixes, the busiest holding little more than the mean.
TEST(KeySpread, ACheckpointsRankFilesSpreadEvenly) {
  KeySpread s(64);
  std::vector<int> count(64);
  for (int r = 0; r < 16384; ++r) {
    std::string stored =
        s.stored(fmt::format("runs/exp/checkpoints/checkpoint_000042/rank_{:05}.safetensors", r));
    ++count[std::stoul(stored.substr(0, 2), nullptr, 16)];
  }
  const int mean = 16384 / 64;
  EXPECT_LE(*std::max_element(count.begin(), count.end()), mean * 5 / 4);
  EXPECT_GE(*std::min_element(count.begin(), count.end()), mean * 3 / 4);
}

TEST(KeySpread, CountsOutsideOneTo4096AreRefused) {
  EXPECT_EQ(code_of([] { KeySpread(0); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([] { KeySpread(4097); }), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace cairn::s3
