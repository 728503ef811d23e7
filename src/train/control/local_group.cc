// The local launcher: fork one worker process per rank.
//
// Each worker gets a socketpair to the driver (the report protocol) and a
// pipe for its stderr, which the driver forwards line by line with a
// "[rank N]" prefix and keeps the tail of for error messages.
//
// Process trees. Each worker leads its own process group (setpgid), which
// everything it starts joins unless it asks otherwise (a shell's background
// job, a fork, a pool of subprocesses). A worker's process group is killed
// with SIGKILL as a whole, so nothing the worker started outlives it:
//   - when the worker is seen to exit: its exit is observed with WNOWAIT, the
//     group is killed while the unreaped worker still holds the group id
//     (so the id cannot have been reused), then the worker is reaped;
//   - when the group stops;
//   - when the driver dies, even by SIGKILL: a reaper process, forked before
//     the workers and told each worker's group id through a socket, waits
//     for the driver's end to close (or for its parent to change)
//     and then kills every group it was told of. It ignores the terminal's
//     SIGINT/SIGTERM/SIGHUP/SIGQUIT so that a Ctrl-C that kills the driver
//     does not kill it first; it exits quietly when the group stops normally.
// A process that leaves the worker's group (setsid(), setpgid()) escapes;
// daemons are out of scope.
//
// A worker also:
//   - asks the kernel to SIGKILL it when the driver dies
//     (PR_SET_PDEATHSIG), so a killed driver never leaves workers running,
//     and exits at once if the driver died before it asked;
//   - closes every inherited descriptor but its own three. This matters: the
//     driver holds the experiment's flock(2), and a lock fd shared with a
//     worker would outlive a killed driver;
//   - leaves with _exit(), so no destructor of the driver's objects runs in
//     the child (a FileLock destructor there would unlock the driver's lock).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>

#include <fmt/format.h>

#include "cairn/error.h"
#include "train/control/channel.h"
#include "train/control/collective.h"
#include "train/control/group.h"

namespace cairn::train_internal {

void StderrTail::feed(const char* data, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    line_.push_back(data[i]);
    if (data[i] == '\n' || line_.size() >= 8192) {
      std::string out = prefix_ + line_;
      if (out.back() != '\n') out.push_back('\n');
      (void)!::write(2, out.data(), out.size());  // ignore-error: forwarding is best effort
      tail_ += line_;
      line_.clear();
    }
  }
  if (tail_.size() > max_bytes_) {
    size_t cut = tail_.size() - max_bytes_;
    size_t nl = tail_.find('\n', cut);
    tail_.erase(0, nl != std::string::npos && nl + 1 < tail_.size() ? nl + 1 : cut);
  }
}

void StderrTail::flush() {
  if (line_.empty()) return;
  feed("\n", 1);
}

namespace {

void set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    throw errno_error(errno, "fcntl", "worker channel");
  }
}

// The reaper's side (see the top of this file). Runs in a child forked from a
// process that may have other threads, so it uses system calls only: no
// allocation, no locks. Messages are 4-byte native ints, one per packet: > 0 adds a process group,
// < 0 removes one, 0 ends the reaper without killing anything.
[[noreturn]] void reaper_main(int fd, pid_t driver, pid_t* groups, size_t capacity) {
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE}) ::sigaction(sig, &ignore, nullptr);
  size_t count = 0;
  auto kill_all = [&] {
    for (size_t i = 0; i < count; ++i) ::kill(-groups[i], SIGKILL);  // ignore-error: may be gone
    ::_exit(0);
  };
  while (true) {
    pollfd p{fd, POLLIN, 0};
    const int rc = ::poll(&p, 1, 200);
    if (::getppid() != driver) kill_all();  // the driver died; we were re-parented
    if (rc <= 0) continue;                  // timeout or EINTR
    int32_t buf[64];
    const ssize_t r = ::read(fd, buf, sizeof buf);
    if (r == 0) kill_all();  // the driver's end is closed: it died
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      kill_all();
    }
    for (ssize_t i = 0; i < r / static_cast<ssize_t>(sizeof(int32_t)); ++i) {
      const int32_t v = buf[i];
      if (v == 0) ::_exit(0);
      if (v > 0 && count < capacity) groups[count++] = v;
      if (v < 0) {
        for (size_t k = 0; k < count; ++k) {
          if (groups[k] == -v) groups[k] = groups[--count];
        }
      }
    }
  }
}

class LocalGroup final : public Group {
 public:
  LocalGroup(const LaunchSpec& spec, const std::vector<TrainContext>& places) {
    std::cout.flush();
    std::fflush(nullptr);  // buffered output must not be written twice
    const pid_t driver = ::getpid();
    try {
      start_reaper(places.size(), driver);
      for (const TrainContext& place : places) start_one(spec, place, driver);
    } catch (...) {
      stop();
      throw;
    }
  }
  ~LocalGroup() override { stop(); }

