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
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

#include <fmt/format.h>

#include "cairn/error.h"
#include "train/control/channel.h"
#include "train/control/collective.h"
#include "train/control/group.h"
#include "util/fork_safe.h"

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

namespace {

// Descriptors the driver needs for `workers` workers: a socket, a stderr
// pipe and a pidfd each, and room for what else it has open (storage, the
// experiment's lock, the reaper's socket, a caller's own files).
rlim_t descriptors_for(size_t workers) { return static_cast<rlim_t>(3 * workers + 256); }

// A descriptor that becomes readable when process `pid` (a child) exits;
// -1 where the kernel has no pidfd_open (before 5.3), and the group then
// asks waitid about that worker on every poll.
int open_exit_fd(pid_t pid) {
#ifdef SYS_pidfd_open
  const long fd = ::syscall(SYS_pidfd_open, pid, 0);  // close-on-exec by definition
  return fd >= 0 ? static_cast<int>(fd) : -1;
#else
  (void)pid;
  return -1;
#endif
}

// The usual soft limit on open files (1024) ends a local group at about 330
// ranks, while the hard limit is usually far higher: raise the soft limit as
// far as the group needs, as servers that hold many connections do.
rlimit raise_descriptor_limit(size_t workers) {
  return raise_open_file_limit(
      descriptors_for(workers), fmt::format("{} local workers", workers),
      "a socket, a pipe and a pidfd each",
      "raise it, or start fewer workers per driver (the MPI or torchrun-style launchers "
      "spread them over processes)");
}

}  // namespace

class LocalGroup final : public Group {
 public:
  LocalGroup(const LaunchSpec& spec, const std::vector<TrainContext>& places)
      : worker_file_limit_(raise_descriptor_limit(places.size())),
        epoll_(::epoll_create1(EPOLL_CLOEXEC)) {
    if (!epoll_) throw errno_error(errno, "epoll_create1", "the workers' descriptors");
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

  // Costs O(workers with something to say), not O(workers): the workers'
  // descriptors sit in one epoll set, and only those it reports ready are
  // read (a round of 1,024 ranks otherwise reads every worker's descriptors
  // once per message that arrives).
  std::vector<GroupEvent> poll(int timeout_ms) override {
    if (watched_ > 0 || running_ > 0) {
      epoll_event ready[256];
      // ignore-error: EINTR (n < 0) just means look again
      const int n = ::epoll_wait(epoll_.get(), ready, 256, timeout_ms);
      for (int i = 0; i < n; ++i) mark(ready[i].data.u64 >> 2);
    }
    for (size_t i : unwatched_exits_) mark(i);
    std::sort(marked_.begin(), marked_.end());  // events in rank order, as before
    std::vector<GroupEvent> events;
    for (size_t i : marked_) {
      Worker& w = workers_[i];
      w.marked = false;
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
    marked_.clear();
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
        note_reaped(index_of(w.rank));
      }
      drain_stderr(w, /*final=*/true);
      unwatch(w.channel.fd());
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

  // The epoll set: readable when a worker's descriptor is.
  std::vector<int> wait_fds() const override { return {epoll_.get()}; }

 private:
  const rlimit worker_file_limit_;  // the driver's limit before raise_descriptor_limit

  struct Worker {
    int rank = 0;
    pid_t pid = -1;
    bool reaped = false;
    bool marked = false;  // in marked_
    Channel channel;
    int err_fd = -1;
    int exit_fd = -1;  // pidfd; -1 once reaped or where the kernel has none
    StderrTail err{""};
  };

  // What an epoll entry stands for: (worker index << 2) | kind.
  enum FdKind : uint64_t { kChannel = 0, kStderr = 1, kExit = 2 };

  void watch(int fd, size_t index, FdKind kind) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = (static_cast<uint64_t>(index) << 2) | kind;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      throw errno_error(errno, "epoll_ctl", fmt::format("rank {}", workers_[index].rank));
    }
    ++watched_;
  }

