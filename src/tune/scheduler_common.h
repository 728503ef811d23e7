// What the trial schedulers (fifo_scheduler.cc, asha_scheduler.cc,
// pbt_scheduler.cc) share: argument and saved-state checks, reading a
// result's time and score, and JSON numbers that survive infinities. Pure
// functions; failures are kInvalidArgument naming the scheduler and field.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cairn/tune_schedulers.h"

namespace cairn::tune::scheduler_common {

using nlohmann::json;

inline constexpr int kStateVersion = 1;

// ASHA with a reduction factor barely above 1 would build a rung per tiny
// step; no real experiment needs more rungs than this.
inline constexpr std::size_t kMaxRungs = 1000;

[[noreturn]] void invalid(std::string message);

[[noreturn]] void bad_state(std::string_view who, std::string_view what);

// The scheduler's own metric and mode win; TuneConfig's fill the gaps. Both
// must be known afterwards. Nothing changes when it throws.
void adopt_search_properties(std::string& own_metric, std::string& own_mode,
                             const std::string& metric, const std::string& mode,
                             std::string_view who, std::string_view options);

// For a scheduler used without set_search_properties (tests, a Tuner that
// forgot): the same message as there.
void require_search_properties(const std::string& metric, const std::string& mode,
                               std::string_view who, std::string_view options);

// result[attr] as a finite number; the scheduler cannot place a result in
// time otherwise, which is the caller's mistake, not a trial's bad luck.
double time_of(const json& result, const std::string& attr, const std::string& trial_id,
               std::string_view who);

// The metric as "higher is better", or nothing when the result has no usable
// value for it (missing, not a number, NaN).
std::optional<double> score_of(const json& result, const std::string& metric,
                               const std::string& mode);

// JSON has no infinities (nlohmann writes them as null), but a diverged
// trial's loss may be one and must survive save/restore.
json encode_number(double v);

std::optional<double> decode_number(const json& v);

// Parsed JSON holds a non-negative integer as unsigned, one built in code as
// signed: both are accepted.
bool is_count(const json& v);

void check_state_kind(const json& state, std::string_view name, std::string_view who);

// The saved metric or mode, which must agree with one this scheduler was
// built with.
std::string saved_property(const json& state, const char* field, const std::string& own,
                           std::string_view who);

std::optional<std::string> first_with_status(const std::vector<TrialView>& candidates,
                                             TrialStatus status);

// "model/layers" for the pointer /model/layers (as search-space messages).
std::string path_of(const json::json_pointer& pointer);

}  // namespace cairn::tune::scheduler_common
