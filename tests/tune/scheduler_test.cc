#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cairn/error.h"
#include "cairn/tune.h"
#include "cairn/tune_schedulers.h"
#include "support/errors.h"

namespace cairn::tune {
namespace {

using nlohmann::json;
using Action = SchedulerDecision::Action;

TrialView view(const std::string& id, json config = json::object(), bool has_checkpoint = false,
               TrialStatus status = TrialStatus::kRunning) {
  TrialView v;
  v.trial_id = id;
  v.config = std::move(config);
  v.status = status;
  v.has_checkpoint = has_checkpoint;
  return v;
}

json result(double t, double score) { return {{"training_iteration", t}, {"score", score}}; }

// A saved state as it comes back from a file.
json round_trip(const json& state) { return json::parse(state.dump()); }

// --- TrialStatus and FIFO --------------------------------------------------

TEST(TrialStatus, RoundTripsThroughItsRayName) {
  for (TrialStatus s : {TrialStatus::kPending, TrialStatus::kRunning, TrialStatus::kPaused,
                        TrialStatus::kTerminated, TrialStatus::kError}) {
    EXPECT_EQ(trial_status_from_string(to_string(s)), s);
  }
  EXPECT_EQ(to_string(TrialStatus::kTerminated), "TERMINATED");
  testing::expect_invalid_argument([] { trial_status_from_string("running"); }, "\"running\"");
  testing::expect_invalid_argument([] { trial_status_from_string(""); }, "unknown trial status");
}

TEST(FIFOScheduler, RunsPendingBeforePausedAndNeverStops) {
  FIFOScheduler fifo;
  std::vector<TrialView> candidates = {view("a", {}, false, TrialStatus::kPaused),
                                       view("b", {}, false, TrialStatus::kPending),
                                       view("c", {}, false, TrialStatus::kPending)};
  EXPECT_EQ(fifo.choose_trial_to_run(candidates), "b");
  EXPECT_EQ(fifo.choose_trial_to_run({candidates[0]}), "a");
  EXPECT_EQ(fifo.choose_trial_to_run({}), std::nullopt);
  EXPECT_EQ(fifo.on_trial_result(view("a"), result(1e9, 0)).action, SchedulerDecision::kContinue);
}

TEST(FIFOScheduler, SavesItsKindAndRefusesOthers) {
  FIFOScheduler fifo;
  EXPECT_EQ(fifo.save(), (json{{"scheduler", "fifo"}, {"version", 1}}));
  fifo.restore(round_trip(fifo.save()));
  testing::expect_invalid_argument(
      [&] {
        fifo.restore({{"scheduler", "asha"}, {"version", 1}});
      },
      "state of scheduler \"asha\", not \"fifo\"");
  testing::expect_invalid_argument(
      [&] {
        fifo.restore({{"scheduler", "fifo"}, {"version", 2}});
      },
      "unsupported version 2");
  testing::expect_invalid_argument([&] { fifo.restore(json::array()); }, "not a JSON object");
}

// --- ASHA --------------------------------------------------------------------

ASHAOptions asha_options(double rf, double max_t, std::string mode = "max") {
  ASHAOptions o;
  o.metric = "score";
  o.mode = std::move(mode);
  o.grace_period = 1;
  o.reduction_factor = rf;
  o.max_t = max_t;
  return o;
}

TEST(ASHAScheduler, RungsAreGracePeriodTimesPowersOfTheFactorBelowMaxT) {
  ASHAOptions o = asha_options(4, 100);
  o.brackets = 3;
  ASHAScheduler asha(o);
  EXPECT_EQ(asha.rungs(0), (std::vector<double>{64, 16, 4, 1}));
  EXPECT_EQ(asha.rungs(1), (std::vector<double>{64, 16, 4}));
  EXPECT_EQ(asha.rungs(2), (std::vector<double>{64, 16}));
  testing::expect_invalid_argument([&] { asha.rungs(3); }, "bracket 3");
  // A milestone equal to max_t is no rung: the trial is done there anyway.
  EXPECT_EQ(ASHAScheduler(asha_options(4, 16)).rungs(0), (std::vector<double>{4, 1}));
}

TEST(ASHAScheduler, StopsTrialsBelowTheRungQuantile) {
  // rf 2: rungs at 1, 2, 4; a trial goes on when its score is at least the
  // median (linear interpolation) of the rung's values, its own included.
  ASHAScheduler asha(asha_options(2, 8));
  for (const char* id : {"a", "b", "c", "d"}) asha.on_trial_add(view(id));
  auto at = [&](const char* id, double t, double score) {
    return asha.on_trial_result(view(id), result(t, score)).action;
  };
  EXPECT_EQ(at("a", 1, 4), SchedulerDecision::kContinue);  // one value: fewer than rf
  EXPECT_EQ(at("b", 1, 3), SchedulerDecision::kStop);      // {3, 4}: cutoff 3.5
  EXPECT_EQ(at("c", 1, 5), SchedulerDecision::kContinue);  // {3, 4, 5}: cutoff 4
  EXPECT_EQ(at("d", 1, 1), SchedulerDecision::kStop);      // {1, 3, 4, 5}: cutoff 3.5
  EXPECT_EQ(at("a", 2, 6), SchedulerDecision::kContinue);  // rung 2: {6}
  EXPECT_EQ(at("c", 2, 6), SchedulerDecision::kContinue);  // {6, 6}: cutoff 6, not below
  // Judged once per rung: a later, worse result at the same rung goes on.
  EXPECT_EQ(at("c", 3, -100), SchedulerDecision::kContinue);
  // Exactly the (1 - 1/rf) quantile survives; just below it does not.
  ASHAScheduler exact(asha_options(2, 8));
  for (const char* id : {"p", "q", "r"}) exact.on_trial_add(view(id));
  exact.on_trial_result(view("p"), result(1, 10));
  exact.on_trial_result(view("q"), result(1, 20));
  EXPECT_EQ(exact.on_trial_result(view("r"), result(1, 15)).action, SchedulerDecision::kContinue);
  json recorded = exact.save()["brackets"][0][2]["recorded"];
  EXPECT_EQ(recorded, (json{{"p", 10.0}, {"q", 20.0}, {"r", 15.0}}));
}

// As Ray 2.x's ASHA (checked beside the real Ray by the Python
// differential suite, python/tests/ray_compat): a value is judged by the
// quantile of the values its rung recorded before it; the first one passes.
TEST(ASHAScheduler, JudgesEachValueByTheValuesItsRungRecordedBefore) {
  ASHAScheduler asha(asha_options(4, 100));
  for (const char* id : {"a", "b", "c", "d", "e"}) asha.on_trial_add(view(id));
  EXPECT_EQ(asha.on_trial_result(view("a"), result(1, 4)).action, SchedulerDecision::kContinue);
  // {4}: the bar is 4.
  EXPECT_EQ(asha.on_trial_result(view("b"), result(1, 3)).action, SchedulerDecision::kStop);
  // {3, 4}: the 0.75 quantile is 3 + 0.75 * (4 - 3) = 3.75.
  EXPECT_EQ(asha.on_trial_result(view("c"), result(1, 5)).action, SchedulerDecision::kContinue);
  // {3, 4, 5}: 4 + 0.5 * (5 - 4) = 4.5.
  EXPECT_EQ(asha.on_trial_result(view("d"), result(1, 4)).action, SchedulerDecision::kStop);
  // {3, 4, 4, 5}: 4 + 0.25 * (5 - 4) = 4.25; 4.5 is not below it.
  EXPECT_EQ(asha.on_trial_result(view("e"), result(1, 4.5)).action, SchedulerDecision::kContinue);
  // A trial judged at a rung is not judged there again.
  EXPECT_EQ(asha.on_trial_result(view("c"), result(2, 0)).action, SchedulerDecision::kContinue);
}

TEST(ASHAScheduler, StopsAtMaxTWithOrWithoutTheMetric) {
  ASHAScheduler asha(asha_options(4, 10));
  asha.on_trial_add(view("a"));
  EXPECT_EQ(asha.on_trial_result(view("a"), result(9.5, 1)).action, SchedulerDecision::kContinue);
  EXPECT_EQ(asha.on_trial_result(view("a"), result(10, 1)).action, SchedulerDecision::kStop);
  EXPECT_EQ(asha.on_trial_result(view("a"), json{{"training_iteration", 12}}).action,
            SchedulerDecision::kStop);
}

TEST(ASHAScheduler, MinModeStopsTheHigherLoss) {
  ASHAOptions o = asha_options(2, 8, "min");
  o.metric = "loss";
  ASHAScheduler asha(o);
  for (const char* id : {"a", "b", "c"}) asha.on_trial_add(view(id));
  auto at = [&](const char* id, double loss) {
    return asha.on_trial_result(view(id), {{"training_iteration", 1}, {"loss", loss}}).action;
  };
  EXPECT_EQ(at("a", 1), SchedulerDecision::kContinue);
  EXPECT_EQ(at("b", 2), SchedulerDecision::kStop);        // the higher loss of {1, 2}
  EXPECT_EQ(at("c", 0.5), SchedulerDecision::kContinue);  // the lowest of {0.5, 1, 2}
}

TEST(ASHAScheduler, AMissingOrNaNMetricDoesNotCount) {
  ASHAScheduler asha(asha_options(2, 8));
  for (const char* id : {"a", "b"}) asha.on_trial_add(view(id));
  asha.on_trial_result(view("a"), result(1, 10));
  EXPECT_EQ(asha.on_trial_result(view("b"), json{{"training_iteration", 1}}).action,
            SchedulerDecision::kContinue);
  EXPECT_EQ(asha.on_trial_result(view("b"), result(1, std::nan(""))).action,
            SchedulerDecision::kContinue);
  EXPECT_EQ(asha.on_trial_result(view("b"), {{"training_iteration", 1}, {"score", "high"}}).action,
            SchedulerDecision::kContinue);
  EXPECT_EQ(asha.save()["brackets"][0][2]["recorded"].size(), 1u);
  // Its first usable result past the milestone is the one judged.
  EXPECT_EQ(asha.on_trial_result(view("b"), result(1.5, 5)).action, SchedulerDecision::kStop);
}

TEST(ASHAScheduler, ATrialSkippingRungsIsJudgedAtTheHighestReached) {
  ASHAScheduler asha(asha_options(2, 16));  // rungs 1, 2, 4, 8
  for (const char* id : {"a", "b"}) asha.on_trial_add(view(id));
  asha.on_trial_result(view("a"), result(5, 10));
  EXPECT_EQ(asha.on_trial_result(view("b"), result(6, 1)).action, SchedulerDecision::kStop);
  json rungs = asha.save()["brackets"][0];
  EXPECT_EQ(rungs[1]["milestone"], 4.0);
  EXPECT_EQ(rungs[1]["recorded"].size(), 2u);
  EXPECT_TRUE(rungs[2]["recorded"].empty());  // milestone 2, skipped
}

TEST(ASHAScheduler, AssignsBracketsRoundRobin) {
  ASHAOptions o = asha_options(2, 16);
  o.brackets = 3;
  ASHAScheduler asha(o);
  for (const char* id : {"t0", "t1", "t2", "t3", "t4"}) asha.on_trial_add(view(id));
  asha.on_trial_add(view("t1"));  // added again: keeps its bracket
  EXPECT_EQ(asha.save()["trials"], (json{{"t0", 0}, {"t1", 1}, {"t2", 2}, {"t3", 0}, {"t4", 1}}));
  // t0 and t3 share bracket 0's rung 1; t1 has no rung at 1 (its lowest is 2).
  asha.on_trial_result(view("t0"), result(1, 5));
  EXPECT_EQ(asha.on_trial_result(view("t3"), result(1, 1)).action, SchedulerDecision::kStop);
  EXPECT_EQ(asha.on_trial_result(view("t1"), result(1, 0)).action, SchedulerDecision::kContinue);
  json state = asha.save();
  EXPECT_EQ(state["brackets"][1].size(), 3u);
  for (const auto& rung : state["brackets"][1]) EXPECT_TRUE(rung["recorded"].empty());
}

TEST(ASHAScheduler, ChoosesPendingBeforePaused) {
  ASHAScheduler asha(asha_options(4, 100));
  EXPECT_EQ(asha.choose_trial_to_run({view("a", {}, false, TrialStatus::kPaused),
                                      view("b", {}, false, TrialStatus::kPending)}),
            "b");
}

TEST(ASHAScheduler, ValidationErrorsNameTheField) {
  auto with = [](auto change) {
    ASHAOptions o;
    change(o);
    return [o] { ASHAScheduler s(o); };
  };
  testing::expect_invalid_argument(with([](ASHAOptions& o) { o.reduction_factor = 1; }),
                                   "ASHAOptions::reduction_factor must be > 1, got 1");
  testing::expect_invalid_argument(with([](ASHAOptions& o) { o.max_t = 0; }), "ASHAOptions::max_t");
  testing::expect_invalid_argument(with([](ASHAOptions& o) { o.grace_period = 0; }),
                                   "ASHAOptions::grace_period");
  testing::expect_invalid_argument(with([](ASHAOptions& o) { o.grace_period = 200; }),
                                   "ASHAOptions::grace_period");
  testing::expect_invalid_argument(with([](ASHAOptions& o) { o.brackets = 0; }),
                                   "ASHAOptions::brackets");
  testing::expect_invalid_argument(with([](ASHAOptions& o) { o.mode = "maximize"; }),
                                   "ASHAOptions::mode");
  testing::expect_invalid_argument(with([](ASHAOptions& o) { o.time_attr = ""; }),
                                   "ASHAOptions::time_attr");
}

TEST(ASHAScheduler, NeedsAMetricAndModeFromItsOptionsOrTheTuneConfig) {
  ASHAScheduler none;
  testing::expect_invalid_argument([&] { none.set_search_properties("", "max"); },
                                   "TuneConfig::metric");
  testing::expect_invalid_argument([&] { none.set_search_properties("", "max"); },
                                   "ASHAOptions::metric");
  testing::expect_invalid_argument([&] { none.set_search_properties("score", ""); },
                                   "TuneConfig::mode");
  testing::expect_invalid_argument([&] { none.set_search_properties("score", "up"); },
                                   "TuneConfig::mode");
  none.on_trial_add(view("a"));
  testing::expect_invalid_argument([&] { none.on_trial_result(view("a"), result(1, 1)); },
                                   "ASHAOptions::metric");
  none.set_search_properties("score", "max");
  EXPECT_EQ(none.save()["metric"], "score");

  // Its own metric and mode win over the TuneConfig's.
  ASHAScheduler own(asha_options(2, 8, "min"));
  own.set_search_properties("accuracy", "max");
  EXPECT_EQ(own.save()["metric"], "score");
  EXPECT_EQ(own.save()["mode"], "min");
}

TEST(ASHAScheduler, TheTimeAttributeMustBeANumber) {
  ASHAScheduler asha(asha_options(4, 100));
  asha.on_trial_add(view("trial_7"));
  testing::expect_invalid_argument(
      [&] {
        asha.on_trial_result(view("trial_7"), json{{"score", 1}});
      },
      "trial 'trial_7': result['training_iteration'] must be a number");
  testing::expect_invalid_argument(
      [&] {
        asha.on_trial_result(view("trial_7"), {{"training_iteration", "3"}, {"score", 1}});
      },
      "training_iteration");
  testing::expect_invalid_argument([&] { asha.on_trial_result(view("ghost"), result(1, 1)); },
                                   "'ghost'");
}

// A reproducible stream of results for `trials` trials: each result comes from
// a trial still running, advancing its time by 1 or 2.
struct Step {
  std::string id;
  json result;
  bool has_checkpoint;
};

std::vector<Step> random_steps(std::size_t count, std::size_t trials, std::uint64_t seed,
                               const std::set<std::string>& skip = {}) {
  Rng rng(seed);
  std::vector<double> time(trials, 0);
  std::vector<Step> steps;
  while (steps.size() < count) {
    std::size_t i = static_cast<std::size_t>(draw_below(rng, trials));
    std::string id = "trial_" + std::to_string(i);
    if (skip.contains(id)) continue;
    time[i] += 1 + static_cast<double>(draw_below(rng, 2));
    json r = {{"training_iteration", time[i]}};
    // Mostly a score that drifts with the trial; now and then none.
    if (draw_below(rng, 10) != 0) r["score"] = static_cast<double>(i) + 5 * draw_unit(rng);
    steps.push_back({id, r, draw_below(rng, 3) != 0});
  }
  return steps;
}

TEST(ASHAScheduler, RestoredMidRunDecidesAsTheUninterruptedOne) {
  ASHAOptions o = asha_options(2, 40);
  o.brackets = 2;
  ASHAScheduler whole(o);
  std::optional<ASHAScheduler> resumed;
  for (int i = 0; i < 8; ++i) whole.on_trial_add(view("trial_" + std::to_string(i)));
  std::set<std::string> stopped;
  int stops = 0;
  Rng rng(5);
  std::vector<double> time(8, 0);
  for (int step = 0; step < 200; ++step) {
    if (step == 100) {
      resumed.emplace(o);
      resumed->restore(round_trip(whole.save()));
      EXPECT_EQ(resumed->save(), whole.save());
    }
    auto i = static_cast<std::size_t>(draw_below(rng, 8));
    std::string id = "trial_" + std::to_string(i);
    if (stopped.contains(id)) continue;
    time[i] += 1;
    json r = result(time[i], draw_unit(rng));
    Action a = whole.on_trial_result(view(id), r).action;
    if (resumed) {
      EXPECT_EQ(resumed->on_trial_result(view(id), r).action, a) << "step " << step;
    }
    if (a == SchedulerDecision::kStop) {
      stopped.insert(id);
      ++stops;
    }
  }
  EXPECT_GT(stops, 2);
  EXPECT_EQ(resumed->save(), whole.save());
}

TEST(ASHAScheduler, RestoreRefusesAnotherStateAndChangesNothing) {
  ASHAScheduler asha(asha_options(2, 8));
  asha.on_trial_add(view("a"));
  asha.on_trial_result(view("a"), result(1, 3));
  const json before = asha.save();

  json other = before;
  other["scheduler"] = "pbt";
  testing::expect_invalid_argument([&] { asha.restore(other); },
                                   "state of scheduler \"pbt\", not \"asha\"");
  json newer = before;
  newer["version"] = 2;
  testing::expect_invalid_argument([&] { asha.restore(newer); }, "unsupported version 2");
  json reshaped = before;
  reshaped["brackets"][0][0]["milestone"] = 5;
  testing::expect_invalid_argument([&] { asha.restore(reshaped); }, "milestone");
  json bad_value = before;
  bad_value["brackets"][0][2]["recorded"]["zzz"] = "lots";
  testing::expect_invalid_argument([&] { asha.restore(bad_value); }, "'zzz'");
  json other_metric = before;
  other_metric["metric"] = "loss";
  testing::expect_invalid_argument([&] { asha.restore(other_metric); }, "metric");
  EXPECT_EQ(asha.save(), before);

  // An infinite score (a diverged loss) survives the JSON round trip.
  ASHAScheduler inf(asha_options(2, 8, "min"));
  inf.on_trial_add(view("x"));
  inf.on_trial_result(view("x"), result(1, std::numeric_limits<double>::infinity()));
  ASHAScheduler back(asha_options(2, 8, "min"));
  back.restore(round_trip(inf.save()));
  EXPECT_EQ(back.save(), inf.save());
}

// --- PBT ---------------------------------------------------------------------

json mutations() {
  return {{"lr", loguniform(1e-4, 1e-1)},
          {"width", randint(10, 1000)},
          {"batch", json::array({16, 32, 64, 128})},
          {"act", choice({"relu", "gelu", "tanh"})},
          {"model", {{"dropout", uniform(0.0, 0.5)}}}};
}

PBTOptions pbt_options(double resample_probability = 0.25, std::uint64_t seed = 1) {
  PBTOptions o;
  o.metric = "score";
  o.mode = "max";
  o.perturbation_interval = 1;
  o.hyperparam_mutations = mutations();
  o.resample_probability = resample_probability;
  o.seed = seed;
  return o;
}

json base_config() {
  return {{"lr", 0.01},
          {"width", 100},
          {"batch", 32},
          {"act", "gelu"},
          {"model", {{"dropout", 0.25}, {"depth", 3}}},
          {"name", "mlp"}};
}

TEST(PopulationBasedTraining, ExplorePerturbsByTheFactorsAndListNeighbours) {
  PopulationBasedTraining pbt(pbt_options(/*resample_probability=*/0));
  std::set<json> lr, width, batch, act, dropout;
  for (int i = 0; i < 200; ++i) {
    json c = pbt.explore(base_config());
    lr.insert(c["lr"]);
    width.insert(c["width"]);
    EXPECT_TRUE(c["width"].is_number_integer()) << c["width"];
    EXPECT_TRUE(c["lr"].is_number_float());
    batch.insert(c["batch"]);
    act.insert(c["act"]);
    dropout.insert(c["model"]["dropout"]);
    EXPECT_EQ(c["name"], "mlp");        // not mutated: kept
    EXPECT_EQ(c["model"]["depth"], 3);  // nested, not mutated: kept
  }
  EXPECT_EQ(lr, (std::set<json>{0.01 * 0.8, 0.01 * 1.2}));
  EXPECT_EQ(width, (std::set<json>{80, 120}));
  EXPECT_EQ(batch, (std::set<json>{16, 64}));
  EXPECT_EQ(act, (std::set<json>{"relu", "tanh"}));
  EXPECT_EQ(dropout, (std::set<json>{0.25 * 0.8, 0.25 * 1.2}));

  // Integers round to the nearest; list moves clamp at the ends.
  std::set<json> w, b, a;
  for (int i = 0; i < 100; ++i) {
    json c = base_config();
    c["width"] = 13;
    c["batch"] = 128;
    c["act"] = "relu";
    c = pbt.explore(c);
    w.insert(c["width"]);
    b.insert(c["batch"]);
    a.insert(c["act"]);
  }
  EXPECT_EQ(w, (std::set<json>{10, 16}));  // 10.4 and 15.6
  EXPECT_EQ(b, (std::set<json>{64, 128}));
  EXPECT_EQ(a, (std::set<json>{"relu", "gelu"}));
}

TEST(PopulationBasedTraining, ExploreResamplesWithinTheDomain) {
  PopulationBasedTraining pbt(pbt_options(/*resample_probability=*/1));
  std::set<json> batch;
  for (int i = 0; i < 300; ++i) {
    json c = pbt.explore(base_config());
    double lr = c["lr"].get<double>();
    EXPECT_TRUE(lr >= 1e-4 && lr < 1e-1) << lr;
    ASSERT_TRUE(c["width"].is_number_integer());
    EXPECT_TRUE(c["width"].get<int>() >= 10 && c["width"].get<int>() < 1000);
    double dropout = c["model"]["dropout"].get<double>();
    EXPECT_TRUE(dropout >= 0 && dropout < 0.5) << dropout;
    batch.insert(c["batch"]);
  }
  EXPECT_EQ(batch, (std::set<json>{16, 32, 64, 128}));
}

TEST(PopulationBasedTraining, ExploreResamplesMissingOrUnlistedValues) {
  PopulationBasedTraining pbt(pbt_options(/*resample_probability=*/0));
  std::set<json> batch;
  for (int i = 0; i < 200; ++i) {
    json c = pbt.explore({{"batch", 48}, {"lr", "fast"}});
    batch.insert(c["batch"]);
    double lr = c["lr"].get<double>();
    EXPECT_TRUE(lr >= 1e-4 && lr < 1e-1);
    EXPECT_TRUE(c.contains("width"));
    EXPECT_TRUE(c["act"].is_string());
    EXPECT_TRUE(c["model"]["dropout"].is_number());
  }
  EXPECT_EQ(batch, (std::set<json>{16, 32, 64, 128}));
}

TEST(PopulationBasedTraining, ASampleFromMutationCallsItsFunctionOrPerturbsItsNumber) {
  for (const double resample : {0.0, 1.0}) {
    SCOPED_TRACE(resample);
    PBTOptions o = pbt_options(resample);
    o.hyperparam_mutations = {{"lr", sample_from("lr")}, {"opt", {{"momentum", 0.9}}}};
    o.hyperparam_mutations["opt"]["momentum"] = sample_from("momentum");
    std::vector<json> seen;
    o.sample_functions["lr"] = [&](const json& config, Rng& rng) -> std::optional<json> {
      seen.push_back(config);
      return 0.5 + draw_unit(rng) / 10;
    };
    o.sample_functions["momentum"] = [](const json&, Rng&) -> std::optional<json> {
      return "nesterov";
    };
    PopulationBasedTraining pbt(o);
    for (int i = 0; i < 50; ++i) {
      const json c = pbt.explore({{"lr", 0.01}, {"opt", {{"momentum", "plain"}}}});
      const double lr = c["lr"].get<double>();
      if (resample == 1) {
        EXPECT_TRUE(lr >= 0.5 && lr < 0.6) << lr;  // the function's value
      } else {
        EXPECT_TRUE(lr == 0.01 * 0.8 || lr == 0.01 * 1.2) << lr;  // a number, perturbed
      }
      // Not a number: always the function's value.
      EXPECT_EQ(c["opt"]["momentum"], "nesterov");
    }
    if (resample == 1) {
      ASSERT_FALSE(seen.empty());
      EXPECT_EQ(seen.front()["opt"]["momentum"], "plain");  // the config explored so far
    } else {
      EXPECT_TRUE(seen.empty());
    }
  }
  // A function that fails, or returns nothing, names the mutation.
  PBTOptions o = pbt_options(1);
  o.hyperparam_mutations = {{"lr", sample_from("lr")}};
  o.sample_functions["lr"] = [](const json&, Rng&) -> std::optional<json> { return std::nullopt; };
  testing::expect_invalid_argument(
      [&] {
        PopulationBasedTraining(o).explore({{"lr", 1.0}});
      },
      "lr: sample_from('lr') returned no value");
  o.sample_functions["lr"] = [](const json&, Rng&) -> std::optional<json> {
    throw Error(ErrorCode::kInvalidArgument, "ValueError: bad lr");
  };
  testing::expect_invalid_argument(
      [&] {
        PopulationBasedTraining(o).explore({{"lr", 1.0}});
      },
      "lr: sample_from('lr'): ValueError: bad lr");
}

// Reports a result for each of `scores` in order (trial_0 first), all at time
// t with a checkpoint, and returns the last decision.
SchedulerDecision report_all(PopulationBasedTraining& pbt, const std::vector<double>& scores,
                             double t) {
  SchedulerDecision last;
  for (std::size_t i = 0; i < scores.size(); ++i) {
    std::string id = "trial_" + std::to_string(i);
    last = pbt.on_trial_result(view(id, base_config(), true), result(t, scores[i]));
  }
  return last;
}

TEST(PopulationBasedTraining, BottomQuantileClonesATopTrialWithAPerturbedConfig) {
  PopulationBasedTraining pbt(pbt_options(/*resample_probability=*/0));
  pbt.set_search_properties("", "");
  std::vector<json> configs;
  for (int i = 0; i < 4; ++i) {
    json c = base_config();
    c["lr"] = 0.01 * (i + 1);
    c["batch"] = json::array({16, 32, 64, 128})[static_cast<std::size_t>(i)];
    configs.push_back(c);
    pbt.on_trial_add(view("trial_" + std::to_string(i), c));
  }
  // Scores 1 < 2 < 3 < 4: with 4 trials and q = 0.25 the bottom and top
  // quantiles hold one trial each.
  EXPECT_FALSE(report_all(pbt, {1, 2, 3, 4}, 1).clone_from);
  SchedulerDecision d = pbt.on_trial_result(view("trial_0", configs[0], true), result(2, 0.5));
  EXPECT_EQ(d.action, SchedulerDecision::kContinue);
  ASSERT_EQ(d.clone_from, "trial_3");
  const json& c = d.new_config;
  const double lr = configs[3]["lr"].get<double>();
  EXPECT_TRUE(c["lr"] == lr * 0.8 || c["lr"] == lr * 1.2) << c["lr"];
  // 128 is the last entry: the step up stays there.
  EXPECT_TRUE(c["batch"] == 64 || c["batch"] == 128) << c["batch"];
  EXPECT_TRUE(c["width"] == 80 || c["width"] == 120);
  EXPECT_EQ(c["name"], "mlp");
  json state = pbt.save();
  EXPECT_EQ(state["num_perturbations"], 1);
  EXPECT_EQ(state["trials"]["trial_0"]["config"], c);
  // The clone resumes at the source's checkpoint: it takes the source's clock.
  EXPECT_EQ(state["trials"]["trial_0"]["last_perturbation_time"], 1.0);
  // Within the interval of that clock nothing happens.
  EXPECT_FALSE(pbt.on_trial_result(view("trial_0", c, true), result(1.5, 0)).clone_from);
  // Middle trials go on unchanged.
  EXPECT_FALSE(pbt.on_trial_result(view("trial_1", configs[1], true), result(2, 2)).clone_from);
}

// Ray's burn_in_period: no perturbation before time_attr reaches it; and its
// perturbation_factors replace x0.8 and x1.2.
TEST(PopulationBasedTraining, NothingIsPerturbedWithinTheBurnInAndTheFactorsAreTheOnesGiven) {
  PBTOptions o = pbt_options(/*resample_probability=*/0);
  o.burn_in_period = 3;
  o.perturbation_factor_up = 2.0;
  o.perturbation_factor_down = 0.5;
  PopulationBasedTraining pbt(o);
  pbt.set_search_properties("", "");
  for (int i = 0; i < 4; ++i) pbt.on_trial_add(view("trial_" + std::to_string(i), base_config()));
  EXPECT_FALSE(report_all(pbt, {1, 2, 3, 4}, 1).clone_from);
  EXPECT_FALSE(report_all(pbt, {1, 2, 3, 4}, 2.5).clone_from);
  EXPECT_EQ(pbt.save()["num_perturbations"], 0);
  report_all(pbt, {4, 3, 2, 1}, 3);  // past the burn-in: the worst are exploited
  EXPECT_GE(pbt.save()["num_perturbations"], 1);
  std::set<json> lr;
  for (int i = 0; i < 50; ++i) lr.insert(pbt.explore(base_config())["lr"]);
  EXPECT_EQ(lr, (std::set<json>{0.01 * 0.5, 0.01 * 2.0}));
  // The options survive a save, for a restore given no scheduler.
  const json options = pbt.save()["options"];
  EXPECT_EQ(options["burn_in_period"], 3.0);
  EXPECT_EQ(options["perturbation_factor_up"], 2.0);
  EXPECT_EQ(options["perturbation_factor_down"], 0.5);
  o.burn_in_period = -1;
  testing::expect_invalid_argument([&] { PopulationBasedTraining{o}; }, "burn_in_period");
  o.burn_in_period = 0;
  o.perturbation_factor_up = 0;
  testing::expect_invalid_argument([&] { PopulationBasedTraining{o}; }, "perturbation_factor_up");
}

TEST(PopulationBasedTraining, NoCloneWhenNoTopTrialHasACheckpoint) {
  PopulationBasedTraining pbt(pbt_options());
  for (int i = 0; i < 4; ++i) pbt.on_trial_add(view("trial_" + std::to_string(i), base_config()));
  for (int i = 0; i < 4; ++i) {
    // Only the bottom trial has a checkpoint.
    pbt.on_trial_result(view("trial_" + std::to_string(i), base_config(), i == 0),
                        result(1, i + 1.0));
  }
  SchedulerDecision d = pbt.on_trial_result(view("trial_0", base_config(), true), result(2, 0));
  EXPECT_EQ(d.action, SchedulerDecision::kContinue);
  EXPECT_FALSE(d.clone_from);
  EXPECT_EQ(pbt.save()["num_perturbations"], 0);
}

TEST(PopulationBasedTraining, QuantilesFollowRaysSizeRule) {
  // ceil(n * q) capped at floor(n / 2): with 2 or 3 trials and q = 0.25 the
  // worst one is still exploited; a lone trial never is.
  PopulationBasedTraining pbt(pbt_options());
  pbt.on_trial_add(view("trial_0", base_config()));
  EXPECT_FALSE(report_all(pbt, {1}, 1).clone_from);
  EXPECT_FALSE(report_all(pbt, {1}, 2).clone_from);
  pbt.on_trial_add(view("trial_1", base_config()));
  pbt.on_trial_result(view("trial_1", base_config(), true), result(1, 5));
  SchedulerDecision d = pbt.on_trial_result(view("trial_0", base_config(), true), result(3, 0));
  EXPECT_EQ(d.clone_from, "trial_1");
}

TEST(PopulationBasedTraining, EqualScoresRankTheGreaterIdLower) {
  PopulationBasedTraining pbt(pbt_options());
  for (int i = 0; i < 2; ++i) pbt.on_trial_add(view("trial_" + std::to_string(i), base_config()));
  EXPECT_FALSE(pbt.on_trial_result(view("trial_0", base_config(), true), result(1, 1)).clone_from);
  // trial_1 ties trial_0 and ranks below it.
  EXPECT_EQ(pbt.on_trial_result(view("trial_1", base_config(), true), result(1, 1)).clone_from,
            "trial_0");
  EXPECT_FALSE(pbt.on_trial_result(view("trial_0", base_config(), true), result(2, 1)).clone_from);
}

TEST(PopulationBasedTraining, FinishedAndFailedTrialsAreNeitherRankedNorCloned) {
  PopulationBasedTraining pbt(pbt_options());
  for (int i = 0; i < 3; ++i) pbt.on_trial_add(view("trial_" + std::to_string(i), base_config()));
  report_all(pbt, {1, 2, 3}, 1);
  pbt.on_trial_error(view("trial_2", base_config(), true, TrialStatus::kError));
  // Now trial_1 is the top of two: the source.
  EXPECT_EQ(pbt.on_trial_result(view("trial_0", base_config(), true), result(2, 0)).clone_from,
            "trial_1");
  pbt.on_trial_complete(view("trial_1", base_config(), true, TrialStatus::kTerminated),
                        result(2, 2));
  // Alone now: nothing to clone.
  EXPECT_FALSE(pbt.on_trial_result(view("trial_0", base_config(), true), result(3, 0)).clone_from);
}

TEST(PopulationBasedTraining, AResultWithoutTheMetricChangesNothing) {
  PopulationBasedTraining pbt(pbt_options());
  pbt.on_trial_add(view("trial_0", base_config()));
  pbt.on_trial_result(view("trial_0", base_config()), json{{"training_iteration", 3}});
  json st = pbt.save()["trials"]["trial_0"];
  EXPECT_EQ(st["last_perturbation_time"], 0.0);
  EXPECT_TRUE(st["last_score"].is_null());
  testing::expect_invalid_argument(
      [&] {
        pbt.on_trial_result(view("trial_0"), json{{"score", 1}});
      },
      "trial 'trial_0': result['training_iteration'] must be a number");
}

TEST(PopulationBasedTraining, ChoosesPausedClonesBeforePendingTrials) {
  PopulationBasedTraining pbt(pbt_options());
  EXPECT_EQ(pbt.choose_trial_to_run({view("a", {}, false, TrialStatus::kPending),
                                     view("b", {}, false, TrialStatus::kPaused)}),
            "b");
  EXPECT_EQ(pbt.choose_trial_to_run({view("a", {}, false, TrialStatus::kPending)}), "a");
}

// Feeds steps [from, to) to `pbt`, appending its decisions to `out`.
void feed(PopulationBasedTraining& pbt, const std::vector<Step>& steps, std::size_t from,
          std::size_t to, std::vector<SchedulerDecision>& out) {
  for (std::size_t i = from; i < to; ++i) {
    const Step& s = steps[i];
    out.push_back(pbt.on_trial_result(view(s.id, base_config(), s.has_checkpoint), s.result));
  }
}

void add_trials(PopulationBasedTraining& pbt, int n) {
  for (int i = 0; i < n; ++i) {
    json c = base_config();
    c["lr"] = 0.001 * (i + 1);
    pbt.on_trial_add(view("trial_" + std::to_string(i), c));
  }
}

void expect_same(const std::vector<SchedulerDecision>& a, const std::vector<SchedulerDecision>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].action, b[i].action) << "at " << i;
    EXPECT_EQ(a[i].clone_from, b[i].clone_from) << "at " << i;
    EXPECT_EQ(a[i].new_config, b[i].new_config) << "at " << i;
  }
}

