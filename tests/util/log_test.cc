// The log across fork(): a child forked while another thread of the parent
// is writing a message can log. The Trainer forks its workers while the
// driver's background threads (the memory tier's persister, the deleter, an
// S3 lease's heartbeat) may be logging; an inherited held lock would hang
// the worker at its first message.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "util/log.h"

namespace cairn::testing {
namespace {

using namespace std::chrono_literals;

// stderr sent to /dev/null for the scope: the test writes many messages.
class QuietStderr {
 public:
  QuietStderr() : saved_(::dup(2)) {
    const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    ::dup2(null, 2);
    ::close(null);
  }
  ~QuietStderr() {
    ::dup2(saved_, 2);
    ::close(saved_);
  }

 private:
  int saved_;
};

// Waits up to `limit` for `pid`; kills it and returns false if it is still
// running then.
bool exits_within(pid_t pid, std::chrono::milliseconds limit, int* status) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (::waitpid(pid, status, WNOHANG) == pid) return true;
    std::this_thread::sleep_for(1ms);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, status, 0);
  return false;
}

TEST(Log, AChildForkedWhileAnotherThreadLogsCanLog) {
  QuietStderr quiet;
  std::atomic<bool> stop{false};
  std::atomic<long> written{0};
  std::thread chatter([&] {
    while (!stop.load()) {
      log::info("a message from a background thread of the parent");
      written.fetch_add(1);
    }
  });
  while (written.load() == 0) std::this_thread::yield();
  int hung = 0;
  int failed = 0;
  for (int i = 0; i < 200; ++i) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      log::warn("the child's first message");
      log::info("and its second");
      ::_exit(0);
    }
    int status = 0;
    // A child that logs two lines needs milliseconds; one that hangs on an
    // inherited lock never ends.
    if (!exits_within(pid, 20s, &status)) {
      ++hung;
      break;
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failed;
    }
  }
  stop = true;
  chatter.join();
  EXPECT_EQ(hung, 0) << "children hung at their first message";
  EXPECT_EQ(failed, 0);
}

}  // namespace
}  // namespace cairn::testing
