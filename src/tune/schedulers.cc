// Trial schedulers: FIFO, asynchronous successive halving (ASHA) and
// Population Based Training (PBT). Pure logic over the views and results the
// Tuner passes in; the contract is include/cairn/tune_schedulers.h.
#include "cairn/tune_schedulers.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <utility>

#include <fmt/format.h>

#include "cairn/error.h"
#include "tune/domain.h"

namespace cairn::tune {

using nlohmann::json;

using internal::check_mode;

namespace {

constexpr int kStateVersion = 1;

// ASHA with a reduction factor barely above 1 would build a rung per tiny
// step; no real experiment needs more rungs than this.
constexpr std::size_t kMaxRungs = 1000;

[[noreturn]] void invalid(std::string message) {
  throw Error(ErrorCode::kInvalidArgument, std::move(message));
}

[[noreturn]] void bad_state(std::string_view who, std::string_view what) {
  invalid(fmt::format("{}: restoring state: {}", who, what));
}

// The scheduler's own metric and mode win; TuneConfig's fill the gaps. Both
// must be known afterwards. Nothing changes when it throws.
void adopt_search_properties(std::string& own_metric, std::string& own_mode,
                             const std::string& metric, const std::string& mode,
                             std::string_view who, std::string_view options) {
  std::string new_metric = own_metric.empty() ? metric : own_metric;
  std::string new_mode = own_mode;
  if (new_mode.empty()) {
    check_mode(mode, "TuneConfig::mode");
    new_mode = mode;
  }
  if (new_metric.empty()) {
    invalid(fmt::format("{} needs a metric: set {}::metric or TuneConfig::metric", who, options));
  }
  if (new_mode.empty()) {
    invalid(fmt::format("{} needs a mode (\"max\" or \"min\"): set {}::mode or TuneConfig::mode",
                        who, options));
  }
  own_metric = std::move(new_metric);
  own_mode = std::move(new_mode);
}

// For a scheduler used without set_search_properties (tests, a Tuner that
// forgot): the same message as there.
void require_search_properties(const std::string& metric, const std::string& mode,
                               std::string_view who, std::string_view options) {
  if (metric.empty() || mode.empty()) {
    std::string m = metric;
    std::string md = mode;
    adopt_search_properties(m, md, "", "", who, options);
  }
}

// result[attr] as a finite number; the scheduler cannot place a result in
// time otherwise, which is the caller's mistake, not a trial's bad luck.
double time_of(const json& result, const std::string& attr, const std::string& trial_id,
               std::string_view who) {
  const json* value = nullptr;
  if (result.is_object()) {
    auto it = result.find(attr);
    if (it != result.end()) value = &*it;
  }
  if (value == nullptr || !value->is_number() || !std::isfinite(value->get<double>())) {
    invalid(fmt::format("{}: trial '{}': result['{}'] must be a number, got {}", who, trial_id,
                        attr, value == nullptr ? std::string("nothing") : value->dump()));
  }
  return value->get<double>();
}

// The metric as "higher is better", or nothing when the result has no usable
// value for it (missing, not a number, NaN).
std::optional<double> score_of(const json& result, const std::string& metric,
                               const std::string& mode) {
  if (!result.is_object()) return std::nullopt;
  auto it = result.find(metric);
  if (it == result.end() || !it->is_number()) return std::nullopt;
  double v = it->get<double>();
  if (std::isnan(v)) return std::nullopt;
  return mode == "min" ? -v : v;
}

// JSON has no infinities (nlohmann writes them as null), but a diverged
// trial's loss may be one and must survive save/restore.
json encode_number(double v) {
  if (std::isfinite(v)) return v;
  return v > 0 ? "inf" : "-inf";
}

std::optional<double> decode_number(const json& v) {
  if (v.is_number()) {
    double d = v.get<double>();
    if (!std::isnan(d)) return d;
  } else if (v == "inf") {
    return std::numeric_limits<double>::infinity();
  } else if (v == "-inf") {
    return -std::numeric_limits<double>::infinity();
  }
  return std::nullopt;
}

// Parsed JSON holds a non-negative integer as unsigned, one built in code as
// signed: both are accepted.
bool is_count(const json& v) {
  return v.is_number_unsigned() || (v.is_number_integer() && v.get<std::int64_t>() >= 0);
}

void check_state_kind(const json& state, std::string_view name, std::string_view who) {
  if (!state.is_object()) bad_state(who, "not a JSON object");
  json kind = state.value("scheduler", json());
  if (kind != name) {
    bad_state(who, fmt::format("state of scheduler {}, not \"{}\"", kind.dump(), name));
  }
  json version = state.value("version", json());
  if (!is_count(version) || version.get<std::uint64_t>() < 1 ||
      version.get<std::uint64_t>() > static_cast<std::uint64_t>(kStateVersion)) {
    bad_state(who, fmt::format("unsupported version {} (this build reads version {})",
                               version.dump(), kStateVersion));
  }
}

// The saved metric or mode, which must agree with one this scheduler was
// built with.
std::string saved_property(const json& state, const char* field, const std::string& own,
                           std::string_view who) {
  if (!state.contains(field) || !state[field].is_string()) {
    bad_state(who, fmt::format("'{}' must be a string", field));
  }
  std::string saved = state[field].get<std::string>();
  // Saved before set_search_properties: nothing to agree with.
  if (saved.empty()) return own;
  if (!own.empty() && saved != own) {
    bad_state(who,
              fmt::format("saved with {} \"{}\", this scheduler has \"{}\"", field, saved, own));
  }
  return saved;
}

std::optional<std::string> first_with_status(const std::vector<TrialView>& candidates,
                                             TrialStatus status) {
  for (const auto& c : candidates) {
    if (c.status == status) return c.trial_id;
  }
  return std::nullopt;
}

// "model/layers" for the pointer /model/layers (as search-space messages).
std::string path_of(const json::json_pointer& pointer) {
  std::string s = pointer.to_string();
  return s.empty() ? s : s.substr(1);
}

}  // namespace

// ---------------------------------------------------------------------------
// TrialStatus

std::string_view to_string(TrialStatus status) {
  switch (status) {
    case TrialStatus::kPending:
      return "PENDING";
    case TrialStatus::kRunning:
      return "RUNNING";
    case TrialStatus::kPaused:
      return "PAUSED";
    case TrialStatus::kTerminated:
      return "TERMINATED";
    case TrialStatus::kError:
      return "ERROR";
  }
  return "UNKNOWN";
}

TrialStatus trial_status_from_string(std::string_view text) {
  for (TrialStatus s : {TrialStatus::kPending, TrialStatus::kRunning, TrialStatus::kPaused,
                        TrialStatus::kTerminated, TrialStatus::kError}) {
    if (to_string(s) == text) return s;
  }
  invalid(fmt::format(
      "unknown trial status \"{}\" (expected PENDING, RUNNING, PAUSED, TERMINATED or ERROR)",
      text));
}

// ---------------------------------------------------------------------------
// FIFOScheduler

std::optional<std::string> FIFOScheduler::choose_trial_to_run(
    const std::vector<TrialView>& candidates) {
  if (auto id = first_with_status(candidates, TrialStatus::kPending)) return id;
  return first_with_status(candidates, TrialStatus::kPaused);
}

json FIFOScheduler::save() const { return json{{"scheduler", name()}, {"version", kStateVersion}}; }

void FIFOScheduler::restore(const json& state) { check_state_kind(state, name(), "FIFOScheduler"); }

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
  // way get no value from this trial (as in Ray).
  for (Rung& rung : brackets_[static_cast<std::size_t>(found->second)]) {
    if (t < rung.milestone) continue;
    if (!rung.recorded.emplace(trial.trial_id, *score).second) break;  // judged here already
    if (static_cast<double>(rung.recorded.size()) < options_.reduction_factor) break;
    if (*score < rung_cutoff(rung.recorded, options_.reduction_factor)) {
      decision.action = SchedulerDecision::kStop;
    }
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
  return json{{"scheduler", name()},
              {"version", kStateVersion},
              {"metric", options_.metric},
              {"mode", options_.mode},
              {"next_bracket", next_bracket_},
              {"trials", std::move(trials)},
              {"brackets", std::move(brackets)}};
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

// ---------------------------------------------------------------------------
// PopulationBasedTraining

namespace {

constexpr const char* kPbt = "PopulationBasedTraining";
constexpr const char* kMutations = "PBTOptions::hyperparam_mutations";

[[noreturn]] void bad_mutation(const std::string& path, std::string_view what) {
  invalid(fmt::format("{}: {}: {}", kMutations, path, what));
}

// A mutations object: every leaf a domain (not grid_search) or a non-empty
// list of constants; nested objects mutate nested config keys.
void validate_mutations(const json& mutations, const json::json_pointer& pointer) {
  for (const auto& [key, m] : mutations.items()) {
    const json::json_pointer at = pointer / key;
    const std::string path = path_of(at);
    if (internal::is_domain(m)) {
      bool grid = false;
      try {
        grid = internal::validate_domain(m, path);
      } catch (const Error& e) {
        throw with_context(e, kMutations);
      }
      if (grid) bad_mutation(path, "grid_search cannot mutate a value; use choice or a list");
    } else if (m.is_array()) {
      if (m.empty()) bad_mutation(path, "a list of values must not be empty");
      for (std::size_t i = 0; i < m.size(); ++i) {
        if (internal::contains_domain(m[i])) {
          bad_mutation(path,
                       fmt::format("list value {} holds a domain; values must be constants", i));
        }
      }
    } else if (m.is_object()) {
      if (m.empty()) bad_mutation(path, "an object of nested mutations must not be empty");
      validate_mutations(m, at);
    } else {
      bad_mutation(path, fmt::format("must be a domain, a list of values or an object of nested "
                                     "mutations, not {}",
                                     m.dump()));
    }
  }
}

// `value` times `factor`; an integer stays an integer (rounded, and left as
// it is where the product would not fit in 64 bits).
json scale(const json& value, double factor) {
  double product = value.get<double>() * factor;
  if (value.is_number_float()) return product;
  double rounded = std::round(product);
  // 2^63 is exactly representable; anything at or beyond it does not fit.
  if (!(rounded >= -0x1.0p63 && rounded < 0x1.0p63)) return value;
  return static_cast<std::int64_t>(rounded);
}

}  // namespace

PopulationBasedTraining::PopulationBasedTraining(PBTOptions options)
    : options_(std::move(options)), rng_(options_.seed) {
  const PBTOptions& o = options_;
  if (o.time_attr.empty()) invalid("PBTOptions::time_attr must not be empty");
  check_mode(o.mode, "PBTOptions::mode");
  if (!(o.perturbation_interval > 0) || !std::isfinite(o.perturbation_interval)) {
    invalid(fmt::format("PBTOptions::perturbation_interval must be a finite number > 0, got {}",
                        o.perturbation_interval));
  }
  if (!(o.quantile_fraction > 0 && o.quantile_fraction <= 0.5)) {
    invalid(fmt::format("PBTOptions::quantile_fraction must be in (0, 0.5], got {}",
                        o.quantile_fraction));
  }
  if (!(o.resample_probability >= 0 && o.resample_probability <= 1)) {
    invalid(fmt::format("PBTOptions::resample_probability must be in [0, 1], got {}",
                        o.resample_probability));
  }
  const json& m = o.hyperparam_mutations;
  if (!m.is_object() || internal::is_domain(m) || m.empty()) {
    invalid(fmt::format("{} must be a non-empty JSON object of mutations, got {}", kMutations,
                        m.dump()));
  }
  validate_mutations(m, json::json_pointer());
}

void PopulationBasedTraining::set_search_properties(const std::string& metric,
                                                    const std::string& mode) {
  adopt_search_properties(options_.metric, options_.mode, metric, mode, kPbt, "PBTOptions");
}

void PopulationBasedTraining::on_trial_add(const TrialView& trial) {
  auto [it, added] = trials_.try_emplace(trial.trial_id);
  TrialState& st = it->second;
  // A trial added again (a restored Tuner re-adding its trials) keeps the
  // config the scheduler holds, which may be an exploit's new_config.
  if (added) st.config = trial.config;
  st.has_checkpoint = trial.has_checkpoint;
  if (trial.status == TrialStatus::kTerminated || trial.status == TrialStatus::kError) {
    st.done = true;
  }
}

SchedulerDecision PopulationBasedTraining::on_trial_result(const TrialView& trial,
                                                           const json& result) {
  require_search_properties(options_.metric, options_.mode, kPbt, "PBTOptions");
  double t = time_of(result, options_.time_attr, trial.trial_id, kPbt);
  auto found = trials_.find(trial.trial_id);
  if (found == trials_.end()) {
    invalid(fmt::format("{}: trial '{}' was never added (on_trial_add)", kPbt, trial.trial_id));
  }
  TrialState& st = found->second;
  st.has_checkpoint = trial.has_checkpoint;
  SchedulerDecision decision;
  if (st.done || t - st.last_perturbation_time < options_.perturbation_interval) return decision;
  std::optional<double> score = score_of(result, options_.metric, options_.mode);
  if (!score) return decision;  // no score: as if the result had not come (as in Ray)
  st.last_score = *score;
  st.last_perturbation_time = t;

  // Rank the live trials with a score, worst first; equal scores rank the
  // greater trial id lower, so the order never depends on arrival.
  std::vector<std::pair<double, const std::string*>> ranked;
  for (const auto& [id, s] : trials_) {
    if (s.last_score && !s.done) ranked.emplace_back(*s.last_score, &id);
  }
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
    if (a.first != b.first) return a.first < b.first;
    return *a.second > *b.second;
  });
  // Ray's quantile size: ceil(n * q), at most floor(n / 2); none for n <= 1.
  const std::size_t n = ranked.size();
  std::size_t k = 0;
  if (n > 1) {
    k = static_cast<std::size_t>(std::ceil(static_cast<double>(n) * options_.quantile_fraction));
    k = std::min(k, n / 2);
  }
  bool in_lower = false;
  for (std::size_t i = 0; i < k; ++i) in_lower = in_lower || *ranked[i].second == trial.trial_id;
  if (!in_lower) return decision;

