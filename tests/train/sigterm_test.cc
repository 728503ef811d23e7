// SigtermNotice (train/control/sigterm.h): which SIGTERMs a notice sees.
#include "train/control/sigterm.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

namespace cairn::train_internal {
namespace {

constexpr int kKilledBy = 1000;

// Runs `body` in a forked child (so that nothing it does changes this
// process's SIGTERM disposition) and returns its exit status, what `body`
// returned, or kKilledBy + the signal that ended it.
template <typename Body>
int in_child(Body body) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : kKilledBy + WTERMSIG(status);
}

TEST(SigtermNotice, TurnsSigtermIntoAFlagAndGivesTheDispositionBackAtItsEnd) {
  EXPECT_EQ(in_child([] {
              {
                SigtermNotice notice;
                if (notice.received()) return 1;
                ::raise(SIGTERM);
                if (!notice.received()) return 2;
              }
              ::raise(SIGTERM);  // the default again: ends the process
              return 3;
            }),
            kKilledBy + SIGTERM);
}

TEST(SigtermNotice, AnOutermostNoticeStartsClearAfterAnEarlierOneReceivedSigterm) {
  EXPECT_EQ(in_child([] {
              {
                SigtermNotice first;
                ::raise(SIGTERM);
              }
              SigtermNotice second;
              return second.received() ? 1 : 0;
            }),
            0);
}

// A Tuner's runner is forked while the Tuner's notice lives and builds its
// Trainer's notice a moment later: a SIGTERM in between is the Trainer's.
TEST(SigtermNotice, AnInnerNoticeKeepsASigtermThatArrivedBeforeIt) {
  EXPECT_EQ(in_child([] {
              SigtermNotice outer;
              ::raise(SIGTERM);
              SigtermNotice inner;
              if (!inner.received()) return 1;
              return outer.received() ? 0 : 2;
            }),
            0);
}

TEST(SigtermNotice, AChildForkedAfterItsParentGotSigtermHasNotReceivedIt) {
  EXPECT_EQ(in_child([] {
              SigtermNotice parents;
              ::raise(SIGTERM);
              if (!parents.received()) return 1;
              return in_child([] {
                SigtermNotice childs;  // nested: the parent's notice was copied
                if (childs.received()) return 1;
                ::raise(SIGTERM);
                return childs.received() ? 0 : 2;
              });
            }),
            0);
}

}  // namespace
}  // namespace cairn::train_internal
