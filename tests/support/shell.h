// Starting a launch by hand from tests, as a job script's shell loop would:
// /bin/sh in a process group of its own, output to a log file, waited for
// with a bound after which the whole group is killed, so a hung launch
// never hangs the test. And free loopback ports for MASTER_PORT.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace cairn::testing {

struct ShellRun {
  int exit_status = -1;  // 128 + signal when killed
  std::string log;
};

// Whether 127.0.0.1:`port` can be bound now (0: any); the port bound, or 0.
inline int bind_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  int bound = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    socklen_t len = sizeof addr;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    bound = ntohs(addr.sin_port);
  }
  if (fd >= 0) ::close(fd);
  return bound;
}

// A loopback port free now (the kernel's pick).
inline int free_port() { return bind_loopback(0); }

// Starts `script` with /bin/sh in its own process group, output to `log`.
inline pid_t start_shell(const std::string& script, const std::filesystem::path& log) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    FILE* f = std::fopen(log.c_str(), "w");
    ::dup2(fileno(f), 1);
    ::dup2(fileno(f), 2);
    ::execl("/bin/sh", "sh", "-c", script.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  return pid;
}

// Waits for a shell start_shell() started; after `limit` from the call its
// process group is killed and the test fails.
inline ShellRun wait_shell(pid_t pid, const std::filesystem::path& log,
                           std::chrono::seconds limit = std::chrono::seconds(180)) {
  const auto start = std::chrono::steady_clock::now();
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) != pid) {
    if (std::chrono::steady_clock::now() - start > limit) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ADD_FAILURE() << "the launch did not finish within " << limit.count() << " s";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ShellRun r;
  r.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream in(log, std::ios::binary);
  r.log = std::string(std::istreambuf_iterator<char>(in), {});
  return r;
}

}  // namespace cairn::testing
