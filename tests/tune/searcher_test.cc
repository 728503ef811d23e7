#include <optional>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cairn/error.h"
#include "cairn/tune.h"
#include "support/errors.h"

namespace cairn::tune {
namespace {

using nlohmann::json;

json example_space() {
  return {{"lr", loguniform(1e-4, 1e-1)},
          {"model", {{"layers", grid_search({2, 4})}, {"act", choice({"relu", "gelu"})}}},
          {"batch", grid_search({16, 32, 64})},
          {"seed", randint(0, 1 << 30)},
          {"name", "mlp"}};
}

std::vector<Variant> drain(BasicVariantGenerator& g) {
  std::vector<Variant> out;
  while (auto v = g.next()) out.push_back(std::move(*v));
  return out;
}

void expect_same(const std::vector<Variant>& a, const std::vector<Variant>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].index, b[i].index);
    EXPECT_EQ(a[i].config, b[i].config) << "at " << i;
  }
}

TEST(BasicVariantGenerator, GridRepeatedNumSamplesTimes) {
  BasicVariantGenerator g(ParamSpace(example_space()), 3, 11);
  EXPECT_EQ(g.total(), 18u);
  std::vector<Variant> all = drain(g);
  ASSERT_EQ(all.size(), 18u);
  EXPECT_FALSE(g.next());
  EXPECT_TRUE(g.finished());
  for (std::size_t k = 0; k < all.size(); ++k) {
    const json& c = all[k].config;
    EXPECT_EQ(all[k].index, k);
    // grid order: batch (first in key order) fastest, then model/layers;
    // repetitions outermost.
    std::size_t point = k % 6;
    EXPECT_EQ(c["batch"], (json{16, 32, 64})[point % 3]);
    EXPECT_EQ(c["model"]["layers"], (json{2, 4})[point / 3]);
    EXPECT_EQ(c["name"], "mlp");
    EXPECT_TRUE(c["model"]["act"] == "relu" || c["model"]["act"] == "gelu");
    EXPECT_GE(c["lr"].get<double>(), 1e-4);
    EXPECT_LT(c["lr"].get<double>(), 1e-1);
  }
  // Each repetition samples the random domains anew.
  std::set<double> lrs;
  for (const auto& v : all) lrs.insert(v.config["lr"].get<double>());
  EXPECT_EQ(lrs.size(), 18u);
}

TEST(BasicVariantGenerator, OnlyRandomDomainsGiveNumSamplesTrials) {
  BasicVariantGenerator g(ParamSpace({{"x", uniform(0, 1)}}), 5, 1);
  EXPECT_EQ(drain(g).size(), 5u);
  BasicVariantGenerator constants(ParamSpace({{"x", 1}}), 2, 1);
  std::vector<Variant> two = drain(constants);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].config, (json{{"x", 1}}));
  EXPECT_EQ(two[1].config, (json{{"x", 1}}));
}

TEST(BasicVariantGenerator, SameSeedSameSequenceDifferentSeedDiffers) {
  BasicVariantGenerator a(ParamSpace(example_space()), 4, 123);
  BasicVariantGenerator b(ParamSpace(example_space()), 4, 123);
  BasicVariantGenerator c(ParamSpace(example_space()), 4, 124);
  std::vector<Variant> va = drain(a), vb = drain(b), vc = drain(c);
  expect_same(va, vb);
  std::size_t differing = 0;
  for (std::size_t i = 0; i < va.size(); ++i) differing += va[i].config != vc[i].config;
  EXPECT_EQ(differing, va.size());
}

// A restored experiment holds only (seed, next index), so the draws for a
// given seed must never change between versions or platforms. These values
// come from an independent implementation of mt19937_64, SplitMix64 and the
// draw rules written from their definitions, not from this code.
TEST(BasicVariantGenerator, SequenceForAFixedSeedIsPinned) {
  BasicVariantGenerator g(
      ParamSpace(
          {{"c", choice({"a", "b", "c"})}, {"k", randint(0, 1000000)}, {"u", uniform(0, 1)}}),
      3, 2024);
  std::vector<Variant> all = drain(g);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].config, (json{{"c", "b"}, {"k", 913486}, {"u", 0.36976284941036297}}));
  EXPECT_EQ(all[1].config, (json{{"c", "a"}, {"k", 999000}, {"u", 0.11925325711502854}}));
  EXPECT_EQ(all[2].config, (json{{"c", "b"}, {"k", 739439}, {"u", 0.5905533419274872}}));
}

TEST(BasicVariantGenerator, VariantAtIndexMatchesTheSequence) {
  BasicVariantGenerator g(ParamSpace(example_space()), 2, 5);
  BasicVariantGenerator probe(ParamSpace(example_space()), 2, 5);
  std::vector<Variant> all = drain(g);
  for (std::size_t k = all.size(); k-- > 0;) EXPECT_EQ(probe.variant(k).config, all[k].config);
  testing::expect_invalid_argument([&] { probe.variant(all.size()); }, "out of range");
}

