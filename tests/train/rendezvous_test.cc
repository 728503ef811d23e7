// The rendezvous the driver gives each attempt (TrainContext::master_addr,
// master_port): a reserved port a SO_REUSEADDR listener can still take, a
// new one per attempt, and torchrun's environment in every worker.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cairn/error.h"
#include "cairn/train.h"
#include "support/temp_dir.h"
#include "train/control/net.h"
#include "train/train_support.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;
using testing::slurp;
using testing::TempDir;
using testing::write_file;

// A loopback IPv4 TCP socket; with `reuse`, SO_REUSEADDR set.
int loopback_socket(bool reuse) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && reuse) {
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  }
  return fd;
}

int bind_loopback(int fd, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  return ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 ? 0 : errno;
}

TEST(Rendezvous, ReservedPortRefusesOthersButNotAReuseAddressListener) {
  train_internal::PortReservation reserved("127.0.0.1");
  ASSERT_GT(reserved.port(), 0);
  // Nobody else gets it from an ordinary bind...
  const int plain = loopback_socket(false);
  EXPECT_EQ(bind_loopback(plain, reserved.port()), EADDRINUSE);
  ::close(plain);
  // ...but a listener that sets SO_REUSEADDR, as c10d's TCPStore does, binds,
  // listens and accepts on it while the reservation is held.
  const int listener = loopback_socket(true);
  ASSERT_EQ(bind_loopback(listener, reserved.port()), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  const int client = loopback_socket(false);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(reserved.port()));
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  EXPECT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ::close(client);
  ::close(listener);
  EXPECT_THROW(train_internal::PortReservation("not an address"), Error);
}

void record_and_fail_once(const nlohmann::json& config) {
  const TrainContext& c = train::get_context();
  const nlohmann::json seen = testing::rendezvous_seen(c);
  const fs::path out = config.at("out").get<std::string>();
  write_file(out / fmt::format("ctx-{}-{}.json", c.world_rank, c.attempt), seen.dump());
  train::report({{"attempt", c.attempt}});
  if (c.attempt == 0 && c.world_rank == 1) throw std::runtime_error("intentional: restart");
}

TEST(Rendezvous, EveryAttemptGetsANewPortAndWorkersExportTorchrunVariables) {
  TempDir dir;
  const fs::path out = dir / "out";
  fs::create_directories(out);
  RunConfig run;
  run.name = "exp";
  run.storage_path = dir.str();
  run.failure_config.max_failures = 1;
  Trainer trainer(record_and_fail_once, {{"out", out.string()}},
                  ScalingConfig{.num_workers = 3, .launcher = Launcher::kLocal}, run);
  const Result result = trainer.fit();
  ASSERT_FALSE(result.error) << *result.error;
  int ports[2] = {0, 0};
  for (int attempt = 0; attempt < 2; ++attempt) {
    for (int rank = 0; rank < 3; ++rank) {
      const auto seen =
          nlohmann::json::parse(slurp(out / fmt::format("ctx-{}-{}.json", rank, attempt)));
      const int port = seen.at("master_port").get<int>();
      EXPECT_GT(port, 0);
      if (rank == 0) ports[attempt] = port;
      EXPECT_EQ(port, ports[attempt]) << "rank " << rank << " attempt " << attempt;
      EXPECT_EQ(seen.at("master_addr"), "127.0.0.1");
      EXPECT_EQ(seen.at("MASTER_ADDR"), "127.0.0.1");
      EXPECT_EQ(seen.at("MASTER_PORT"), std::to_string(port));
      EXPECT_EQ(seen.at("RANK"), std::to_string(rank));
      EXPECT_EQ(seen.at("WORLD_SIZE"), "3");
      EXPECT_EQ(seen.at("LOCAL_RANK"), std::to_string(rank));
      EXPECT_EQ(seen.at("LOCAL_WORLD_SIZE"), "3");
      EXPECT_EQ(seen.at("GROUP_RANK"), "0");
    }
  }
  EXPECT_NE(ports[0], ports[1]);
  // The reservation ends with its attempt: the port is free again.
  const int fd = loopback_socket(false);
  EXPECT_EQ(bind_loopback(fd, ports[1]), 0);
  ::close(fd);
}

}  // namespace
}  // namespace cairn