  // Sources: the upper quantile's trials with a checkpoint, in id order.
  std::vector<const std::string*> sources;
  for (std::size_t i = n - k; i < n; ++i) {
    const std::string& id = *ranked[i].second;
    if (id != trial.trial_id && trials_.at(id).has_checkpoint) sources.push_back(&id);
  }
  if (sources.empty()) return decision;
  std::sort(sources.begin(), sources.end(),
            [](const std::string* a, const std::string* b) { return *a < *b; });
  const std::string& source_id =
      *sources[static_cast<std::size_t>(draw_below(rng_, sources.size()))];
  const TrialState& source = trials_.at(source_id);

  json new_config = explore(source.config);
  st.config = new_config;
  // The clone resumes at the source's checkpoint, so its clock restarts from
  // the source's (as Ray transfers last_perturbation_time).
  st.last_perturbation_time = source.last_perturbation_time;
  ++num_perturbations_;
  decision.clone_from = source_id;
  decision.new_config = std::move(new_config);
  return decision;
}

json PopulationBasedTraining::explore(const json& config) {
  // Draw order (it fixes the results for a seed): mutation keys in sorted
  // order, depth first. Per leaf whose current value can be perturbed: one
  // draw_unit for "resample?", then one draw_below(2) (0: x0.8 or the entry
  // below; 1: x1.2 or the entry above) or the resample's own draws. A leaf
  // whose value is missing, not a number or not in the list is resampled
  // without the first draw.
  auto resample_roll = [&] { return draw_unit(rng_) < options_.resample_probability; };
  auto pick = [&](const json& values) {
    return values[static_cast<std::size_t>(draw_below(rng_, values.size()))];
  };
  auto leaf_list = [&](const json* current, const json& values) -> json {
    std::optional<std::size_t> index;
    if (current != nullptr) {
      for (std::size_t i = 0; i < values.size() && !index; ++i) {
        if (values[i] == *current) index = i;
      }
    }
    if (!index || resample_roll()) return pick(values);
    if (draw_below(rng_, 2) == 0) return values[*index == 0 ? 0 : *index - 1];
    return values[std::min(*index + 1, values.size() - 1)];
  };
  auto walk = [&](auto&& self, json& target, const json& mutations) -> void {
    for (const auto& [key, m] : mutations.items()) {
      auto it = target.find(key);
      const json* current = it == target.end() ? nullptr : &*it;
      if (internal::is_domain(m)) {
        if (m[kDomainTag] == "choice") {
          target[key] = leaf_list(current, m["values"]);
        } else if (current == nullptr || !current->is_number() || resample_roll()) {
          target[key] = internal::sample_domain(m, rng_);
        } else {
          target[key] = scale(*current, draw_below(rng_, 2) == 0 ? 0.8 : 1.2);
        }
      } else if (m.is_array()) {
        target[key] = leaf_list(current, m);
      } else {
        json& sub = target[key];
        if (!sub.is_object()) sub = json::object();
        self(self, sub, m);
      }
    }
  };
  json out = config.is_object() ? config : json::object();
  walk(walk, out, options_.hyperparam_mutations);
  return out;
}