TEST(PopulationBasedTraining, SameSeedSameDecisionsAndNeverItsOwnSource) {
  std::vector<Step> steps = random_steps(200, 8, 17);
  std::vector<SchedulerDecision> a, b, c;
  PopulationBasedTraining one(pbt_options(0.25, 3)), two(pbt_options(0.25, 3)),
      other(pbt_options(0.25, 4));
  for (auto* p : {&one, &two, &other}) add_trials(*p, 8);
  feed(one, steps, 0, steps.size(), a);
  feed(two, steps, 0, steps.size(), b);
  feed(other, steps, 0, steps.size(), c);
  expect_same(a, b);
  int clones = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!a[i].clone_from) continue;
    ++clones;
    EXPECT_NE(*a[i].clone_from, steps[i].id);
  }
  EXPECT_GT(clones, 5);
  bool differ = false;
  for (std::size_t i = 0; i < a.size(); ++i) differ = differ || a[i].new_config != c[i].new_config;
  EXPECT_TRUE(differ) << "another seed explores differently";
}

TEST(PopulationBasedTraining, RestoredAtStep100DecidesAsTheUninterruptedOne) {
  std::vector<Step> steps = random_steps(200, 8, 23);
  PopulationBasedTraining whole(pbt_options(0.25, 9));
  add_trials(whole, 8);
  std::vector<SchedulerDecision> first, rest_whole, rest_resumed;
  feed(whole, steps, 0, 100, first);
  PopulationBasedTraining resumed(pbt_options(0.25, 12345));  // the seed comes from the state
  resumed.restore(round_trip(whole.save()));
  EXPECT_EQ(resumed.save(), whole.save());
  feed(whole, steps, 100, 200, rest_whole);
  feed(resumed, steps, 100, 200, rest_resumed);
  expect_same(rest_whole, rest_resumed);
  int clones = 0;
  for (const auto& d : rest_whole) clones += d.clone_from ? 1 : 0;
  EXPECT_GT(clones, 2);
  EXPECT_EQ(resumed.save(), whole.save());
}

