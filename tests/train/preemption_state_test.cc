// A run's preemption bookkeeping, without processes: the first notice
// counts, the emergency checkpoint is one committed after the release that
// carried the notice, the grace time ends the attempt, and a caller's end
// (a Tuner's checkpoint_at_end) is told apart from a pause.
#include "train/control/preemption.h"

#include <gtest/gtest.h>

namespace cairn::train_internal {
namespace {

TEST(PreemptionState, NothingEndsTheAttemptBeforeANotice) {
  Preemption p(10.0);
  p.on_release(1, true);
  EXPECT_FALSE(p.requested());
  EXPECT_FALSE(p.ends_attempt(1e9));
  EXPECT_FALSE(p.emergency_committed());
}

TEST(PreemptionState, OnlyACheckpointCommittedAfterTheNoticesReleaseIsTheEmergencyOne) {
  Preemption p(10.0);
  p.note("the driver received SIGTERM", 100.0);
  p.on_release(4, true);  // carries the notice: the ranks hear it now
  EXPECT_FALSE(p.emergency_committed());
  p.on_release(5, false);
  EXPECT_FALSE(p.ends_attempt(105.0));
  p.on_release(6, true);
  EXPECT_TRUE(p.emergency_committed());
  EXPECT_TRUE(p.ends_attempt(105.0));
}

TEST(PreemptionState, TheFirstNoticeSetsTheGraceTimeAndLaterOnesChangeNothing) {
  Preemption p(10.0);
  p.note("rank 1 received SIGTERM", 100.0);
  p.note("the driver received SIGTERM", 105.0, "another source");
  EXPECT_FALSE(p.ends_attempt(109.9));
  EXPECT_TRUE(p.ends_attempt(110.0));
  EXPECT_NE(p.error(false, std::nullopt, std::nullopt).find("a SIGTERM notice"), std::string::npos);
}

TEST(PreemptionState, ARequestCarriedByTheRoundBeingReleasedCountsThatRound) {
  Preemption p(10.0);
  p.note("the tuner asked for a final checkpoint", 0.0, "the tuner's request");
  p.carried_by(3);
  p.on_release(3, true);  // the round that asked: its checkpoint came before
  EXPECT_FALSE(p.emergency_committed());
  p.on_release(4, true);
  EXPECT_TRUE(p.emergency_committed());
}

TEST(PreemptionState, ACallersEndIsAskedOnlyOnceItsCheckpointIsCommitted) {
  Preemption p(10.0);
  p.note("the tuner asked for a final checkpoint", 0.0, "the tuner's request");
  p.set_ends_run();
  p.carried_by(2);
  EXPECT_FALSE(p.ended_as_asked());
  p.on_release(3, true);
  EXPECT_TRUE(p.ended_as_asked());

  Preemption pause(10.0);  // a pause: the same checkpoint, but the run is preempted
  pause.note("the tuner asked for a final checkpoint", 0.0, "the tuner's request");
  pause.carried_by(2);
  pause.on_release(3, true);
  EXPECT_FALSE(pause.ended_as_asked());
}

TEST(PreemptionState, TheErrorSaysHowTheGroupStoppedAndWhereARestoreResumes) {
  Preemption p(10.0);
  p.note("x", 0.0, "a SIGTERM notice");
  EXPECT_EQ(p.error(false, std::nullopt, std::nullopt),
            "preempted: a SIGTERM notice stopped the group when "
            "FailureConfig::preemption_grace_s ran out; no checkpoint was committed");
  EXPECT_EQ(p.error(true, std::nullopt, std::string("resume here")),
            "preempted: a SIGTERM notice stopped the group after train_fn returned; resume here");
  EXPECT_NE(p.error(false, std::string("rank 1 died"), std::nullopt).find("(rank 1 died)"),
            std::string::npos);
  p.on_release(1, false);
  p.on_release(2, true);
  EXPECT_NE(p.error(false, std::nullopt, std::nullopt).find("after its emergency checkpoint"),
            std::string::npos);
}

}  // namespace
}  // namespace cairn::train_internal