void PopulationBasedTraining::on_trial_complete(const TrialView& trial, const json&) {
  // A finished trial leaves the ranking (as in Ray): it reports no more, so
  // a clone of it could not be compared again.
  auto it = trials_.find(trial.trial_id);
  if (it == trials_.end()) return;
  it->second.done = true;
  it->second.has_checkpoint = trial.has_checkpoint;
}

void PopulationBasedTraining::on_trial_error(const TrialView& trial) {
  auto it = trials_.find(trial.trial_id);
  if (it != trials_.end()) it->second.done = true;
}

std::optional<std::string> PopulationBasedTraining::choose_trial_to_run(
    const std::vector<TrialView>& candidates) {
  // Paused trials first: they are clones waiting to resume, and PBT's
  // population should advance together.
  if (auto id = first_with_status(candidates, TrialStatus::kPaused)) return id;
  return first_with_status(candidates, TrialStatus::kPending);
}

json PopulationBasedTraining::save() const {
  std::ostringstream rng;
  rng << rng_;
  json trials = json::object();
  for (const auto& [id, st] : trials_) {
    trials[id] = {{"last_perturbation_time", st.last_perturbation_time},
                  {"last_score", st.last_score ? encode_number(*st.last_score) : json()},
                  {"config", st.config},
                  {"has_checkpoint", st.has_checkpoint},
                  {"done", st.done}};
  }
  return json{{"scheduler", name()},        {"version", kStateVersion},
              {"metric", options_.metric},  {"mode", options_.mode},
              {"rng", rng.str()},           {"num_perturbations", num_perturbations_},
              {"trials", std::move(trials)}};
}

