// The local launcher with more workers than the usual limit on open files
// allows a driver by default (docs/scale.md): the driver raises its own soft
// limit as far as the group needs, gives the workers the limit it had, and
// refuses clearly, before starting anything, when the hard limit is too low.
// The driver of an MPI or torchrun-style launch raises it likewise for its
// connections to the agents, queues agents that connect at once, and waits
// for agents that keep connecting.
// Each limit case runs in a forked child, whose limits the test may lower
// for good.
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cairn/error.h"
#include "cairn/train.h"
#include "support/temp_dir.h"
#include "train/control/channel.h"
#include "train/control/net.h"
#include "train/mpi_agents.h"
#include "train/train_support.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using testing::write_file;

constexpr rlim_t kSoftLimit = 128;
constexpr int kWorkers = 60;  // a socket, a pipe and a pidfd each: more than 128

// Each rank checks it got the driver's original limit back and reports a
// file of its own, so the commit checks kWorkers files.
void rank_loop(const nlohmann::json& config) {
  rlimit mine{};
  ::getrlimit(RLIMIT_NOFILE, &mine);
  if (mine.rlim_cur != config.at("soft").get<rlim_t>()) {
    throw std::runtime_error(fmt::format("the worker's soft limit is {}, not the driver's {}",
                                         mine.rlim_cur, config.at("soft").get<rlim_t>()));
  }
  const int rank = train::get_context().world_rank;
  for (int round = 0; round < 2; ++round) {
    train::TemporaryDirectory tmp;
    write_file(fs::path(tmp.path()) / fmt::format("rank-{}.txt", rank), std::to_string(round));
    train::report({{"round", round}}, Checkpoint::from_directory(tmp.path()));
  }
}

// Runs `body` in a forked child after setting its limit on open files to
// soft/hard; returns the child's exit status (0: passed; otherwise it wrote
// why to stderr).
int in_child_with_limit(rlim_t soft, rlim_t hard, const std::function<int()>& body) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    rlimit lim{soft, hard};
    if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) ::_exit(90);
    int rc = 91;
    try {
      rc = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "unexpected exception: %s\n", e.what());
    }
    std::fflush(nullptr);
    ::_exit(rc);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(ManyWorkers, TheDriverRaisesItsOpenFileLimitAndTheWorkersGetTheOldOne) {
  rlimit now{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &now), 0);
  if (now.rlim_max != RLIM_INFINITY && now.rlim_max < 3 * kWorkers + 256) {
    GTEST_SKIP() << "the hard limit on open files (" << now.rlim_max << ") is too low";
  }
  TempDir dir;
  const int rc = in_child_with_limit(kSoftLimit, now.rlim_max, [&] {
    RunConfig run;
    run.name = "many";
    run.storage_path = dir.str();
    Result r =
        Trainer(rank_loop, {{"soft", kSoftLimit}}, ScalingConfig{.num_workers = kWorkers}, run)
            .fit();
    if (r.error) {
      std::fprintf(stderr, "the run failed: %s\n", r.error->c_str());
      return 1;
    }
    if (!r.checkpoint || r.checkpoint->manifest().files.size() != kWorkers) {
      std::fprintf(stderr, "the last checkpoint does not hold every rank's file\n");
      return 2;
    }
    return 0;
  });
  EXPECT_EQ(rc, 0);
}

TEST(ManyWorkers, AHardLimitTooLowIsAClearErrorBeforeAnyWorkerStarts) {
  TempDir dir;
  const int rc = in_child_with_limit(kSoftLimit, kSoftLimit, [&] {
    RunConfig run;
    run.name = "refused";
    run.storage_path = dir.str();
    try {
      Result r =
          Trainer(rank_loop, {{"soft", kSoftLimit}}, ScalingConfig{.num_workers = kWorkers}, run)
              .fit();
      std::fprintf(stderr, "fit() returned (%s) instead of refusing\n",
                   r.error ? r.error->c_str() : "no error");
      return 1;
    } catch (const Error& e) {
      const std::string msg = e.what();
      if (e.code() != ErrorCode::kFailedPrecondition ||
          msg.find(fmt::format("{} local workers", kWorkers)) == std::string::npos ||
          msg.find("ulimit -Hn") == std::string::npos) {
        std::fprintf(stderr, "unexpected error: %s\n", msg.c_str());
        return 2;
      }
    }
    // Nothing was committed, and the experiment can be run again.
    if (fs::exists(dir.path() / "refused" / "checkpoint_000000")) return 3;
    return 0;
  });
  EXPECT_EQ(rc, 0);
}

