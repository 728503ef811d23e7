// A run's preemption (docs/train.md, "Preemption"): the first notice (the
// driver's SIGTERM, a rank's, or a Tuner's request for a checkpoint before a
// pause or an end), the grace time it starts, and the emergency checkpoint
// that ends the attempt. Pure bookkeeping: the driver passes the clock and
// the rounds it releases.
//
// Thread-safety: none; the driver's thread only.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace cairn::train_internal {

class Preemption {
 public:
  // `grace_s`: FailureConfig::preemption_grace_s.
  explicit Preemption(double grace_s) : grace_s_(grace_s) {}

  // Notes a notice; only the first counts. `why` is logged; `source` names
  // what asked, for Result::error.
  void note(const std::string& why, double now, std::string_view source = "a SIGTERM notice");
  bool requested() const { return requested_; }

  // A release of round `round` (an attempt's report() call); `committed`:
  // it carried a committed checkpoint. The first release after the notice
  // tells every rank; a checkpoint committed in a later round is the
  // emergency checkpoint.
  void on_release(int round, bool committed);
  // Marks `round`'s release as the one carrying the notice (the Tuner's
  // request, noted while that round is released), unless one already did.
  void carried_by(int round) {
    if (notice_round_ == 0) notice_round_ = round;
  }
  bool emergency_committed() const { return emergency_committed_; }

  // Whether the attempt should stop now: the emergency checkpoint is
  // committed, or the grace time has passed since the notice (logged).
  bool ends_attempt(double now) const;

  // The caller's end rather than a pause (RoundDirective::ends_run).
  void set_ends_run() { ends_run_ = true; }
  // The run ends here as its caller asked, with its final checkpoint.
  bool ended_as_asked() const { return ends_run_ && emergency_committed_; }

  // Result::error of a run that ends preempted. `finished`: train_fn
  // returned; `failure`: the group failed meanwhile; `resume`: where a
  // restore resumes, or nullopt when nothing was committed.
  std::string error(bool finished, const std::optional<std::string>& failure,
                    const std::optional<std::string>& resume) const;

 private:
  double grace_s_;
  bool requested_ = false;
  std::string source_;
  double deadline_ = 0.0;
  int notice_round_ = 0;  // the round whose release first carried the notice
  bool emergency_committed_ = false;
  bool ends_run_ = false;
};

}  // namespace cairn::train_internal