TEST(PopulationBasedTraining, RestoreRefusesAnotherStateAndChangesNothing) {
  PopulationBasedTraining pbt(pbt_options());
  add_trials(pbt, 2);
  const json before = pbt.save();
  json other = before;
  other["scheduler"] = "asha";
  testing::expect_invalid_argument([&] { pbt.restore(other); },
                                   "state of scheduler \"asha\", not \"pbt\"");
  json newer = before;
  newer["version"] = 7;
  testing::expect_invalid_argument([&] { pbt.restore(newer); }, "unsupported version 7");
  json bad_rng = before;
  bad_rng["rng"] = "12 34";
  testing::expect_invalid_argument([&] { pbt.restore(bad_rng); }, "'rng'");
  json bad_trial = before;
  bad_trial["trials"]["trial_1"].erase("done");
  testing::expect_invalid_argument([&] { pbt.restore(bad_trial); }, "trial 'trial_1' lacks 'done'");
  EXPECT_EQ(pbt.save(), before);
}

TEST(PopulationBasedTraining, ValidationErrorsNameTheField) {
  auto with = [](auto change) {
    PBTOptions o = pbt_options();
    change(o);
    return [o] { PopulationBasedTraining s(o); };
  };
  testing::expect_invalid_argument(with([](PBTOptions& o) { o.quantile_fraction = 0.6; }),
                                   "PBTOptions::quantile_fraction must be in (0, 0.5], got 0.6");
  testing::expect_invalid_argument(with([](PBTOptions& o) { o.quantile_fraction = 0; }),
                                   "PBTOptions::quantile_fraction");
  testing::expect_invalid_argument(with([](PBTOptions& o) { o.resample_probability = 1.5; }),
                                   "PBTOptions::resample_probability");
  testing::expect_invalid_argument(with([](PBTOptions& o) { o.perturbation_interval = 0; }),
                                   "PBTOptions::perturbation_interval");
  testing::expect_invalid_argument(with([](PBTOptions& o) { o.mode = "best"; }),
                                   "PBTOptions::mode");
  testing::expect_invalid_argument(
      with([](PBTOptions& o) { o.hyperparam_mutations = json::object(); }),
      "PBTOptions::hyperparam_mutations must be a non-empty JSON object");
  testing::expect_invalid_argument(with([](PBTOptions& o) {
                                     o.hyperparam_mutations = {{"lr", 0.1}};
                                   }),
                                   "PBTOptions::hyperparam_mutations: lr: must be a domain");
  testing::expect_invalid_argument(with([](PBTOptions& o) {
                                     o.hyperparam_mutations = {{"model", {{"p", uniform(1, 0)}}}};
                                   }),
                                   "model/p");
  testing::expect_invalid_argument(with([](PBTOptions& o) {
                                     o.hyperparam_mutations = {{"b", grid_search({1, 2})}};
                                   }),
                                   "b: grid_search");
  testing::expect_invalid_argument(with([](PBTOptions& o) {
                                     o.hyperparam_mutations = {{"b", sample_from("f")}};
                                   }),
                                   "b: sample_from('f'): its function was not given");
  testing::expect_invalid_argument(with([](PBTOptions& o) {
                                     o.hyperparam_mutations = {{"b", json::array()}};
                                   }),
                                   "b: a list of values must not be empty");
  testing::expect_invalid_argument(with([](PBTOptions& o) {
                                     o.hyperparam_mutations = {{"m", json::object()}};
                                   }),
                                   "m: an object of nested mutations must not be empty");

  PopulationBasedTraining none([] {
    PBTOptions o = pbt_options();
    o.metric = "";
    return o;
  }());
  testing::expect_invalid_argument([&] { none.set_search_properties("", "max"); },
                                   "PBTOptions::metric");
  testing::expect_invalid_argument([&] { none.set_search_properties("", "max"); },
                                   "TuneConfig::metric");
}

}  // namespace
}  // namespace cairn::tune