  std::vector<GroupEvent> poll(int timeout_ms) override {
    std::vector<pollfd> fds;
    for (auto& w : workers_) {
      if (w.channel.open()) fds.push_back({w.channel.fd(), POLLIN, 0});
      if (w.err_fd >= 0) fds.push_back({w.err_fd, POLLIN, 0});
    }
    bool any_running = false;
    for (auto& w : workers_) any_running |= !w.reaped;
    if (!fds.empty()) {
      ::poll(fds.data(), fds.size(), timeout_ms);  // ignore-error: EINTR just means look again
    } else if (any_running) {
      ::usleep(static_cast<useconds_t>(timeout_ms) * 1000);
    }
    std::vector<GroupEvent> events;
    for (Worker& w : workers_) {
      const int rank = w.rank;
      drain(w, events);
      if (w.reaped) continue;
      int status = 0;
      if (try_reap(w, status)) {
        drain(w, events);  // what it said before it died comes first
        drain_stderr(w, /*final=*/true);
        GroupEvent e;
        e.type = GroupEvent::kExit;
        e.rank = rank;
        e.clean = is_clean_exit(status);
        e.cause = fmt::format("(pid {}) {}", w.pid, describe_wait_status(status));
        events.push_back(std::move(e));
      }
    }
    return events;
  }

  void send(int rank, const nlohmann::json& message) override {
    Worker& w = workers_[index_of(rank)];
    if (!w.channel.open() || w.reaped) return;
    try {
      w.channel.send(message);
    } catch (const Error&) {
      // ignore-error: the worker is gone; its exit event reports why
    }
  }

  void stop() override {
    // Every unreaped worker still holds its group id, so the ids are safe to use.
    for (auto& w : workers_) {
      if (!w.reaped && w.pid > 0) kill_tree(w.pid);
    }
    for (auto& w : workers_) {
      if (!w.reaped && w.pid > 0) {
        int status = 0;
        while (::waitpid(w.pid, &status, 0) < 0 && errno == EINTR) {
        }
        w.reaped = true;
      }
      drain_stderr(w, /*final=*/true);
      w.channel.close();
    }
    stop_reaper();
  }

  void wait_all(int timeout_ms) override {
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    while (Clock::now() < deadline) {
      bool all = true;
      for (auto& w : workers_) {
        if (w.reaped) continue;
        int status = 0;
        if (!try_reap(w, status)) all = false;
        drain_stderr(w, false);
      }
      if (all) break;
      ::usleep(10000);
    }
    stop();
  }

  std::string stderr_tail(int rank) const override { return workers_[index_of(rank)].err.tail(); }

  std::vector<int> wait_fds() const override {
    std::vector<int> fds;
    for (const auto& w : workers_) {
      if (w.channel.open()) fds.push_back(w.channel.fd());
      if (w.err_fd >= 0) fds.push_back(w.err_fd);
    }
    return fds;
  }

 private:
  struct Worker {
    int rank = 0;
    pid_t pid = -1;
    bool reaped = false;
    Channel channel;
    int err_fd = -1;
    StderrTail err{""};
  };

  // Kills the worker's process group (and the worker, should it not lead one).
  static void kill_tree(pid_t pid) {
    if (::kill(-pid, SIGKILL) != 0) ::kill(pid, SIGKILL);  // ignore-error: it may be gone
  }

  // If the worker exited: kills what is left of its process group while the
  // unreaped worker still pins the group id, then reaps it. True if reaped.
  bool try_reap(Worker& w, int& status) {
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(w.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
        info.si_pid != w.pid) {
      return false;
    }
    kill_tree(w.pid);
    while (::waitpid(w.pid, &status, 0) < 0 && errno == EINTR) {
    }
    w.reaped = true;
    tell_reaper(-w.pid);
    return true;
  }