  // Before the descriptor is closed: a copy of it in another process (one
  // the driver's program forked meanwhile) would otherwise keep it in the set.
  void unwatch(int fd) {
    if (fd < 0) return;
    // ignore-error: only fails for a descriptor that is not in the set
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr) == 0) --watched_;
  }

  void mark(size_t index) {
    if (index >= workers_.size() || workers_[index].marked) return;
    workers_[index].marked = true;
    marked_.push_back(index);
  }

  void close_exit_fd(Worker& w) {
    if (w.exit_fd < 0) return;
    unwatch(w.exit_fd);
    ::close(w.exit_fd);
    w.exit_fd = -1;
  }

  void note_reaped(size_t index) {
    Worker& w = workers_[index];
    w.reaped = true;
    --running_;
    close_exit_fd(w);
    std::erase(unwatched_exits_, index);
  }

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
    note_reaped(index_of(w.rank));
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
    auto it = index_of_rank_.find(rank);
    if (it == index_of_rank_.end()) {
      throw Error(ErrorCode::kInternal, fmt::format("no worker for rank {} in this group", rank));
    }
    return it->second;
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
      ::setrlimit(RLIMIT_NOFILE, &worker_file_limit_);  // ignore-error: it can only lower it
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
    const size_t index = workers_.size();
    Worker& w = workers_.emplace_back();
    w.rank = rank;
    w.pid = pid;
    w.channel = Channel(UniqueFd(sv[0]), fmt::format("rank {}", rank));
    w.err_fd = errp[0];
    w.exit_fd = open_exit_fd(pid);
    w.err = StderrTail(fmt::format("[rank {}] ", rank));
    index_of_rank_[rank] = index;
    ++running_;
    set_nonblocking(sv[0]);
    set_nonblocking(errp[0]);
    watch(sv[0], index, kChannel);
    watch(errp[0], index, kStderr);
    if (w.exit_fd >= 0) {
      watch(w.exit_fd, index, kExit);
    } else {
      unwatched_exits_.push_back(index);
    }
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
    if (!open) {
      unwatch(w.channel.fd());
      w.channel.close();
    }
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
        unwatch(w.err_fd);
        ::close(w.err_fd);
        w.err_fd = -1;
        w.err.flush();
      }
      break;
    }
    if (final && w.err_fd >= 0 && w.reaped) {
      // A grandchild may still hold the pipe; what the worker wrote is read.
      unwatch(w.err_fd);
      ::close(w.err_fd);
      w.err_fd = -1;
      w.err.flush();
    }
  }

  UniqueFd epoll_;  // every open channel, stderr pipe and pidfd of the workers
  std::vector<Worker> workers_;
  std::unordered_map<int, size_t> index_of_rank_;
  size_t watched_ = 0;                   // descriptors in epoll_
  size_t running_ = 0;                   // workers not reaped
  std::vector<size_t> unwatched_exits_;  // running workers without a pidfd: asked every poll
  std::vector<size_t> marked_;           // workers poll() looks at this time
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

rlimit raise_open_file_limit(rlim_t need, std::string_view who, std::string_view why,
                             std::string_view remedy) {
  // The limit before this process's first raise: a driver of a torchrun-style
  // launch raises it for its connections before its own worker's group does.
  static ForkSafeMutex mutex(30);
  static std::optional<rlimit> before_raise;
  const std::lock_guard lock(mutex);
  rlimit now{};
  if (::getrlimit(RLIMIT_NOFILE, &now) != 0) throw errno_error(errno, "getrlimit", "RLIMIT_NOFILE");
  const rlimit original = before_raise.value_or(now);
  if (now.rlim_cur == RLIM_INFINITY || now.rlim_cur >= need) return original;
  if (now.rlim_max != RLIM_INFINITY && now.rlim_max < need) {
    throw Error(ErrorCode::kFailedPrecondition,
                fmt::format("{} need about {} open files in the driver ({}), but this process "
                            "may open at most {} (the hard limit, `ulimit -Hn`): {}",
                            who, need, why, now.rlim_max, remedy));
  }
  rlimit raised = now;
  raised.rlim_cur = need;
  if (::setrlimit(RLIMIT_NOFILE, &raised) != 0) {
    throw errno_error(errno, "setrlimit", fmt::format("RLIMIT_NOFILE to {}", need));
  }
  if (!before_raise) before_raise = now;
  return original;
}

}  // namespace cairn::train_internal
