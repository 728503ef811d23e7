#include "tune/scheduler_common.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <utility>

#include <fmt/format.h>

#include "cairn/error.h"
#include "tune/domain.h"

namespace cairn::tune::scheduler_common {

using internal::check_mode;

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

}  // namespace cairn::tune::scheduler_common
