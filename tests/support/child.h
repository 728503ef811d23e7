// Test support: a child program whose standard output is a pipe the test
// reads (the crash workers write one byte when ready and one per commit).
#pragma once

#include <poll.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace cairn::testing {

// Forks and execs argv (argv[0] a path), its stdout the write end of a pipe
// whose read end is returned in `out_fd`. Returns the pid, or -1.
inline pid_t spawn_with_stdout_pipe(const std::vector<std::string>& argv, int& out_fd) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  out_fd = fds[0];
  return pid;
}

// Reads one byte from `fd`, waiting at most `timeout_ms`; false if none came.
inline bool wait_byte(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  char c;
  return poll(&p, 1, timeout_ms) == 1 && read(fd, &c, 1) == 1;
}

}  // namespace cairn::testing