TEST(BasicVariantGenerator, RestoreAtEveryCutPointContinuesTheSequence) {
  const std::size_t samples = 3;
  BasicVariantGenerator reference(ParamSpace(example_space()), samples, 99);
  std::vector<Variant> uninterrupted = drain(reference);
  for (std::size_t cut = 0; cut <= uninterrupted.size(); ++cut) {
    BasicVariantGenerator first(ParamSpace(example_space()), samples, 99);
    std::vector<Variant> seen;
    for (std::size_t i = 0; i < cut; ++i) seen.push_back(*first.next());
    // Through text, as an experiment state file would hold it; into a
    // searcher built with another seed, which restore() replaces.
    json state = json::parse(first.save().dump());
    BasicVariantGenerator second(ParamSpace(example_space()), samples, 1);
    second.restore(state);
    EXPECT_EQ(second.produced(), cut);
    for (auto& v : drain(second)) seen.push_back(std::move(v));
    expect_same(seen, uninterrupted);
  }
}

TEST(BasicVariantGenerator, SearcherInterfaceTracksLiveTrialsAcrossRestore) {
  BasicVariantGenerator g(ParamSpace({{"g", grid_search({1, 2, 3})}}), 1, 0);
  Searcher& s = g;
  EXPECT_EQ(s.suggest("t0"), (json{{"g", 1}}));
  EXPECT_EQ(s.suggest("t1"), (json{{"g", 2}}));
  testing::expect_invalid_argument([&] { s.suggest("t1"); }, "trial 't1' was already suggested");
  s.on_trial_complete("t0", json{{"loss", 0.5}}, false);
  testing::expect_invalid_argument([&] { s.on_trial_complete("t0", nullptr, false); },
                                   "unknown trial 't0'");

  BasicVariantGenerator restored(ParamSpace({{"g", grid_search({1, 2, 3})}}), 1, 0);
  restored.restore(json::parse(s.save().dump()));
  EXPECT_EQ(restored.live(), (std::map<std::string, std::size_t>{{"t1", 1}}));
  restored.on_trial_complete("t1", nullptr, true);
  EXPECT_FALSE(restored.finished());
  EXPECT_EQ(restored.suggest("t2"), (json{{"g", 3}}));
  EXPECT_TRUE(restored.finished());
  EXPECT_EQ(restored.suggest("t3"), std::nullopt);
  EXPECT_TRUE(restored.live().contains("t2"));
  EXPECT_FALSE(restored.live().contains("t3"));
}

TEST(BasicVariantGenerator, RestoreRefusesForeignStateAndStaysUnchanged) {
  BasicVariantGenerator g(ParamSpace(example_space()), 2, 7);
  g.next();
  json good = g.save();
  BasicVariantGenerator target(ParamSpace(example_space()), 2, 7);
  auto refused = [&](json state, const std::string& words) {
    testing::expect_invalid_argument([&] { target.restore(state); }, words);
    EXPECT_EQ(target.produced(), 0u);
  };
  json s = good;
  s["searcher"] = "hyperopt";
  refused(s, "not a basic_variant searcher's state");
  s = good;
  s["version"] = 2;
  refused(s, "unsupported version 2");
  s = good;
  s["space"]["name"] = "cnn";
  refused(s, "different search space");
  s = good;
  s["num_samples"] = 3;
  refused(s, "num_samples 3");
  s = good;
  s["seed"] = 7;
  refused(s, "'seed' must be a string");
  s = good;
  s["seed"] = "18446744073709551616";
  refused(s, "not a 64-bit unsigned decimal");
  s = good;
  s["num_samples"] = -2;
  refused(s, "'num_samples' must be a non-negative integer");
  s = good;
  s["next"] = 13;
  refused(s, "exceeds the 12 trials");
  s = good;
  s["live"] = {{"t9", 1}};
  refused(s, "live trial 't9' has index 1");
  s = good;
  s["live"] = {{"t9", -1}};
  refused(s, "live trial 't9' has index -1");
  refused(json::array(), "not a JSON object");
  target.restore(good);
  EXPECT_EQ(target.produced(), 1u);
}

TEST(BasicVariantGenerator, BadArgumentsAreRefused) {
  testing::expect_invalid_argument(
      [] {
        BasicVariantGenerator(ParamSpace({{"x", 1}}), 0, 0);
      },
      "num_samples must be at least 1");
  json values = json::array();
  for (int i = 0; i < 65536; ++i) values.push_back(i);
  json spec = {{"a", grid_search(values)}, {"b", grid_search(values)}, {"c", grid_search(values)}};
  ParamSpace big(spec);  // 2^48 points
  testing::expect_invalid_argument([&] { BasicVariantGenerator(big, std::size_t{1} << 16, 0); },
                                   "more trials than can be counted");
  EXPECT_EQ(BasicVariantGenerator(big, (std::size_t{1} << 16) - 1, 0).total(),
            (std::size_t{1} << 48) * ((std::size_t{1} << 16) - 1));
}

}  // namespace
}  // namespace cairn::tune
