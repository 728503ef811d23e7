// Asynchronous successive halving (ASHAScheduler, cairn/tune_schedulers.h):
// rungs, their cutoffs, and the saved state. Pure logic.
#include "cairn/tune_schedulers.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <utility>

#include <fmt/format.h>

#include "cairn/error.h"
#include "tune/domain.h"

#include "tune/scheduler_common.h"

namespace cairn::tune {

using nlohmann::json;
using namespace scheduler_common;
using internal::check_mode;

// ---------------------------------------------------------------------------
// ASHAScheduler

namespace {

constexpr const char* kAsha = "ASHAScheduler";

// The (1 - 1/rf) quantile of `recorded`, interpolated linearly between the
// two nearest ranks (numpy's default, which Ray's ASHA uses).
double rung_cutoff(const std::map<std::string, double>& recorded, double rf) {
  std::vector<double> v;
  v.reserve(recorded.size());
  for (const auto& [id, score] : recorded) v.push_back(score);
  std::sort(v.begin(), v.end());
  double pos = (1 - 1 / rf) * static_cast<double>(v.size() - 1);
  auto i = static_cast<std::size_t>(std::floor(pos));
  double frac = pos - static_cast<double>(i);
  if (i + 1 >= v.size() || frac == 0) return v[i];
  double a = v[i];
  double b = v[i + 1];
  // Sorted, so only these infinite cases remain; the plain formula would
  // give NaN for them.
  if (a == b) return a;
  if (std::isinf(a)) return a;
  if (std::isinf(b)) return b;
  return a + frac * (b - a);
}

}  // namespace

ASHAScheduler::ASHAScheduler(ASHAOptions options) : options_(std::move(options)) {
  const ASHAOptions& o = options_;
  if (o.time_attr.empty()) invalid("ASHAOptions::time_attr must not be empty");
  if (!(o.max_t > 0) || !std::isfinite(o.max_t)) {
    invalid(fmt::format("ASHAOptions::max_t must be a finite number > 0, got {}", o.max_t));
  }
  if (!(o.grace_period > 0) || o.grace_period > o.max_t) {
    invalid(fmt::format("ASHAOptions::grace_period must be > 0 and <= max_t ({}), got {}", o.max_t,
                        o.grace_period));
  }
  if (!(o.reduction_factor > 1) || !std::isfinite(o.reduction_factor)) {
    invalid(fmt::format("ASHAOptions::reduction_factor must be > 1, got {}", o.reduction_factor));
  }
  if (o.brackets < 1)
    invalid(fmt::format("ASHAOptions::brackets must be >= 1, got {}", o.brackets));
  check_mode(o.mode, "ASHAOptions::mode");

  // Milestones grace_period * rf^k below max_t, by repeated multiplication.
  std::vector<double> milestones;
  for (double m = o.grace_period; m < o.max_t; m *= o.reduction_factor) {
    if (milestones.size() == kMaxRungs) {
      invalid(fmt::format(
          "ASHAOptions::reduction_factor {} makes more than {} rungs from grace_period {} to "
          "max_t {}",
          o.reduction_factor, kMaxRungs, o.grace_period, o.max_t));
    }
    milestones.push_back(m);
  }
  // Bracket b skips the lowest b rungs (Ray's bracket s); highest first.
  for (int b = 0; b < o.brackets; ++b) {
    std::vector<Rung> bracket;
    for (std::size_t k = milestones.size(); k-- > static_cast<std::size_t>(b);) {
      bracket.push_back(Rung{milestones[k], {}});
    }
    brackets_.push_back(std::move(bracket));
  }
}

std::vector<double> ASHAScheduler::rungs(int bracket) const {
  if (bracket < 0 || static_cast<std::size_t>(bracket) >= brackets_.size()) {
    invalid(fmt::format("{}: bracket {} out of range (the scheduler has {})", kAsha, bracket,
                        brackets_.size()));
  }
  std::vector<double> out;
  for (const auto& rung : brackets_[static_cast<std::size_t>(bracket)]) {
    out.push_back(rung.milestone);
  }
  return out;
}

void ASHAScheduler::set_search_properties(const std::string& metric, const std::string& mode) {
  adopt_search_properties(options_.metric, options_.mode, metric, mode, kAsha, "ASHAOptions");
}

void ASHAScheduler::on_trial_add(const TrialView& trial) {
  // Adding a trial twice (a restored Tuner re-adding its trials) keeps its
  // bracket.
  if (trial_bracket_.contains(trial.trial_id)) return;
  trial_bracket_.emplace(trial.trial_id, next_bracket_);
  next_bracket_ = (next_bracket_ + 1) % static_cast<int>(brackets_.size());
}

SchedulerDecision ASHAScheduler::on_trial_result(const TrialView& trial, const json& result) {
  require_search_properties(options_.metric, options_.mode, kAsha, "ASHAOptions");
  double t = time_of(result, options_.time_attr, trial.trial_id, kAsha);
  auto found = trial_bracket_.find(trial.trial_id);
  if (found == trial_bracket_.end()) {
    invalid(fmt::format("{}: trial '{}' was never added (on_trial_add)", kAsha, trial.trial_id));
  }
  SchedulerDecision decision;
  if (t >= options_.max_t) {
    decision.action = SchedulerDecision::kStop;
    return decision;
  }
  std::optional<double> score = score_of(result, options_.metric, options_.mode);
  if (!score) return decision;
  // The highest rung reached is the one that judges; rungs skipped on the
  // way get no value from this trial. As in Ray (2.x): the bar is the
  // quantile of the values the rung recorded before this one, and the
  // first value a rung records passes.
  for (Rung& rung : brackets_[static_cast<std::size_t>(found->second)]) {
    if (t < rung.milestone) continue;
    if (rung.recorded.contains(trial.trial_id)) break;  // judged here already
    if (!rung.recorded.empty() && *score < rung_cutoff(rung.recorded, options_.reduction_factor)) {
      decision.action = SchedulerDecision::kStop;
    }
    rung.recorded.emplace(trial.trial_id, *score);
    break;
  }
  return decision;
}

void ASHAScheduler::on_trial_complete(const TrialView&, const json&) {
  // Nothing to do: a finished trial's rung values stay, as they still set the
  // bar for the trials that come after it.
}

void ASHAScheduler::on_trial_error(const TrialView&) {
  // Likewise: its recorded values stay in the rungs.
}

std::optional<std::string> ASHAScheduler::choose_trial_to_run(
    const std::vector<TrialView>& candidates) {
  if (auto id = first_with_status(candidates, TrialStatus::kPending)) return id;
  return first_with_status(candidates, TrialStatus::kPaused);
}

json ASHAScheduler::save() const {
  json brackets = json::array();
  for (const auto& bracket : brackets_) {
    json rungs = json::array();
    for (const auto& rung : bracket) {
      json recorded = json::object();
      for (const auto& [id, score] : rung.recorded) recorded[id] = encode_number(score);
      rungs.push_back({{"milestone", rung.milestone}, {"recorded", std::move(recorded)}});
    }
    brackets.push_back(std::move(rungs));
  }
  json trials = json::object();
  for (const auto& [id, bracket] : trial_bracket_) trials[id] = bracket;
  // The options too, so that a restore given no scheduler can rebuild it.
  const json options = {{"time_attr", options_.time_attr},
                        {"max_t", options_.max_t},
                        {"grace_period", options_.grace_period},
                        {"reduction_factor", options_.reduction_factor},
                        {"brackets", options_.brackets}};
  return json{{"scheduler", name()},         {"version", kStateVersion},
              {"options", options},          {"metric", options_.metric},
              {"mode", options_.mode},       {"next_bracket", next_bracket_},
              {"trials", std::move(trials)}, {"brackets", std::move(brackets)}};
}

void ASHAScheduler::restore(const json& state) {
  check_state_kind(state, name(), kAsha);
  std::string metric = saved_property(state, "metric", options_.metric, kAsha);
  std::string mode = saved_property(state, "mode", options_.mode, kAsha);
  check_mode(mode, "the saved mode");
  const auto num_brackets = static_cast<std::int64_t>(brackets_.size());
  auto bracket_index = [&](const json& v) {
    return v.is_number_integer() && v.get<std::int64_t>() >= 0 &&
           v.get<std::int64_t>() < num_brackets;
  };
  if (!state.contains("next_bracket") || !bracket_index(state["next_bracket"])) {
    bad_state(kAsha, fmt::format("'next_bracket' must be a bracket index below {}", num_brackets));
  }
  if (!state.contains("trials") || !state["trials"].is_object()) {
    bad_state(kAsha, "'trials' must be an object");
  }
  std::map<std::string, int> trial_bracket;
  for (const auto& [id, b] : state["trials"].items()) {
    if (!bracket_index(b)) {
      bad_state(kAsha, fmt::format("trial '{}' has bracket {}, not one below {}", id, b.dump(),
                                   num_brackets));
    }
    trial_bracket.emplace(id, b.get<int>());
  }
  const json& saved = state.value("brackets", json());
  if (!saved.is_array() || saved.size() != brackets_.size()) {
    bad_state(kAsha, fmt::format("'brackets' must be an array of {} brackets (saved with other "
                                 "ASHAOptions?)",
                                 brackets_.size()));
  }
  std::vector<std::vector<Rung>> brackets = brackets_;
  for (std::size_t b = 0; b < brackets.size(); ++b) {
    const json& rungs = saved[b];
    if (!rungs.is_array() || rungs.size() != brackets[b].size()) {
      bad_state(kAsha, fmt::format("bracket {} must have {} rungs (saved with other ASHAOptions?)",
                                   b, brackets[b].size()));
    }
    for (std::size_t r = 0; r < rungs.size(); ++r) {
      Rung& rung = brackets[b][r];
      const json& s = rungs[r];
      if (!s.is_object() || s.value("milestone", json()) != json(rung.milestone)) {
        bad_state(kAsha, fmt::format("bracket {} rung {} must be at milestone {} (saved with "
                                     "other ASHAOptions?)",
                                     b, r, rung.milestone));
      }
      if (!s.contains("recorded") || !s["recorded"].is_object()) {
        bad_state(kAsha, fmt::format("bracket {} rung {}: 'recorded' must be an object", b, r));
      }
      rung.recorded.clear();
      for (const auto& [id, v] : s["recorded"].items()) {
        std::optional<double> score = decode_number(v);
        if (!score) {
          bad_state(kAsha,
                    fmt::format("bracket {} rung {}: trial '{}' has value {}", b, r, id, v.dump()));
        }
        rung.recorded.emplace(id, *score);
      }
    }
  }
  options_.metric = std::move(metric);
  options_.mode = std::move(mode);
  next_bracket_ = state["next_bracket"].get<int>();
  trial_bracket_ = std::move(trial_bracket);
  brackets_ = std::move(brackets);
}

}  // namespace cairn::tune
