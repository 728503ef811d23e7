// Locks a forked child can reach are never inherited locked: a fork while
// another thread holds one waits for it, and the child finds it free.
//
// Each test forks while another thread holds a lock for half a second. With
// a plain mutex the child would start with it held and hang (the test kills
// it after 20 s and fails); a ForkSafeMutex makes the fork wait for the
// holder instead. Only a machine too loaded to start the fork within that
// half second would let a plain mutex pass; the fork-safe one never fails.
#include "util/fork_safe.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "storage/s3/lease.h"

namespace cairn {
namespace {

constexpr auto kHold = std::chrono::milliseconds(500);

// Waits (at most 20 s) for `pid` to exit; kills it if it does not: a child
// that hangs on an inherited lock fails the test instead of hanging it.
int wait_bounded(pid_t pid) {
  for (int i = 0; i < 2000; ++i) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return -1;
}

TEST(ForkSafeMutex, AForkWhileAnotherThreadHoldsItLeavesTheChildAFreeLock) {
  static ForkSafeMutex lock(60);
  std::atomic<bool> holding{false};
  std::thread holder([&] {
    std::lock_guard<ForkSafeMutex> g(lock);
    holding = true;
    std::this_thread::sleep_for(kHold);
  });
  while (!holding.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(lock.try_lock() ? 0 : 7);
  holder.join();
  ASSERT_GT(pid, 0);
  const int status = wait_bounded(pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

// The S3 lease clock's lock, held by a thread inside lease_now() (as a
// lease's heartbeat holds it) when a Trainer forks a worker: the worker's
// own lease_now() must not hang.
TEST(ForkSafeMutex, AWorkerForkedDuringAHeartbeatsClockReadCanReadTheClock) {
  std::atomic<bool> in_clock{false};
  s3::set_lease_clock_for_testing([&] {
    if (!in_clock.exchange(true)) std::this_thread::sleep_for(kHold);
    return std::chrono::steady_clock::time_point(std::chrono::seconds(1));
  });
  std::thread heartbeat([] { (void)s3::lease_now(); });
  while (!in_clock.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // lease_now() holds the clock's lock now, for half a second.
  const pid_t pid = ::fork();
  if (pid == 0) {
    (void)s3::lease_now();
    ::_exit(0);
  }
  heartbeat.join();
  s3::set_lease_clock_for_testing(nullptr);
  ASSERT_GT(pid, 0);
  const int status = wait_bounded(pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the child hung on the lease clock's lock (status " << status << ")";
}

}  // namespace
}  // namespace cairn
