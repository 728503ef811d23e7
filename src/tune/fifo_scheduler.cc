// TrialStatus names and the FIFO scheduler (cairn/tune_schedulers.h):
// trials run in the order they were added; none is stopped early.
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

}  // namespace cairn::tune

namespace cairn::tune::internal {

void check_mode(const std::string& mode, std::string_view field) {
  if (!mode.empty() && mode != "max" && mode != "min") {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{} must be \"max\" or \"min\", got \"{}\"", field, mode));
  }
}

}  // namespace cairn::tune::internal