void PopulationBasedTraining::restore(const json& state) {
  check_state_kind(state, name(), kPbt);
  std::string metric = saved_property(state, "metric", options_.metric, kPbt);
  std::string mode = saved_property(state, "mode", options_.mode, kPbt);
  check_mode(mode, "the saved mode");
  if (!state.contains("rng") || !state["rng"].is_string())
    bad_state(kPbt, "'rng' must be a string");
  Rng rng;
  {
    std::istringstream in(state["rng"].get<std::string>());
    in >> rng;
    if (in.fail() || !(in >> std::ws).eof()) {
      bad_state(kPbt, "'rng' is not a std::mt19937_64 state");
    }
  }
  if (!state.contains("num_perturbations") || !is_count(state["num_perturbations"])) {
    bad_state(kPbt, "'num_perturbations' must be a non-negative integer");
  }
  if (!state.contains("trials") || !state["trials"].is_object()) {
    bad_state(kPbt, "'trials' must be an object");
  }
  std::map<std::string, TrialState> trials;
  for (const auto& [id, s] : state["trials"].items()) {
    auto field = [&](const char* name) -> const json& {
      if (!s.is_object() || !s.contains(name)) {
        bad_state(kPbt, fmt::format("trial '{}' lacks '{}'", id, name));
      }
      return s[name];
    };
    TrialState st;
    const json& time = field("last_perturbation_time");
    if (!time.is_number()) {
      bad_state(kPbt, fmt::format("trial '{}': 'last_perturbation_time' must be a number", id));
    }
    st.last_perturbation_time = time.get<double>();
    const json& score = field("last_score");
    if (!score.is_null()) {
      st.last_score = decode_number(score);
      if (!st.last_score) {
        bad_state(kPbt, fmt::format("trial '{}': 'last_score' is {}", id, score.dump()));
      }
    }
    st.config = field("config");
    const json& checkpoint = field("has_checkpoint");
    const json& done = field("done");
    if (!checkpoint.is_boolean() || !done.is_boolean()) {
      bad_state(kPbt, fmt::format("trial '{}': 'has_checkpoint' and 'done' must be booleans", id));
    }
    st.has_checkpoint = checkpoint.get<bool>();
    st.done = done.get<bool>();
    trials.emplace(id, std::move(st));
  }
  options_.metric = std::move(metric);
  options_.mode = std::move(mode);
  rng_ = rng;
  num_perturbations_ = state["num_perturbations"].get<std::uint64_t>();
  trials_ = std::move(trials);
}

}  // namespace cairn::tune

namespace cairn::tune::internal {

void check_mode(const std::string& mode, std::string_view field) {
  if (!mode.empty() && mode != "max" && mode != "min") {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{} must be \"max\" or \"min\", got \"{}\"", field, mode));
  }
}

}  // namespace cairn::tune::internal
