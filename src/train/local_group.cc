// The local launcher: fork one worker process per rank.
//
// Each worker gets a socketpair to the driver (the report protocol) and a
// pipe for its stderr, which the driver forwards line by line with a
// "[rank N]" prefix and keeps the tail of for error messages. A worker:
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
#include <cstdio>
#include <cstring>
#include <iostream>

#include <fmt/format.h>

#include "cairn/error.h"
#include "train/channel.h"
#include "train/collective.h"
#include "train/group.h"

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

class LocalGroup final : public Group {
 public:
  LocalGroup(const LaunchSpec& spec, const std::vector<TrainContext>& places) {
    std::cout.flush();
    std::fflush(nullptr);  // buffered output must not be written twice
    const pid_t driver = ::getpid();
    try {
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
      pid_t r = ::waitpid(w.pid, &status, WNOHANG);
      if (r == w.pid) {
        w.reaped = true;
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
    for (auto& w : workers_) {
      if (!w.reaped && w.pid > 0) ::kill(w.pid, SIGKILL);
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
  }

  void wait_all(int timeout_ms) override {
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    while (Clock::now() < deadline) {
      bool all = true;
      for (auto& w : workers_) {
        if (w.reaped) continue;
        int status = 0;
        if (::waitpid(w.pid, &status, WNOHANG) == w.pid) {
          w.reaped = true;
        } else {
          all = false;
        }
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
