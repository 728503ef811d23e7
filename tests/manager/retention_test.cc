#include <gtest/gtest.h>

#include <cmath>

#include "manager/retention.h"

namespace cairn::retention {
namespace {

std::vector<Candidate> scored(std::vector<std::optional<double>> scores) {
  std::vector<Candidate> out;
  for (size_t i = 0; i < scores.size(); ++i) out.push_back({i, scores[i], false});
  return out;
}

TEST(Retention, KeepsEverythingWithoutNumToKeep) {
  EXPECT_TRUE(to_delete(scored({1, 2, 3}), Policy{std::nullopt, true, true}).empty());
}

TEST(Retention, KeepsTheKBestByMaxOrMin) {
  auto c = scored({0.5, 0.9, 0.1, 0.7, 0.3});
  EXPECT_EQ(rank(c, Policy{2, true, true}), (std::vector<uint64_t>{1, 3, 0, 4, 2}));
  EXPECT_EQ(to_delete(c, Policy{2, true, true}), (std::vector<uint64_t>{0, 2}));  // 4 is the latest
  EXPECT_EQ(to_delete(c, Policy{2, true, false}), (std::vector<uint64_t>{0, 1, 3}));
}

TEST(Retention, WithoutAttributeKeepsTheMostRecent) {
  auto c = scored({9, 8, 7, 6});
  EXPECT_EQ(to_delete(c, Policy{2, false, true}), (std::vector<uint64_t>{0, 1}));
}

TEST(Retention, TiesKeepTheNewer) {
  auto c = scored({1.0, 1.0, 1.0, 0.0});
  EXPECT_EQ(rank(c, Policy{1, true, true}), (std::vector<uint64_t>{2, 1, 0, 3}));
  EXPECT_EQ(to_delete(c, Policy{1, true, true}), (std::vector<uint64_t>{0, 1}));
}

TEST(Retention, NaNAndMissingRankWorstWhateverTheOrder) {
  for (bool maximize : {true, false}) {
    auto c = scored({std::nan(""), 5.0, std::nullopt, -5.0, 1.0});
    auto r = rank(c, Policy{2, true, maximize});
    EXPECT_EQ(r[3], 2u) << "missing and NaN last, newer first among them";
    EXPECT_EQ(r[4], 0u);
  }
}

TEST(Retention, TheMostRecentIsNeverDeleted) {
  auto c = scored({10, 9, 8, 0});
  EXPECT_EQ(to_delete(c, Policy{1, true, true}), (std::vector<uint64_t>{1, 2}));
  auto missing = scored({10, std::nullopt});
  EXPECT_TRUE(to_delete(missing, Policy{1, true, true}).empty());
}

TEST(Retention, PinnedCheckpointsAreKeptOutsideTheK) {
  auto c = scored({1, 2, 3, 4});
  c[0].pinned = true;
  EXPECT_EQ(to_delete(c, Policy{1, true, true}), (std::vector<uint64_t>{1, 2}));
}

TEST(Retention, ScoresAreFoundByNestedKeysAndNonNumbersAreFlagged) {
  nlohmann::json m = {{"val", {{"loss", 0.25}}}, {"name", "x"}, {"flag", true}, {"n", nullptr}};
  EXPECT_EQ(extract_score(m, "val/loss").kind, ScoreKind::kNumber);
  EXPECT_EQ(extract_score(m, "val/loss").value, 0.25);
  EXPECT_EQ(extract_score(m, "val/acc").kind, ScoreKind::kMissing);
  EXPECT_EQ(extract_score(m, "val/loss/deeper").kind, ScoreKind::kMissing);
  EXPECT_EQ(extract_score(m, "name").kind, ScoreKind::kNotNumber);
  EXPECT_EQ(extract_score(m, "name").found, "\"x\"");
  EXPECT_EQ(extract_score(m, "flag").kind, ScoreKind::kNotNumber);
  EXPECT_EQ(extract_score(m, "n").kind, ScoreKind::kMissing);
}

TEST(Retention, AFlatSlashKeyMatchesAsInRayAndWinsOverTheNestedOne) {
  EXPECT_EQ(extract_score({{"eval/loss", 0.5}}, "eval/loss").value, 0.5);
  nlohmann::json both = {{"eval/loss", 1.0}, {"eval", {{"loss", 2.0}}}};
  EXPECT_EQ(extract_score(both, "eval/loss").value, 1.0);
  EXPECT_EQ(extract_score({{"a/b", {{"c", 3.0}}}}, "a/b/c").value, 3.0);
  EXPECT_EQ(extract_score({{"a", {{"b/c", 4.0}}}}, "a/b/c").value, 4.0);
  EXPECT_EQ(extract_score({{"a", {{"b", 5.0}}}, {"a/b", "text"}}, "a/b").kind,
            ScoreKind::kNotNumber)
      << "the flat key wins even when it is not a number";
  EXPECT_EQ(extract_score({{"a", 1}}, "a/b").kind, ScoreKind::kMissing);
}

TEST(Retention, PinsOncePerPeriod) {
  EXPECT_FALSE(should_pin(100, 0, std::nullopt));
  EXPECT_FALSE(should_pin(3599, 0, 1.0));
  EXPECT_TRUE(should_pin(3600, 0, 1.0));
  EXPECT_TRUE(should_pin(1800, 0, 0.5));
}

}  // namespace
}  // namespace cairn::retention
