// A started group of workers, one per rank, for one attempt of a run. The
// driver talks to every rank the same way whether the rank is a process it
// forked (LocalGroup) or a worker an MPI agent forked on another node
// (MpiGroup): messages in both directions, plus one exit event per rank.
//
// Thread-safety: none; the driver's thread owns the group.
#pragma once

#include <sys/resource.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cairn/train.h"

namespace cairn::train_internal {

struct GroupEvent {
  enum Type { kMessage, kExit };
  Type type = kMessage;
  int rank = 0;
  nlohmann::json message;  // kMessage
  bool clean = false;      // kExit: exited with status 0
  std::string cause;       // kExit: "exited with status 1", "was killed by signal 9 (SIGKILL)"
};

// What each worker needs to start.
struct LaunchSpec {
  TrainFn train_fn;
  nlohmann::json train_loop_config;
  TrainContext context;                       // world_rank etc. are filled per rank
  std::optional<std::string> checkpoint_uri;  // get_checkpoint()
  std::string scratch_dir;                    // node-local; removed after the attempt
};

class Group {
 public:
  virtual ~Group() = default;
  // Waits up to `timeout_ms` for something to happen and returns what did.
  // Messages a rank sent before it exited come before its exit event.
  virtual std::vector<GroupEvent> poll(int timeout_ms) = 0;
  virtual void send(int rank, const nlohmann::json& message) = 0;
  // Kills every worker still running and waits for all of them. Idempotent.
  virtual void stop() = 0;
  // Waits up to `timeout_ms` for every worker to exit on its own, then stops.
  virtual void wait_all(int timeout_ms) = 0;
  // The last lines the rank wrote to stderr (empty if unknown).
  virtual std::string stderr_tail(int rank) const = 0;
  // Descriptors that become readable when poll() has something to return, for
  // a caller that waits on this group together with other descriptors.
  virtual std::vector<int> wait_fds() const = 0;
};

// Forks spec.context.world_size workers on this machine. The calling
// process must stay alive while they run; they die with it.
std::unique_ptr<Group> start_local_group(const LaunchSpec& spec);

// Forks one worker per entry of `places` (each a complete context: world
// rank, local rank, node rank...); events and send() use those world ranks.
// The MPI launcher starts its node's one rank this way.
std::unique_ptr<Group> start_local_ranks(const LaunchSpec& spec,
                                         const std::vector<TrainContext>& places);

// The driver's limit on open files (a local group's workers, a launch's
// connections to its agents): raises this process's soft limit to `need`
// when it is lower, as far as the hard limit allows (never lowers it), and
// returns the limit the process had before its first raise, which workers
// get back (their own children may use select(), which breaks above 1024).
// Throws kFailedPrecondition, before anything starts, when the hard limit is
// below `need`: "<who> need about <need> open files in the driver (<why>),
// but this process may open at most <hard> (the hard limit, `ulimit -Hn`):
// <remedy>".
rlimit raise_open_file_limit(rlim_t need, std::string_view who, std::string_view why,
                             std::string_view remedy);

// The worker's side: runs train_fn with the session set up for `channel` and
// returns the process exit status to use (0 on success).
int run_worker(const LaunchSpec& spec, int fd);

// For the Tuner's class trainables, in a worker (kFailedPrecondition
// outside one). take_save_request(): whether a release asked for a
// checkpoint since the last call (DriverSpec::on_round's RoundDirective::save).
// report_checkpoint(): a synchronous report round that commits `checkpoint`
// with the metrics of this rank's previous report() and adds no history row.
bool take_save_request();
// The release's reset request (RoundDirective::reset: {"config", "checkpoint"}),
// once; nothing if none came since the last call.
std::optional<nlohmann::json> take_reset_request();
void report_checkpoint(const Checkpoint& checkpoint);
// The newest round whose release this worker has received, on any thread
// (tests: to wait until an asynchronous round is released without calling
// a report boundary).
int released_round();

// Keeps the last `max_bytes` of a stream, whole lines where possible, and
// forwards each complete line to stderr with a prefix.
class StderrTail {
 public:
  explicit StderrTail(std::string prefix, size_t max_bytes = 4096)
      : prefix_(std::move(prefix)), max_bytes_(max_bytes) {}
  void feed(const char* data, size_t n);
  void flush();  // forwards a final partial line
  const std::string& tail() const { return tail_; }

 private:
  std::string prefix_;
  size_t max_bytes_;
  std::string line_;
  std::string tail_;
};

}  // namespace cairn::train_internal
