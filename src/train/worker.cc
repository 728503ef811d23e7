// The worker's side of the report protocol (see collective.h):
//
//   worker -> driver  {"t":"report","round":n,"metrics":{...},"checkpoint":bool,
//                      "preempted":bool}                        (SIGTERM seen here)
//   driver -> worker  {"t":"upload","round":n,"dest":URI}      (uploaders only)
//   worker -> driver  {"t":"uploaded","round":n,"files":[...],"metadata":{...}}
//   driver -> worker  {"t":"release","round":n,"checkpoint":URI|null,"preempt":bool}
//   driver -> worker  {"t":"abort","reason":"..."}             (group is stopping)
//   worker -> driver  {"t":"done","count":n} | {"t":"error","message":"..."}
//   worker -> driver  {"t":"invalid_report","message":"..."}  report() refused
//                     its arguments (not retried: a restart would repeat it)
//   worker -> driver  {"t":"upload_failed","round":n,"message":"..."}  an
//                     asynchronous report's upload failed (the group stops now,
//                     not at the rank's next report)
//
// A rank writes its own files straight into the reserved destination
// (copy_files, checkpoint/copy.h) and sends their sizes and checksums; only
// the driver writes the manifest.
//
// Asynchronous reports (ReportOptions::async) run the same rounds, in order,
// on a thread of the worker (AsyncReports) from a snapshot of the rank's files
// (train/snapshot.h); train_fn goes on meanwhile. A synchronous report waits
// until that thread has nothing left, so only one thread reads the channel at
// a time; sends are serialized by Session::send_mu.
#include <cxxabi.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <thread>
#include <typeinfo>
#include <utility>

#include <fmt/format.h>

#include "cairn/error.h"
#include "cairn/storage.h"
#include "checkpoint/copy.h"
#include "train/control/channel.h"
#include "train/control/entry_message.h"
#include "train/control/group.h"
#include "train/control/sigterm.h"
#include "train/snapshot.h"
#include "util/fs.h"
#include "util/json.h"

