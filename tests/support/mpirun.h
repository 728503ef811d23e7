// Starting real `mpirun` jobs from tests: in a process group of their own,
// output to a log file, waited for with a bound after which the whole group
// is killed, so a hung job never hangs the test.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace cairn::testing {

struct MpirunStarted {
  pid_t pid = -1;
  std::chrono::steady_clock::time_point start;
  std::filesystem::path log;
};

struct MpirunResult {
  int exit_status = -1;  // 128 + signal when killed
  double seconds = 0;
  std::string log;  // mpirun's stdout and stderr
};

// Starts `mpirun -np <np> [-x env...] command...` as a local job (every rank
// on this machine, no ptrace-based single copy, which containers often
// forbid; as root when run as root), output to `log`.
inline MpirunStarted start_mpirun(int np, const std::vector<std::string>& env,
                                  const std::vector<std::string>& command,
                                  const std::filesystem::path& log) {
  std::vector<std::string> args = {"mpirun",
                                   "-np",
                                   std::to_string(np),
                                   "--oversubscribe",
                                   "--bind-to",
                                   "none",
                                   "--mca",
                                   "btl_vader_single_copy_mechanism",
                                   "none"};
  if (::geteuid() == 0) args.push_back("--allow-run-as-root");
  for (const auto& e : env) {
    args.push_back("-x");
    args.push_back(e);
  }
  args.insert(args.end(), command.begin(), command.end());
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execvp("mpirun", argv.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  return {pid, start, log};
}

// Waits for a started job; after `limit` its process group is killed and the
// test fails.
inline MpirunResult finish_mpirun(const MpirunStarted& s, std::chrono::seconds limit) {
  MpirunResult r;
  int status = 0;
  while (::waitpid(s.pid, &status, WNOHANG) != s.pid) {
    if (std::chrono::steady_clock::now() - s.start > limit) {
      ::kill(-s.pid, SIGKILL);
      ::waitpid(s.pid, &status, 0);
      ADD_FAILURE() << "mpirun did not finish within " << limit.count() << " s";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - s.start).count();
  r.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream in(s.log, std::ios::binary);
  r.log.assign(std::istreambuf_iterator<char>(in), {});
  EXPECT_NE(r.exit_status, 127) << "mpirun could not be started; scripts/install-deps.sh "
                                   "installs openmpi-bin\n"
                                << r.log;
  return r;
}

}  // namespace cairn::testing
