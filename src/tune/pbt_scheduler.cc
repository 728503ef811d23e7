// Population Based Training (PopulationBasedTraining, cairn/tune_schedulers.h):
// where PBT decides to exploit (take a better trial's checkpoint and config)
// and explore (mutate the config taken). Pure logic: the Tuner carries the
// exploit out as a clone of the source's checkpoint.
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
#include "util/parse.h"

namespace cairn::tune {

using nlohmann::json;
using namespace scheduler_common;
using internal::check_mode;

// ---------------------------------------------------------------------------
// PopulationBasedTraining

namespace {

constexpr const char* kPbt = "PopulationBasedTraining";
constexpr const char* kMutations = "PBTOptions::hyperparam_mutations";

[[noreturn]] void bad_mutation(const std::string& path, std::string_view what) {
  invalid(fmt::format("{}: {}: {}", kMutations, path, what));
}

// A mutations object: every leaf a domain (not grid_search; a sample_from
// whose function is given) or a non-empty list of constants; nested objects
// mutate nested config keys.
void validate_mutations(const json& mutations, const json::json_pointer& pointer,
                        const SampleFunctions& functions) {
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
      if (m[kDomainTag] == "sample_from") {
        const auto it = functions.find(m["fn"].get<std::string>());
        if (it == functions.end() || !it->second) {
          bad_mutation(path, fmt::format("sample_from('{}'): its function was not given "
                                         "(PBTOptions::sample_functions)",
                                         m["fn"].get<std::string>()));
        }
      }
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
      validate_mutations(m, at, functions);
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
  if (!(o.burn_in_period >= 0) || !std::isfinite(o.burn_in_period)) {
    invalid(fmt::format("PBTOptions::burn_in_period must be a finite number >= 0, got {}",
                        o.burn_in_period));
  }
  for (const auto& [name, f] :
       {std::pair{"perturbation_factor_up", o.perturbation_factor_up},
        std::pair{"perturbation_factor_down", o.perturbation_factor_down}}) {
    if (!(f > 0) || !std::isfinite(f)) {
      invalid(fmt::format("PBTOptions::{} must be a finite number > 0, got {}", name, f));
    }
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
  validate_mutations(m, json::json_pointer(), o.sample_functions);
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
  if (st.done || t < options_.burn_in_period ||
      t - st.last_perturbation_time < options_.perturbation_interval) {
    return decision;
  }
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
  json out = config.is_object() ? config : json::object();
  auto resample_roll = [&] { return draw_unit(rng_) < options_.resample_probability; };
  // A sample_from leaf: its function, given the config explored so far.
  auto call_mutation = [&](const json& m, const std::string& path) -> json {
    const std::string name = m["fn"].get<std::string>();
    std::optional<json> value;
    try {
      value = options_.sample_functions.at(name)(out, rng_);
    } catch (const Error& e) {
      throw Error(e.code(),
                  fmt::format("{}: {}: sample_from('{}'): {}", kMutations, path, name, e.what()));
    }
    if (!value) bad_mutation(path, fmt::format("sample_from('{}') returned no value", name));
    return std::move(*value);
  };
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
  auto walk = [&](auto&& self, json& target, const json& mutations,
                  const json::json_pointer& pointer) -> void {
    for (const auto& [key, m] : mutations.items()) {
      auto it = target.find(key);
      const json* current = it == target.end() ? nullptr : &*it;
      if (internal::is_domain(m)) {
        if (m[kDomainTag] == "choice") {
          target[key] = leaf_list(current, m["values"]);
        } else if (current == nullptr || !current->is_number() || resample_roll()) {
          target[key] = m[kDomainTag] == "sample_from" ? call_mutation(m, path_of(pointer / key))
                                                       : internal::sample_domain(m, rng_);
        } else {
          target[key] = scale(*current, draw_below(rng_, 2) == 0 ? options_.perturbation_factor_down
                                                                 : options_.perturbation_factor_up);
        }
      } else if (m.is_array()) {
        target[key] = leaf_list(current, m);
      } else {
        json& sub = target[key];
        if (!sub.is_object()) sub = json::object();
        self(self, sub, m, pointer / key);
      }
    }
  };
  walk(walk, out, options_.hyperparam_mutations, json::json_pointer());
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
  // The options too, so that a restore given no scheduler can rebuild it
  // (not the functions of sample_from mutations: code).
  const json options = {{"time_attr", options_.time_attr},
                        {"perturbation_interval", options_.perturbation_interval},
                        {"hyperparam_mutations", options_.hyperparam_mutations},
                        {"quantile_fraction", options_.quantile_fraction},
                        {"resample_probability", options_.resample_probability},
                        {"burn_in_period", options_.burn_in_period},
                        {"perturbation_factor_up", options_.perturbation_factor_up},
                        {"perturbation_factor_down", options_.perturbation_factor_down},
                        {"seed", std::to_string(options_.seed)}};
  return json{{"scheduler", name()},
              {"version", kStateVersion},
              {"options", options},
              {"metric", options_.metric},
              {"mode", options_.mode},
              {"rng", rng.str()},
              {"num_perturbations", num_perturbations_},
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
  // The generator's state is the saved one, so its seed is too (saved with
  // the options by this version; an older state has none).
  std::optional<std::uint64_t> seed;
  const json options = state.value("options", json::object());
  if (options.is_object() && options.contains("seed")) {
    const json& text = options["seed"];
    seed = text.is_string() ? parse_decimal(text.get<std::string>()) : std::nullopt;
    if (!seed) {
      bad_state(kPbt,
                fmt::format("'options.seed' is not a 64-bit unsigned decimal: {}", text.dump()));
    }
  }
  options_.metric = std::move(metric);
  options_.mode = std::move(mode);
  if (seed) options_.seed = *seed;
  rng_ = rng;
  num_perturbations_ = state["num_perturbations"].get<std::uint64_t>();
  trials_ = std::move(trials);
}

}  // namespace cairn::tune