namespace cairn {

namespace {

class AsyncReports;

// A release's instructions to train_fn, for its round.
struct ReleaseNote {
  int round = 0;
  bool preempt = false;
  bool save = false;
  std::optional<nlohmann::json> reset;
};

struct Session {
  TrainContext context;
  std::optional<std::string> checkpoint_uri;
  std::string scratch_dir;
  train_internal::Channel* channel = nullptr;
  std::mutex send_mu;  // the main thread and AsyncReports both send
  int reports = 0;     // rounds started (sent, or queued to be sent)
  // What releases said, received by either thread and kept here until
  // train_fn's thread reaches a report boundary that covers their round
  // (apply_releases): the notice, a save request and a reset change only at
  // such a boundary, and at the same one on every rank.
  std::mutex release_mu;  // guards received and released_round
  std::deque<ReleaseNote> received;
  std::atomic<int> released_round{0};  // the newest round whose release came
  // What train_fn sees (its thread only): the preemption notice
  // (should_checkpoint()), the Tuner's save and reset requests.
  bool preempt_notice = false;
  bool save_request = false;
  std::optional<nlohmann::json> reset_request;
  nlohmann::json last_metrics = nlohmann::json::object();  // of the last report()
  // SIGTERM to this worker: sent with its next report.
  const train_internal::SigtermNotice* sigterm = nullptr;
  std::unique_ptr<AsyncReports> async;  // started by the first asynchronous report
};

Session* g_session = nullptr;

Session& session(const char* what) {
  if (g_session == nullptr) {
    throw Error(ErrorCode::kFailedPrecondition,
                fmt::format("cairn::train::{}() called outside a worker; call it inside the "
                            "train_fn run by Trainer::fit()",
                            what));
  }
  return *g_session;
}

// Copies the rank's checkpoint files into `dest_uri`; returns their entries.
// A source that does not exist fails here instead of adding nothing. The
// driver reserved `dest_uri` for this round (a fresh index, never
// committed), so no rank asks the storage whether it is a committed
// checkpoint, as CheckpointWriter would: one request per rank fewer, half of
// a one-file rank's requests on S3 (docs/scale.md).
std::vector<ManifestEntry> upload(const Checkpoint& source, const std::string& dest_uri) {
  return copy_files(source, *open_storage(dest_uri));
}

std::string exception_type_name(const std::type_info& type) {
  int status = 0;
  char* name = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  std::string out = status == 0 && name ? name : type.name();
  std::free(name);
  return out;
}

// torchrun's environment (TrainContext::master_addr), for code that reads it
// (c10d's env:// init, scripts the worker starts). The worker is a process of
// its own, so this changes nobody else's environment.
void export_rendezvous_env(const TrainContext& c) {
  const std::pair<const char*, std::string> vars[] = {
      {"MASTER_ADDR", c.master_addr},
      {"MASTER_PORT", std::to_string(c.master_port)},
      {"RANK", std::to_string(c.world_rank)},
      {"WORLD_SIZE", std::to_string(c.world_size)},
      {"LOCAL_RANK", std::to_string(c.local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(c.local_world_size)},
      {"GROUP_RANK", std::to_string(c.node_rank)},
      // Tells a Trainer started in this worker that these are its own
      // group's, not a launcher's to join (Launcher::kAuto, env_launch.h).
      {"CAIRN_WORKER", "1"},
  };
  for (const auto& [name, value] : vars) {
    if (::setenv(name, value.c_str(), 1) != 0) throw errno_error(errno, "setenv", name);
  }
  // Under torchrun's static rendezvous this says that the launcher's agent
  // serves the store at MASTER_PORT, and c10d's env:// would only connect
  // there; the port above is this group's own, for rank 0 to listen on.
  if (::unsetenv("TORCHELASTIC_USE_AGENT_STORE") != 0) {
    throw errno_error(errno, "unsetenv", "TORCHELASTIC_USE_AGENT_STORE");
  }
}

[[noreturn]] void throw_aborted(const nlohmann::json& m) {
  throw Error(ErrorCode::kFailedPrecondition,
              fmt::format("the group is stopping: {}", m.value("reason", std::string("aborted"))));
}

void send(Session& s, const nlohmann::json& message) {
  std::lock_guard<std::mutex> g(s.send_mu);
  s.channel->send(message);
}

// One report round, from this rank's side.
struct RoundJob {
  int round = 0;
  nlohmann::json message;                  // the "report" message
  std::optional<Checkpoint> files;         // what this rank uploads, if anything
  std::optional<nlohmann::json> metadata;  // frozen by a snapshot; else read at upload
  std::filesystem::path staging;           // the snapshot's folder, removed after the round
};

// Sends the report, uploads when the driver asks, returns at the release.
// `background`: an upload failure is also sent to the driver at once, since
// train_fn will not see it until its next report.
void run_round(Session& s, const RoundJob& job, bool background) {
  train_internal::Channel& ch = *s.channel;
  const int rank = s.context.world_rank;
  send(s, job.message);
  for (int step = 0; step < 3; ++step) {  // at most: upload, release
    std::optional<nlohmann::json> m = ch.recv();
    if (!m) {
      throw Error(ErrorCode::kUnavailable,
                  fmt::format("rank {}: the driver went away during report #{}", rank, job.round));
    }
    const std::string t = m->value("t", "");
    if (t == "abort") throw_aborted(*m);
    if (t == "release") {
      ReleaseNote note;
      note.round = job.round;
      note.preempt = m->value("preempt", false);
      note.save = m->value("save", false);
      if (m->contains("reset") && (*m)["reset"].is_object()) note.reset = (*m)["reset"];
      std::lock_guard<std::mutex> lock(s.release_mu);
      s.received.push_back(std::move(note));
      s.released_round = job.round;
      return;
    }
    if (t == "upload" && job.files) {
      const std::string dest = m->at("dest").get<std::string>();
      std::vector<ManifestEntry> files;
      nlohmann::json metadata;
      try {
        files = upload(*job.files, dest);
        metadata = job.metadata ? *job.metadata : job.files->get_metadata();
      } catch (const Error& e) {
        Error failed = with_context(
            e,
            fmt::format("rank {}: uploading report #{}'s checkpoint to {}", rank, job.round, dest));
        if (background) {
          try {
            send(s, {{"t", "upload_failed"}, {"round", job.round}, {"message", failed.what()}});
          } catch (const Error&) {
            // ignore-error: the driver is gone; train_fn sees `failed` at its next report
          }
        }
        throw failed;
      }
      nlohmann::json list = nlohmann::json::array();
      for (const auto& f : files) list.push_back(train_internal::entry_message(f));
      send(s, {{"t", "uploaded"}, {"round", job.round}, {"files", list}, {"metadata", metadata}});
      continue;
    }
    throw Error(ErrorCode::kInternal,
                fmt::format("rank {}: unexpected message from the driver: {}", rank, m->dump()));
  }
  throw Error(ErrorCode::kInternal,
              fmt::format("rank {}: report #{} did not complete", rank, job.round));
}

// Makes what the releases of rounds up to `round` said visible to train_fn.
// Called on train_fn's thread at report boundaries only, with a `round`
// whose release has certainly come (report() waited for it), so the value
// train_fn sees after the k-th report() call is the same on every rank that
// made that call the same way, however fast its releases arrived.
void apply_releases(Session& s, int round) {
  std::lock_guard<std::mutex> lock(s.release_mu);
  while (!s.received.empty() && s.received.front().round <= round) {
    ReleaseNote& note = s.received.front();
    if (note.preempt) s.preempt_notice = true;
    if (note.save) s.save_request = true;
    if (note.reset) s.reset_request = std::move(note.reset);
    s.received.pop_front();
  }
}

void remove_staging(const std::filesystem::path& dir) {
  if (dir.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);  // ignore-error: the scratch folder goes after the attempt
}

// The rounds of asynchronous reports, run in order on a thread of their own.
// Pending rounds are the ones queued and not yet released (the one running
// included). After a round fails no later one is sent: the rank's sequence
// of rounds is broken, and every later call throws that round's error.
class AsyncReports {
 public:
  explicit AsyncReports(Session& s) : s_(s), thread_([this] { loop(); }) {}
  ~AsyncReports() { stop(); }
  AsyncReports(const AsyncReports&) = delete;
  AsyncReports& operator=(const AsyncReports&) = delete;

  // Throws the error of a failed round.
  void check() {
    std::lock_guard<std::mutex> g(mu_);
    if (error_) std::rethrow_exception(error_);
  }
  // Blocks until fewer than `max_pending` rounds are pending.
  void wait_for_slot(size_t max_pending) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return error_ || jobs_.size() < max_pending; });
    if (error_) std::rethrow_exception(error_);
  }
  void push(RoundJob job) {
    std::lock_guard<std::mutex> g(mu_);
    jobs_.push_back(std::move(job));
    cv_.notify_all();
  }
  // Blocks until every pending round is released; throws a failed one's error.
  void drain() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return error_ || jobs_.empty(); });
    if (error_) std::rethrow_exception(error_);
  }
  // Rounds not yet started are dropped; the one running finishes (a caller
  // that will not wait for the driver first shuts the channel's read side).
  void stop() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stopping_ = true;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    while (true) {
      RoundJob* job = nullptr;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stopping_ || !jobs_.empty(); });
        if (stopping_) {
          for (const RoundJob& j : jobs_) remove_staging(j.staging);
          jobs_.clear();
          cv_.notify_all();
          return;
        }
        job = &jobs_.front();  // stays put: a deque's push_back moves no element
      }
      std::exception_ptr failed;
      try {
        run_round(s_, *job, /*background=*/true);
      } catch (...) {
        failed = std::current_exception();
      }
      remove_staging(job->staging);
      std::lock_guard<std::mutex> g(mu_);
      jobs_.pop_front();
      if (failed && !error_) error_ = failed;
      if (error_) {
        for (const RoundJob& j : jobs_) remove_staging(j.staging);
        jobs_.clear();
      }
      cv_.notify_all();
    }
  }

  Session& s_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RoundJob> jobs_;
  std::exception_ptr error_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the rest is ready
};

}  // namespace

