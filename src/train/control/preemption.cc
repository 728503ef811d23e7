#include "train/control/preemption.h"

#include <fmt/format.h>

#include "util/log.h"

namespace cairn::train_internal {

void Preemption::note(const std::string& why, double now, std::string_view source) {
  if (requested_) return;
  requested_ = true;
  source_ = source;
  deadline_ = now + grace_s_;
  // A tuner's pause is routine; a platform's notice is news.
  (source == "a SIGTERM notice" ? log::warn : log::info)(
      fmt::format("preemption: {}; the workers are told at their next report and the "
                  "group stops once a checkpoint they report after it is committed "
                  "(or in {} s)",
                  why, grace_s_));
}

void Preemption::on_release(int round, bool committed) {
  if (!requested_) return;
  if (notice_round_ == 0) {
    notice_round_ = round;
  } else if (committed && round > notice_round_) {
    emergency_committed_ = true;
  }
}

bool Preemption::ends_attempt(double now) const {
  if (!requested_) return false;
  if (emergency_committed_) return true;
  if (now >= deadline_) {
    log::warn(
        fmt::format("preemption: no checkpoint committed within {} s of the notice "
                    "(FailureConfig::preemption_grace_s); stopping the group",
                    grace_s_));
    return true;
  }
  return false;
}

std::string Preemption::error(bool finished, const std::optional<std::string>& failure,
                              const std::optional<std::string>& resume) const {
  const std::string how =
      emergency_committed_ ? "stopped the group after its emergency checkpoint"
      : finished           ? "stopped the group after train_fn returned"
      : failure ? fmt::format("came while the group failed, so it is not restarted ({})", *failure)
                : "stopped the group when FailureConfig::preemption_grace_s ran out";
  return fmt::format("preempted: {} {}; {}", source_, how,
                     resume ? *resume : std::string("no checkpoint was committed"));
}

}  // namespace cairn::train_internal
