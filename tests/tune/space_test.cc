#include <algorithm>
#include <cmath>
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

// Expects ParamSpace(space) to fail with kInvalidArgument whose message names
// `path` and contains `words`.
void expect_invalid(const json& space, const std::string& path, const std::string& words) {
  try {
    ParamSpace p(space);
    ADD_FAILURE() << "accepted " << space.dump();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("search space: " + path + ":"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

std::vector<json> draws(const json& domain, int n, std::uint64_t seed = 7) {
  ParamSpace space(json{{"x", domain}});
  Rng rng(seed);
  std::vector<json> out;
  for (int i = 0; i < n; ++i) out.push_back(space.resolve(0, rng)["x"]);
  return out;
}

TEST(TuneRng, Mt19937_64IsTheStandardSequence) {
  // The C++ standard fixes the 10000th output of a default-constructed
  // mt19937_64; reproducibility across platforms rests on it.
  Rng rng;
  rng.discard(9999);
  EXPECT_EQ(rng(), 9981545732273789042ULL);
}

TEST(TuneRng, DrawUnitIsInUnitIntervalAndUsesTopBits) {
  Rng a(1), b(1);
  for (int i = 0; i < 1000; ++i) {
    double u = draw_unit(a);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    EXPECT_EQ(u, static_cast<double>(b() >> 11) / 9007199254740992.0);
  }
}

TEST(TuneRng, DrawBelowCoversRangeAndRejectsZero) {
  Rng rng(3);
  std::vector<int> seen(5, 0);
  for (int i = 0; i < 5000; ++i) {
    auto x = draw_below(rng, 5);
    ASSERT_LT(x, 5u);
    ++seen[x];
  }
  for (int count : seen) EXPECT_NEAR(count, 1000, 150);
  EXPECT_EQ(draw_below(rng, 1), 0u);
  EXPECT_THROW(draw_below(rng, 0), std::logic_error);
}

TEST(TuneDomains, EncodeAsTaggedObjects) {
  EXPECT_EQ(loguniform(1e-4, 1e-1),
            (json{{"$cairn.domain", "loguniform"}, {"lo", 1e-4}, {"hi", 1e-1}}));
  EXPECT_EQ(grid_search({2, 4}), (json{{"$cairn.domain", "grid_search"}, {"values", {2, 4}}}));
  EXPECT_EQ(randint(-3, 3), (json{{"$cairn.domain", "randint"}, {"lo", -3}, {"hi", 3}}));
  EXPECT_EQ(quniform(0, 1, 0.25),
            (json{{"$cairn.domain", "quniform"}, {"lo", 0.0}, {"hi", 1.0}, {"q", 0.25}}));
}

TEST(TuneDomains, UniformStaysInHalfOpenRange) {
  double lo = -2.5, hi = 7.0, sum = 0;
  for (const json& v : draws(uniform(lo, hi), 10000)) {
    ASSERT_TRUE(v.is_number_float());
    ASSERT_GE(v.get<double>(), lo);
    ASSERT_LT(v.get<double>(), hi);
    sum += v.get<double>();
  }
  EXPECT_NEAR(sum / 10000, (lo + hi) / 2, 0.15);
}

TEST(TuneDomains, LoguniformIsUniformInTheLogarithm) {
  double lo = 1e-4, hi = 1e-1;
  std::vector<double> values;
  int below_1e3 = 0;
  for (const json& v : draws(loguniform(lo, hi), 10001)) {
    double x = v.get<double>();
    ASSERT_GE(x, lo);
    ASSERT_LT(x, hi);
    values.push_back(x);
    below_1e3 += x < 1e-3;
  }
  std::sort(values.begin(), values.end());
  double median = values[values.size() / 2];
  // The geometric mean sqrt(1e-4 * 1e-1) ~ 3.16e-3 is the median; the
  // arithmetic midpoint (0.05) would be far off.
  EXPECT_NEAR(std::log10(median), std::log10(std::sqrt(lo * hi)), 0.05);
  // One decade of three below 1e-3.
  EXPECT_NEAR(below_1e3 / 10001.0, 1.0 / 3, 0.02);
}

TEST(TuneDomains, RandintExcludesUpperBoundAndReachesLower) {
  std::set<std::int64_t> seen;
  for (const json& v : draws(randint(-2, 3), 2000)) {
    ASSERT_TRUE(v.is_number_integer());
    seen.insert(v.get<std::int64_t>());
  }
  EXPECT_EQ(seen, (std::set<std::int64_t>{-2, -1, 0, 1, 2}));
}

TEST(TuneDomains, RandintFullRangeDoesNotOverflow) {
  auto min = std::numeric_limits<std::int64_t>::min();
  auto max = std::numeric_limits<std::int64_t>::max();
  bool negative = false, positive = false;
  for (const json& v : draws(randint(min, max), 200)) {
    auto x = v.get<std::int64_t>();
    ASSERT_LT(x, max);
    negative = negative || x < 0;
    positive = positive || x > 0;
  }
  EXPECT_TRUE(negative && positive);
}

TEST(TuneDomains, QuniformGivesMultiplesOfQWithinBounds) {
  std::set<long> steps;
  for (const json& v : draws(quniform(0.1, 1.0, 0.25), 5000)) {
    double x = v.get<double>();
    ASSERT_GE(x, 0.1);
    ASSERT_LE(x, 1.0);
    double k = x / 0.25;
    ASSERT_NEAR(k, std::round(k), 1e-9) << x;
    steps.insert(std::lround(k));
  }
  // 0.25, 0.5, 0.75, 1.0: 0 lies below lo, so never appears.
  EXPECT_EQ(steps, (std::set<long>{1, 2, 3, 4}));
}

// Ray's other domains: quantized and logarithmic ones, and the normal.
TEST(TuneDomains, RaysQuantizedLogAndNormalDomainsDrawWhatTheySay) {
  std::set<double> qlog;
  for (const json& v : draws(qloguniform(1, 1000, 5), 3000)) {
    const double x = v.get<double>();
    ASSERT_GE(x, 5);  // the first multiple of 5 in [1, 1000]
    ASSERT_LE(x, 1000);
    ASSERT_NEAR(x / 5, std::round(x / 5), 1e-9) << x;
    qlog.insert(x);
  }
  EXPECT_TRUE(qlog.count(5) && qlog.count(1000)) << "both ends are reachable";

  std::set<std::int64_t> qint;
  for (const json& v : draws(qrandint(-21, 12, 3), 3000)) {
    ASSERT_TRUE(v.is_number_integer());
    qint.insert(v.get<std::int64_t>());
  }
  std::set<std::int64_t> want;
  for (std::int64_t k = -21; k <= 12; k += 3) want.insert(k);
  EXPECT_EQ(qint, want) << "every multiple of 3, 12 included";

  // Log-uniform integers: as many below 10 as from 10 to 99.
  int low = 0, high = 0;
  for (const json& v : draws(lograndint(1, 100), 4000)) {
    const auto x = v.get<std::int64_t>();
    ASSERT_GE(x, 1);
    ASSERT_LT(x, 100);
    (x < 10 ? low : high) += 1;
  }
  EXPECT_NEAR(static_cast<double>(low) / (low + high), 0.5, 0.05);
  for (const json& v : draws(qlograndint(1, 100, 10), 1000)) {
    const auto x = v.get<std::int64_t>();
    ASSERT_TRUE(x >= 10 && x <= 100 && x % 10 == 0) << x;
  }

  double sum = 0, squares = 0;
  const std::vector<json> normal = draws(randn(5, 2), 20000);
  for (const json& v : normal) {
    sum += v.get<double>();
    squares += v.get<double>() * v.get<double>();
  }
  const double mean = sum / normal.size();
  EXPECT_NEAR(mean, 5, 0.05);
  EXPECT_NEAR(std::sqrt(squares / normal.size() - mean * mean), 2, 0.05);
  for (const json& v : draws(qrandn(0, 10, 0.5), 500)) {
    ASSERT_NEAR(v.get<double>() / 0.5, std::round(v.get<double>() / 0.5), 1e-9);
  }
}

TEST(TuneDomains, ChoiceCoversEveryValueAndKeepsTheirTypes) {
  json values = {1, "two", json{{"three", 3}}, json::array({4}), nullptr};
  std::vector<int> seen(values.size(), 0);
  for (const json& v : draws(choice(values), 2000)) {
    auto it = std::find(values.begin(), values.end(), v);
    ASSERT_NE(it, values.end()) << v.dump();
    ++seen[static_cast<std::size_t>(it - values.begin())];
  }
  for (int count : seen) EXPECT_GT(count, 300);
}

TEST(TuneSpace, ConstantsAndNestingPassThrough) {
  json spec = {
      {"name", "resnet"},
      {"lr", uniform(0, 1)},
      {"model", {{"act", "relu"}, {"dims", {8, randint(1, 2), 32}}, {"flags", json::object()}}},
      {"none", nullptr}};
  ParamSpace space(spec);
  Rng rng(1);
  json config = space.resolve(0, rng);
  EXPECT_EQ(config["name"], "resnet");
  EXPECT_EQ(config["model"]["act"], "relu");
  EXPECT_EQ(config["model"]["dims"], (json{8, 1, 32}));
  EXPECT_EQ(config["model"]["flags"], json::object());
  EXPECT_TRUE(config["none"].is_null());
  EXPECT_TRUE(config["lr"].is_number_float());
  EXPECT_EQ(space.random_paths(), (std::vector<std::string>{"lr", "model/dims/1"}));
  EXPECT_EQ(space.grid_size(), 1u);
}

TEST(TuneSpace, GridIsAnOdometerWhoseFirstPathTurnsFastest) {
  ParamSpace space(
      {{"b", grid_search({"x", "y", "z"})}, {"a", {{"inner", grid_search({1, 2})}}}, {"c", 5}});
  EXPECT_EQ(space.grid_paths(), (std::vector<std::string>{"a/inner", "b"}));
  ASSERT_EQ(space.grid_size(), 6u);
  Rng rng(0);
  std::vector<std::pair<int, std::string>> points;
  for (std::size_t i = 0; i < 6; ++i) {
    json c = space.resolve(i, rng);
    EXPECT_EQ(c["c"], 5);
    points.emplace_back(c["a"]["inner"].get<int>(), c["b"].get<std::string>());
  }
  EXPECT_EQ(points, (std::vector<std::pair<int, std::string>>{
                        {1, "x"}, {2, "x"}, {1, "y"}, {2, "y"}, {1, "z"}, {2, "z"}}));
  EXPECT_THROW(space.resolve(6, rng), Error);
}

TEST(TuneSpace, SameSeedSameConfigsDifferentSeedDifferent) {
  json spec = {{"lr", loguniform(1e-5, 1)},
               {"k", randint(0, 1000000)},
               {"c", choice({1, 2, 3})},
               {"q", quniform(0, 100, 0.5)},
               {"u", uniform(-1, 1)}};
  ParamSpace space(spec);
  auto run = [&](std::uint64_t seed) {
    Rng rng(seed);
    std::vector<json> out;
    for (int i = 0; i < 20; ++i) out.push_back(space.resolve(0, rng));
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

TEST(TuneSpace, RoundTripsThroughJsonText) {
  json spec = {{"lr", loguniform(1e-4, 1e-1)}, {"g", grid_search({1, 2})}};
  ParamSpace a(spec), b(json::parse(spec.dump()));
  Rng ra(9), rb(9);
  EXPECT_EQ(a.resolve(1, ra), b.resolve(1, rb));
}

TEST(TuneSpace, BadSpacesNameTheKeyPath) {
  expect_invalid({{"model", {{"layers", grid_search(json::array())}}}}, "model/layers",
                 "at least one value");
  expect_invalid({{"act", choice(json::array())}}, "act", "at least one value");
  expect_invalid({{"act", choice("relu")}}, "act", "must be an array");
  expect_invalid({{"opt", {{"lr", loguniform(0, 1)}}}}, "opt/lr", "lo > 0");
  expect_invalid({{"opt", {{"lr", loguniform(-1, 1)}}}}, "opt/lr", "lo > 0");
  expect_invalid({{"x", uniform(1, 1)}}, "x", "lo < hi");
  expect_invalid({{"x", uniform(2, 1)}}, "x", "lo < hi");
  expect_invalid({{"x", uniform(0, std::nan(""))}}, "x", "finite");
  expect_invalid({{"x", uniform(-1.7e308, 1.7e308)}}, "x", "too wide");
  expect_invalid({{"n", randint(3, 3)}}, "n", "hi is exclusive");
  expect_invalid({{"layers", {1, randint(5, 2)}}}, "layers/1", "lo < hi");
  expect_invalid({{"q", quniform(0, 1, 0)}}, "q", "q > 0");
  expect_invalid({{"a", qloguniform(0, 1, 0.1)}}, "a", "lo > 0");
  expect_invalid({{"b", qrandint(5, 1, 1)}}, "b", "lo <= hi");
  expect_invalid({{"c", qrandint(1, 2, 5)}}, "c", "no multiple of 5");
  expect_invalid({{"d", lograndint(0, 10)}}, "d", "lo > 0");
  expect_invalid({{"e", randn(0, 0)}}, "e", "sd > 0");
  expect_invalid({{"f", qrandn(0, 1, -1)}}, "f", "q > 0");
  expect_invalid({{"q", quniform(0.1, 0.2, 0.25)}}, "q", "no multiple");
  expect_invalid({{"x", {{"$cairn.domain", "normal"}, {"mu", 0}}}}, "x", "unknown domain 'normal'");
  expect_invalid({{"x", {{"$cairn.domain", 3}}}}, "x", "must be a string");
  expect_invalid({{"x", {{"$cairn.domain", "uniform"}, {"lo", 0}}}}, "x", "lacks field 'hi'");
  expect_invalid({{"x", {{"$cairn.domain", "uniform"}, {"lo", 0}, {"hi", 1}, {"q", 1}}}}, "x",
                 "no field 'q'");
  expect_invalid({{"x", {{"$cairn.domain", "uniform"}, {"lo", "0"}, {"hi", 1}}}}, "x",
                 "must be a number");
  expect_invalid({{"n", {{"$cairn.domain", "randint"}, {"lo", 0.5}, {"hi", 3}}}}, "n",
                 "must be an integer");
  expect_invalid(
      {{"n", {{"$cairn.domain", "randint"}, {"lo", 0}, {"hi", 18446744073709551615ULL}}}}, "n",
      "does not fit");
  expect_invalid({{"g", grid_search({1, uniform(0, 1)})}}, "g", "values must be constants");
  expect_invalid({{"c", choice({json{{"deep", randint(0, 2)}}})}}, "c", "values must be constants");
  expect_invalid(json::array({1, 2}), "(root)", "JSON object");
  expect_invalid(uniform(0, 1), "(root)", "JSON object");
  // A key holding '/' is escaped as in JSON pointers.
  expect_invalid({{"a/b", uniform(1, 0)}}, "a~1b", "lo < hi");
}

// The error ParamSpace::resolve throws, or a failure if it throws none.
Error resolve_error(const ParamSpace& space) {
  Rng rng(1);
  try {
    space.resolve(0, rng);
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "resolved " << space.spec().dump();
  return Error(ErrorCode::kInternal, "");
}

TEST(TuneSampleFrom, ComputesFromTheResolvedConfigAfterGridAndRandomDomains) {
  std::vector<json> seen;
  SampleFunctions fns;
  fns["twice"] = [&](const json& config, Rng&) -> std::optional<json> {
    seen.push_back(config);
    return config["model"]["width"].get<int>() * 2;
  };
  fns["noise"] = [](const json&, Rng& rng) -> std::optional<json> { return draw_unit(rng); };
  ParamSpace space({{"model", {{"width", grid_search({8, 16})}, {"depth", sample_from("twice")}}},
                    {"lr", uniform(0, 1)},
                    {"jitter", sample_from("noise")}},
                   fns);
  EXPECT_EQ(space.computed_paths(), (std::vector<std::string>{"jitter", "model/depth"}));
  EXPECT_EQ(space.function_names(), (std::vector<std::string>{"noise", "twice"}));
  EXPECT_TRUE(space.random_paths() == std::vector<std::string>{"lr"});
  ASSERT_EQ(space.grid_size(), 2u);
  Rng rng(5);
  const json a = space.resolve(0, rng);
  const json b = space.resolve(1, rng);
  EXPECT_EQ(a["model"]["depth"], 16);
  EXPECT_EQ(b["model"]["depth"], 32);
  EXPECT_TRUE(a["jitter"].is_number_float());
  // The function saw the grid and random values, not the domains.
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0]["model"]["width"], 8);
  EXPECT_TRUE(seen[0]["lr"].is_number_float());
  // Functions that draw only from the Rng given are as deterministic as the rest.
  Rng r1(5), r2(5);
  EXPECT_EQ(space.resolve(0, r1), space.resolve(0, r2));
}

TEST(TuneSampleFrom, AFunctionThatReturnsNothingIsCalledAgainAfterTheOthers) {
  // "a" (first in key order) needs "b"'s value: it is asked again after "b".
  int asked_a = 0;
  SampleFunctions fns;
  fns["a"] = [&](const json& config, Rng&) -> std::optional<json> {
    ++asked_a;
    if (config["b"].is_object()) return std::nullopt;  // still b's domain
    return config["b"].get<int>() + 1;
  };
  fns["b"] = [](const json& config, Rng&) -> std::optional<json> {
    return config["base"].get<int>() * 10;
  };
  ParamSpace space({{"a", sample_from("a")}, {"b", sample_from("b")}, {"base", 4}}, fns);
  Rng rng(0);
  const json c = space.resolve(0, rng);
  EXPECT_EQ(c["b"], 40);
  EXPECT_EQ(c["a"], 41);
  EXPECT_EQ(asked_a, 2);
}

TEST(TuneSampleFrom, MissingFunctionsCyclesAndFailuresNameTheKeyPath) {
  const json spec = {{"opt", {{"lr", sample_from("lr_fn")}}}};
  // Parsed without its function (a restored space may need none) ...
  ParamSpace bare(spec);
  EXPECT_EQ(bare.computed_paths(), (std::vector<std::string>{"opt/lr"}));
  // ... but neither required nor resolved without it.
  testing::expect_invalid_argument([&] { bare.require_functions(); },
                                   "search space: opt/lr: sample_from('lr_fn')");
  EXPECT_NE(std::string(resolve_error(bare).what()).find("opt/lr"), std::string::npos);

  SampleFunctions waiting;
  waiting["x"] = [](const json&, Rng&) -> std::optional<json> { return std::nullopt; };
  const Error cycle = resolve_error(
      ParamSpace({{"p", sample_from("x")}, {"q", sample_from("x")}, {"r", 1}}, waiting));
  EXPECT_EQ(cycle.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(cycle.what()).find("search space: p, q: "), std::string::npos)
      << cycle.what();
  EXPECT_NE(std::string(cycle.what()).find("wait for each other"), std::string::npos);

  SampleFunctions failing;
  failing["boom"] = [](const json&, Rng&) -> std::optional<json> {
    throw Error(ErrorCode::kInvalidArgument, "no width given");
  };
  const Error failed = resolve_error(ParamSpace({{"w", sample_from("boom")}}, failing));
  EXPECT_EQ(failed.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(std::string(failed.what()).find("search space: w: sample_from('boom'): no width given"),
            std::string::npos)
      << failed.what();

  expect_invalid({{"f", {{"$cairn.domain", "sample_from"}, {"fn", ""}}}}, "f", "non-empty string");
  expect_invalid({{"f", {{"$cairn.domain", "sample_from"}}}}, "f", "lacks field 'fn'");
  expect_invalid({{"g", grid_search({sample_from("x")})}}, "g", "values must be constants");
}

TEST(TuneSpace, GridTooLargeToCountIsRefused) {
  json values = json::array();
  for (int i = 0; i < 256; ++i) values.push_back(i);
  json spec = json::object();
  // 256^8 = 2^64 points: one more than size_t can count.
  for (int i = 0; i < 8; ++i) spec["g" + std::to_string(i)] = grid_search(values);
  expect_invalid(spec, "g7", "more points than can be counted");
  spec.erase("g7");
  EXPECT_EQ(ParamSpace(spec).grid_size(), std::size_t{1} << 56);
}

}  // namespace
}  // namespace cairn::tune