namespace train {

const TrainContext& get_context() { return session("get_context").context; }

std::optional<Checkpoint> get_checkpoint() {
  Session& s = session("get_checkpoint");
  if (!s.checkpoint_uri) return std::nullopt;
  return Checkpoint::from_directory(*s.checkpoint_uri);
}

namespace {

// report(), or with `attach` a round that commits `checkpoint` with the
// previous report's metrics and adds no row to the run's history.
void report_round(const nlohmann::json& metrics, const std::optional<Checkpoint>& checkpoint,
                  const ReportOptions& options, bool attach) {
  Session& s = session("report");
  const int rank = s.context.world_rank;
  // An asynchronous round that failed breaks this rank's sequence of rounds.
  if (s.async) s.async->check();
  try {
    if (!metrics.is_object() && !metrics.is_null()) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("rank {}: report() metrics must be a JSON object, got {}", rank,
                              metrics.type_name()));
    }
    // Metrics go into manifests and trainer_state.json: they must read back.
    check_storable_json(metrics, fmt::format("rank {}: report() metrics", rank));
    if (options.max_in_flight < 1) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("rank {}: ReportOptions::max_in_flight must be at least 1, got {}",
                              rank, options.max_in_flight));
    }
  } catch (const Error& e) {
    // The driver fails the run once (a restart would repeat this); the
    // exception tells train_fn why.
    send(s, {{"t", "invalid_report"}, {"message", e.what()}});
    throw;
  }
  RoundJob job;
  job.round = s.reports + 1;
  job.message = {{"t", "report"},
                 {"round", job.round},
                 {"metrics", metrics.is_null() ? nlohmann::json::object() : metrics},
                 {"checkpoint", checkpoint.has_value()},
                 {"preempted", s.sigterm != nullptr && s.sigterm->received()},
                 // What train_fn saw before this call: the driver refuses to
                 // commit a round whose ranks saw different notices.
                 {"notice", s.preempt_notice}};
  if (attach) job.message["attach"] = true;
  if (!attach) s.last_metrics = metrics.is_null() ? nlohmann::json::object() : metrics;
  if (!options.async) {
    if (s.async) s.async->drain();  // rounds go in order; one reader of the channel
    s.reports = job.round;
    job.files = checkpoint;
    run_round(s, job, /*background=*/false);
    apply_releases(s, job.round);
    return;
  }
  if (!s.async) s.async = std::make_unique<AsyncReports>(s);
  // Fewer than max_in_flight rounds pending: every round up to
  // job.round - max_in_flight is released, and that is the boundary this
  // call applies, whatever came in since.
  s.async->wait_for_slot(static_cast<size_t>(options.max_in_flight));
  const int settled = job.round - options.max_in_flight;
  if (checkpoint) {
    // In the scratch folder, which the driver removes after the attempt
    // (even when this worker is killed); a temporary folder without one.
    job.staging = s.scratch_dir.empty()
                      ? make_temp_dir("cairn-report-")
                      : std::filesystem::path(s.scratch_dir) / fmt::format("rank-{}", rank) /
                            "reports" / fmt::format("report-{}", job.round);
    try {
      train_internal::Snapshot snap = train_internal::snapshot_checkpoint(*checkpoint, job.staging);
      job.files = std::move(snap.checkpoint);
      job.metadata = std::move(snap.metadata);
    } catch (const Error& e) {
      remove_staging(job.staging);
      // Nothing was sent: the round is not started, and the caller may retry.
      throw with_context(e, fmt::format("rank {}: report #{}: snapshotting {}", rank, job.round,
                                        checkpoint->uri()));
    }
  }
  s.reports = job.round;
  s.async->push(std::move(job));
  apply_releases(s, settled);
}

}  // namespace