// The driver of a torchrun-style (or MPI) launch holds a connection to every
// other process; with 1,024 ranks under the usual soft limit of 1024 its
// accept() failed with "Too many open files". It now raises the limit for
// them as the local launcher does for its workers: here 99 agents connect to
// a driver whose soft limit (64) could not hold them.
TEST(ManyWorkers, TheDriverOfATorchrunStyleLaunchRaisesItsOpenFileLimitForItsAgents) {
  using namespace train_internal;
  constexpr int kRanks = 100;
  constexpr rlim_t kLow = 64;
  rlimit now{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &now), 0);
  if (now.rlim_max != RLIM_INFINITY && now.rlim_max < kRanks + 256) {
    GTEST_SKIP() << "the hard limit on open files (" << now.rlim_max << ") is too low";
  }
  const int rc = in_child_with_limit(kLow, now.rlim_max, [&] {
    TcpListener listener("127.0.0.1");
    std::fflush(nullptr);
    // The other processes of the launch, in one process with a limit of its own.
    const pid_t others = ::fork();
    if (others == 0) {
      const rlimit mine{now.rlim_max, now.rlim_max};
      ::setrlimit(RLIMIT_NOFILE, &mine);  // ignore-error: the driver then sees fewer hellos
      std::vector<Channel> held;
      for (int rank = 1; rank < kRanks; ++rank) {
        held.emplace_back(tcp_connect({"127.0.0.1"}, listener.port(), std::chrono::seconds(30)),
                          "the driver");
        held.back().send({{"t", "hello"}, {"rank", rank}, {"token", "t"}, {"host", "vm"}});
      }
      ::pause();  // until the driver's side kills it
      ::_exit(0);
    }
    MpiWorld w;
    w.size = kRanks;
    w.label = "rank";
    w.hosts.resize(kRanks);
    int result = 0;
    try {
      const std::vector<Agent> agents = accept_agents(listener, w, "t", "127.0.0.1", 0);
      for (const Agent& a : agents) {
        if (a.gone || !a.channel.open()) result = 3;
      }
      rlimit raised{};
      ::getrlimit(RLIMIT_NOFILE, &raised);
      if (raised.rlim_cur < kRanks) {
        std::fprintf(stderr, "the soft limit is still %ju\n",
                     static_cast<uintmax_t>(raised.rlim_cur));
        result = 4;
      }
    } catch (const Error& e) {
      std::fprintf(stderr, "accept_agents threw: %s\n", e.what());
      result = 2;
    }
    ::kill(others, SIGKILL);
    ::waitpid(others, nullptr, 0);
    return result;
  });
  EXPECT_EQ(rc, 0);
}

// The processes of an MPI launch learn the driver's address together from
// its broadcast and connect at once, before the driver accepts them: its
// listener queues them all (here 300) instead of the 128 it used to, past
// which TCP drops a connection and retries it after 1, 3, 7... s.
TEST(ManyWorkers, TheDriversListenerQueuesManyProcessesConnectingAtOnce) {
  using namespace train_internal;
  constexpr int kConnecting = 300;
  std::ifstream somaxconn("/proc/sys/net/core/somaxconn");
  int queue = 0;
  if (!(somaxconn >> queue) || queue < kConnecting) {
    GTEST_SKIP() << "net.core.somaxconn (" << queue << ") holds fewer than " << kConnecting;
  }
  TcpListener listener("127.0.0.1");
  std::vector<UniqueFd> held;
  for (int i = 0; i < kConnecting; ++i) {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_TRUE(fd);
    // A connection the queue cannot take is not refused but left waiting:
    // give up after 3 s (the queue takes one at once, or never here).
    const timeval limit{3, 0};
    ASSERT_EQ(::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit), 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(listener.port()));
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd.get(), reinterpret_cast<const sockaddr*>(&to), sizeof to), 0)
        << "connection " << i + 1 << " of " << kConnecting << ": " << std::strerror(errno);
    held.push_back(std::move(fd));
  }
}

// The driver's wait for the other processes bounds one that never comes,
// counted from the last that connected: a launch whose processes start
// over longer than the limit (1,024 of them took about a minute on two
// cores) is not cut off while they still arrive. Here 5 processes connect
// 0.5 s apart, 2 s in all, with a limit of 1.5 s; a rank that never
// connects is named after 1.5 s without one.
TEST(ManyWorkers, TheDriverWaitsForProcessesThatKeepConnectingPastItsLimit) {
  using namespace train_internal;
  constexpr int kRanks = 6;
  const auto run = [](int connecting) {
    TcpListener listener("127.0.0.1");
    std::fflush(nullptr);
    const pid_t others = ::fork();
    if (others == 0) {
      std::vector<Channel> held;
      for (int rank = 1; rank <= connecting; ++rank) {
        if (rank > 1) ::usleep(500'000);
        held.emplace_back(tcp_connect({"127.0.0.1"}, listener.port(), std::chrono::seconds(30)),
                          "the driver");
        held.back().send({{"t", "hello"}, {"rank", rank}, {"token", "t"}, {"host", "vm"}});
      }
      ::pause();  // until the driver's side kills it
      ::_exit(0);
    }
    MpiWorld w;
    w.size = kRanks;
    w.label = "rank";
    w.hosts.resize(kRanks);
    std::string outcome;
    try {
      const std::vector<Agent> agents =
          accept_agents(listener, w, "t", "127.0.0.1", 0, std::chrono::milliseconds(1500));
      outcome = fmt::format("{} agents", agents.size());
    } catch (const Error& e) {
      outcome = e.what();
    }
    ::kill(others, SIGKILL);
    ::waitpid(others, nullptr, 0);
    return outcome;
  };
  EXPECT_EQ(run(kRanks - 1), fmt::format("{} agents", kRanks - 1));
  const std::string missing = run(kRanks - 2);
  EXPECT_NE(missing.find("rank(s) 5 did not connect"), std::string::npos) << missing;
  EXPECT_NE(missing.find("5 of 6 processes did"), std::string::npos) << missing;
}

}  // namespace
}  // namespace cairn
