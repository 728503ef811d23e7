// Processes a worker starts (its children and their children) never outlive
// it: when the group stops, when the worker ends, and when the driver is
// killed with SIGKILL. Real processes, real kill -9, bounded waits.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cairn/train.h"
#include "support/temp_dir.h"
#include "train/train_support.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::expect_no_children;
using testing::slurp;
using testing::TempDir;
using testing::wait_gone;
using testing::write_file;

RunConfig run_in(const TempDir& dir) {
  RunConfig r;
  r.name = "exp";
  r.storage_path = dir.str();
  return r;
}

// Starts `sleep 1000` in the background through a shell, as a user's code
// might, and writes its pid to `dir`/grandchild-<rank>.
void start_grandchild(const fs::path& dir) {
  const int rank = train::get_context().world_rank;
  const std::string cmd = fmt::format("sleep 1000 & echo $! > '{}.tmp' && mv '{}.tmp' '{}'",
                                      (dir / fmt::format("grandchild-{}", rank)).string(),
                                      (dir / fmt::format("grandchild-{}", rank)).string(),
                                      (dir / fmt::format("grandchild-{}", rank)).string());
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("could not start the grandchild");
}

pid_t pid_in(const fs::path& p) {
  const std::string s = slurp(p);
  return s.empty() ? -1 : static_cast<pid_t>(std::stol(s));
}

// Waits (bounded) for a file another process writes.
bool wait_file(const fs::path& p, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (fs::exists(p)) return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

// Kills what a failed test would leave running.
void kill_left(pid_t pid) {
  if (pid > 0) ::kill(pid, SIGKILL);  // ignore-error: cleanup after a failed check
}

TEST(TrainProcessTree, GrandchildrenDieWhenTheGroupIsStoppedAfterAFailure) {
  TempDir dir;
  const fs::path out = dir / "out";
  fs::create_directories(out);
  auto fn = [&](const nlohmann::json&) {
    start_grandchild(out);
    train::report({});  // both grandchildren exist past this point
    if (train::get_context().world_rank == 1) throw std::runtime_error("fail");
    train::report({});  // rank 0 waits here until the group is stopped
  };
  Result r = Trainer(fn, {}, ScalingConfig{.num_workers = 2}, run_in(dir)).fit();
  ASSERT_TRUE(r.error);
  for (int rank = 0; rank < 2; ++rank) {
    const pid_t g = pid_in(out / fmt::format("grandchild-{}", rank));
    ASSERT_GT(g, 0) << rank;
    EXPECT_TRUE(wait_gone(g, 5s)) << "rank " << rank << "'s grandchild " << g << " survived";
    kill_left(g);
  }
  expect_no_children();
}

TEST(TrainProcessTree, GrandchildOfAWorkerThatFinishedDiesWithIt) {
  TempDir dir;
  const fs::path out = dir / "out";
  fs::create_directories(out);
  auto fn = [&](const nlohmann::json&) {
    start_grandchild(out);
    train::report({{"done", true}});
  };
  Result r = Trainer(fn, {}, ScalingConfig{.num_workers = 1}, run_in(dir)).fit();
  ASSERT_FALSE(r.error) << *r.error;
  const pid_t g = pid_in(out / "grandchild-0");
  ASSERT_GT(g, 0);
  EXPECT_TRUE(wait_gone(g, 5s)) << "grandchild " << g << " survived its finished worker";
  kill_left(g);
  expect_no_children();
}

TEST(TrainProcessTree, WorkersAndGrandchildrenDieWhenTheDriverIsSigkilled) {
  TempDir dir;
  const fs::path out = dir / "out";
  fs::create_directories(out);
  const pid_t driver = ::fork();
  ASSERT_GE(driver, 0);
  if (driver == 0) {
    auto fn = [&](const nlohmann::json&) {
      start_grandchild(out);
      // Written whole, then renamed: the test reads it as soon as it exists.
      const fs::path mine = out / fmt::format("worker-{}", train::get_context().world_rank);
      write_file(fs::path(mine.string() + ".tmp"), std::to_string(::getpid()));
      fs::rename(mine.string() + ".tmp", mine);
      for (int i = 0; i < 2000; ++i) {  // about 100 s; the driver is killed long before
        std::this_thread::sleep_for(50ms);
        train::report({{"i", i}});
      }
    };
    try {
      Trainer(fn, {}, ScalingConfig{.num_workers = 2}, run_in(dir)).fit();
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  std::vector<pid_t> pids;
  for (const char* name : {"worker-0", "worker-1", "grandchild-0", "grandchild-1"}) {
    EXPECT_TRUE(wait_file(out / name, 20s)) << name;
    pids.push_back(pid_in(out / name));
  }
  ASSERT_EQ(::kill(driver, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(driver, &status, 0), driver);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the driver ended before it was killed";
  for (pid_t p : pids) {
    ASSERT_GT(p, 0);
    EXPECT_TRUE(wait_gone(p, 5s)) << "process " << p << " outlived its SIGKILLed driver";
    kill_left(p);
  }
  expect_no_children();
}

}  // namespace
}  // namespace cairn