void report(const nlohmann::json& metrics, const std::optional<Checkpoint>& checkpoint,
            const ReportOptions& options) {
  report_round(metrics, checkpoint, options, /*attach=*/false);
}

void wait_for_reports() {
  Session& s = session("wait_for_reports");
  if (s.async) s.async->drain();
  apply_releases(s, s.reports);  // every round so far is released
}

bool should_checkpoint() { return session("should_checkpoint").preempt_notice; }

TemporaryDirectory::TemporaryDirectory() {
  std::string prefix = "cairn-tmp-";
  if (g_session != nullptr && !g_session->scratch_dir.empty()) {
    std::filesystem::path base = std::filesystem::path(g_session->scratch_dir) /
                                 fmt::format("rank-{}", g_session->context.world_rank);
    std::filesystem::create_directories(base);
    std::string templ = (base / "tmpXXXXXX").string();
    if (::mkdtemp(templ.data()) == nullptr) {
      throw errno_error(errno, "mkdtemp", templ);
    }
    path_ = templ;
    return;
  }
  path_ = make_temp_dir(prefix).string();
}

TemporaryDirectory::~TemporaryDirectory() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);  // ignore-error: best effort; the scratch root goes too
}

}  // namespace train

namespace train_internal {

int run_worker(const LaunchSpec& spec, int fd) {
  Channel channel(UniqueFd(fd), "the driver");
  Session s;
  s.context = spec.context;
  s.checkpoint_uri = spec.checkpoint_uri;
  s.scratch_dir = spec.scratch_dir;
  s.channel = &channel;
  g_session = &s;
  // SIGTERM is a preemption notice, not an end: the driver stops the group.
  SigtermNotice sigterm;
  s.sigterm = &sigterm;
  int status = 0;
  std::string error;
  try {
    export_rendezvous_env(spec.context);
    spec.train_fn(spec.train_loop_config);
  } catch (const std::exception& e) {
    error = fmt::format("train_fn raised {}: {}", exception_type_name(typeid(e)), e.what());
  } catch (...) {
    error = "train_fn raised an exception that is not a std::exception";
  }
  if (error.empty() && s.async) {
    // train_fn returned: its asynchronous reports must be committed first.
    try {
      s.async->drain();
    } catch (const std::exception& e) {
      error = fmt::format("an asynchronous report failed: {}", e.what());
    }
  }
  try {
    if (error.empty()) {
      send(s, {{"t", "done"}, {"count", s.reports}});
    } else {
      std::fprintf(stderr, "rank %d: %s\n", s.context.world_rank, error.c_str());
      send(s, {{"t", "error"}, {"message", error}});
      status = 1;
    }
  } catch (const Error& e) {
    // ignore-error: the driver is gone or stopping us; the exit status tells it the rest
    std::fprintf(stderr, "rank %d: %s\n", s.context.world_rank, e.what());
    status = status == 0 ? 2 : status;
  }
  if (s.async) {
    // A round still running waits for a driver that may never answer now:
    // end its read at once.
    if (status != 0) ::shutdown(channel.fd(), SHUT_RD);  // ignore-error: already closed is fine
    s.async->stop();
    s.async.reset();
  }
  g_session = nullptr;
  std::cout.flush();
  std::fflush(nullptr);
  return status;
}

}  // namespace train_internal

}  // namespace cairn

namespace cairn::train_internal {

bool take_save_request() { return std::exchange(session("take_save_request").save_request, false); }

std::optional<nlohmann::json> take_reset_request() {
  Session& s = session("take_reset_request");
  std::optional<nlohmann::json> r = std::move(s.reset_request);
  s.reset_request.reset();
  return r;
}

int released_round() { return session("released_round").released_round.load(); }

void report_checkpoint(const Checkpoint& checkpoint) {
  Session& s = session("report_checkpoint");
  train::report_round(s.last_metrics, checkpoint, {}, /*attach=*/true);
}

}  // namespace cairn::train_internal