  void start_reaper(size_t capacity, pid_t driver) {
    // A socket rather than a pipe: send() with MSG_NOSIGNAL cannot raise
    // SIGPIPE in the driver should the reaper be gone, and SEQPACKET keeps
    // each 4-byte message whole.
    int p[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, p) != 0) {
      throw errno_error(errno, "socketpair", "the workers' reaper");
    }
    // Allocated before fork: the reaper must not allocate.
    reaper_groups_ = std::make_unique<pid_t[]>(capacity);
    const pid_t pid = ::fork();
    if (pid < 0) {
      const int err = errno;
      ::close(p[0]);
      ::close(p[1]);
      throw errno_error(err, "fork", "the workers' reaper");
    }
    if (pid == 0) {
      // Hold nothing but its own end: a copy of the driver's end would keep
      // the socket open after the driver died, and no lock fd of the driver's.
      ::close(p[1]);
      if (p[0] != 3) {
        ::dup2(p[0], 3);
        ::close(p[0]);
      }
      ::close_range(4, ~0u, 0);
      reaper_main(3, driver, reaper_groups_.get(), capacity);
    }
    ::close(p[0]);
    reaper_pid_ = pid;
    reaper_fd_ = p[1];
  }

  void tell_reaper(int32_t message) {
    if (reaper_fd_ < 0) return;
    // ignore-error: a reaper that is gone cannot be told; the driver's own
    // kills (stop(), try_reap()) still happen.
    (void)!::send(reaper_fd_, &message, sizeof message, MSG_NOSIGNAL);
  }

  void stop_reaper() {
    if (reaper_pid_ <= 0) return;
    tell_reaper(0);
    ::close(reaper_fd_);
    reaper_fd_ = -1;
    int status = 0;
    while (::waitpid(reaper_pid_, &status, 0) < 0 && errno == EINTR) {
    }
    reaper_pid_ = -1;
  }

  size_t index_of(int rank) const {
    for (size_t i = 0; i < workers_.size(); ++i) {
      if (workers_[i].rank == rank) return i;
    }
    throw Error(ErrorCode::kInternal, fmt::format("no worker for rank {} in this group", rank));
  }

  void start_one(const LaunchSpec& spec, const TrainContext& place, pid_t driver) {
    const int rank = place.world_rank;
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      throw errno_error(errno, "socketpair", fmt::format("rank {}", rank));
    }
    int errp[2];
    if (::pipe2(errp, O_CLOEXEC) != 0) {
      const int err = errno;
      ::close(sv[0]);
      ::close(sv[1]);
      throw errno_error(err, "pipe", fmt::format("rank {}", rank));
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      const int err = errno;
      for (int fd : {sv[0], sv[1], errp[0], errp[1]}) ::close(fd);
      throw errno_error(err, "fork", fmt::format("rank {}", rank));
    }
    if (pid == 0) {
      ::setpgid(0, 0);  // lead a process group: the worker's tree (see the top)
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != driver) ::_exit(111);
      ::dup2(errp[1], 2);
      const int ctl = sv[1];  // >= 3: 0, 1 and 2 are open
      if (ctl > 3) ::close_range(3, static_cast<unsigned>(ctl - 1), 0);
      ::close_range(static_cast<unsigned>(ctl + 1), ~0u, 0);
      LaunchSpec mine = spec;
      mine.context = place;
      ::_exit(run_worker(mine, ctl));
    }
    // Both sides set the group, so it is set before either goes on.
    ::setpgid(pid, pid);  // ignore-error: EACCES/ESRCH mean the child did it or died
    tell_reaper(static_cast<int32_t>(pid));
    ::close(sv[1]);
    ::close(errp[1]);
    Worker& w = workers_.emplace_back();
    w.rank = rank;
    w.pid = pid;
    w.channel = Channel(UniqueFd(sv[0]), fmt::format("rank {}", rank));
    w.err_fd = errp[0];
    w.err = StderrTail(fmt::format("[rank {}] ", rank));
    set_nonblocking(sv[0]);
    set_nonblocking(errp[0]);
  }

  void drain(Worker& w, std::vector<GroupEvent>& events) {
    const int rank = w.rank;
    drain_stderr(w, false);
    if (!w.channel.open()) return;
    std::vector<nlohmann::json> messages;
    bool open = true;
    try {
      open = w.channel.read_available(messages);
    } catch (const Error& e) {
      GroupEvent ev;
      ev.rank = rank;
      ev.message = {{"t", "error"}, {"message", e.what()}};
      events.push_back(std::move(ev));
      open = false;
    }
    for (auto& m : messages) {
      GroupEvent ev;
      ev.rank = rank;
      ev.message = std::move(m);
      events.push_back(std::move(ev));
    }
    if (!open) w.channel.close();
  }

  void drain_stderr(Worker& w, bool final) {
    if (w.err_fd < 0) return;
    char buf[8192];
    for (int i = 0; i < 256; ++i) {  // bounded: 2 MiB per call
      ssize_t r = ::read(w.err_fd, buf, sizeof buf);
      if (r > 0) {
        w.err.feed(buf, static_cast<size_t>(r));
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      if (r == 0 || (r < 0 && errno != EAGAIN)) {
        ::close(w.err_fd);
        w.err_fd = -1;
        w.err.flush();
      }
      break;
    }
    if (final && w.err_fd >= 0 && w.reaped) {
      // A grandchild may still hold the pipe; what the worker wrote is read.
      ::close(w.err_fd);
      w.err_fd = -1;
      w.err.flush();
    }
  }

  std::vector<Worker> workers_;
  pid_t reaper_pid_ = -1;
  int reaper_fd_ = -1;  // the driver's end; closing it (or dying) tells the reaper
  std::unique_ptr<pid_t[]> reaper_groups_;
};

}  // namespace

std::unique_ptr<Group> start_local_group(const LaunchSpec& spec) {
  std::vector<TrainContext> places;
  for (int rank = 0; rank < spec.context.world_size; ++rank) {
    TrainContext c = spec.context;
    c.world_rank = rank;
    c.local_rank = rank;
    c.local_world_size = spec.context.world_size;
    c.node_rank = 0;
    places.push_back(std::move(c));
  }
  return std::make_unique<LocalGroup>(spec, places);
}

std::unique_ptr<Group> start_local_ranks(const LaunchSpec& spec,
                                         const std::vector<TrainContext>& places) {
  return std::make_unique<LocalGroup>(spec, places);
}

}  // namespace cairn::train_internal
