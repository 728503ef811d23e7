#include "tune/trial_runner.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cairn/error.h"
#include "experiment/layout.h"
#include "train/control/channel.h"
#include "train/control/driver.h"
#include "train/control/group.h"
#include "util/fs.h"

namespace cairn::tune_internal {

namespace {

// The key a class trainable's checkpoints carry their iteration count under
// (checkpoint metadata), so checkpoint_frequency keeps counting after a resume.
constexpr const char* kIterationKey = "cairn.tune.iteration";

void save_and_report(tune::Trainable& t, const nlohmann::json* result, int iteration) {
  train::TemporaryDirectory dir;
  t.save_checkpoint(dir.path());
  Checkpoint c = Checkpoint::from_directory(dir.path());
  c.set_metadata({{kIterationKey, iteration}});
  if (result != nullptr) {
    train::report(*result, c);
  } else {
    train_internal::report_checkpoint(c);
  }
}

int iteration_of(const Checkpoint& c) {
  const nlohmann::json meta = c.get_metadata();
  if (meta.is_object() && meta.contains(kIterationKey) && meta[kIterationKey].is_number_integer()) {
    return meta[kIterationKey].get<int>();
  }
  return 0;
}

// The Tuner is gone: this runner dies as its death signal would have killed
// it, writing nothing. Failing the round instead would have the Trainer
// record the trial as errored (trainer_state.json), and Tuner::restore would
// then take a trial interrupted by the driver's death for a failed one. The
// kernel closes the driver's end of the channel before it sends the death
// signal (PR_SET_PDEATHSIG), so a runner can see the close first.
[[noreturn]] void die_with_the_tuner() {
  ::kill(::getpid(), SIGKILL);
  ::_exit(137);  // not reached
}

// Sends `message` to the Tuner and waits for its answer; dies with the Tuner
// if it went away. One question at a time: the round is asked on the
// driver's thread while retention may ask from the memory tier's persister
// (the Tuner answers in order, so each answer must go to its asker). The
// runner's forked workers never ask.
nlohmann::json ask_the_tuner(train_internal::Channel& channel, const nlohmann::json& message) {
  static std::mutex asking;
  std::lock_guard<std::mutex> one_at_a_time(asking);
  std::optional<nlohmann::json> reply;
  try {
    channel.send(message);
    reply = channel.recv();
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kUnavailable) throw;
  }
  if (!reply) die_with_the_tuner();
  return *reply;
}

}  // namespace

void (*runner_started_hook)() = nullptr;

TrainFn class_trainable_loop(tune::TrainableFactory factory, int checkpoint_frequency,
                             bool checkpoint_at_end) {
  return [factory = std::move(factory), checkpoint_frequency,
          checkpoint_at_end](const nlohmann::json& config) {
    std::unique_ptr<tune::Trainable> t = factory();
    if (!t) throw Error(ErrorCode::kInvalidArgument, "the trainable factory returned null");
    t->setup(config);
    int iteration = 0;
    if (auto c = train::get_checkpoint()) {
      LocalDirectory dir = c->as_directory();
      t->load_checkpoint(dir.path().string());
      iteration = iteration_of(*c);
    }
    while (true) {
      nlohmann::json result = t->step();
      ++iteration;
      if (!result.is_object()) {
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("Trainable::step() must return a JSON object, got {} "
                                "(iteration {})",
                                result.type_name(), iteration));
      }
      const bool done = result.value("done", false);
      bool save = result.value("should_checkpoint", false);
      result.erase("should_checkpoint");
      if (checkpoint_frequency > 0 && iteration % checkpoint_frequency == 0) save = true;
      if (done && checkpoint_at_end) save = true;
      if (save) {
        save_and_report(*t, &result, iteration);
      } else {
        train::report(result);
      }
      // The Tuner asked for a checkpoint after this result (a callback, a
      // pause, checkpoint_at_end for a trial it stops).
      if (train_internal::take_save_request() && !save) save_and_report(*t, nullptr, iteration);
      if (done) break;
      // PBT's exploit in place: the run's newest checkpoint is now the
      // source's copy and the config the perturbed one. A trainable whose
      // reset_config() declines is replaced by a fresh one in this process.
      if (std::optional<nlohmann::json> reset = train_internal::take_reset_request()) {
        const nlohmann::json& new_config = reset->at("config");
        if (!t->reset_config(new_config)) {
          t->cleanup();
          t = factory();
          if (!t) throw Error(ErrorCode::kInvalidArgument, "the trainable factory returned null");
          t->setup(new_config);
        }
        const Checkpoint c = Checkpoint::from_directory(reset->at("checkpoint").get<std::string>());
        t->load_checkpoint(c.as_directory().path().string());
        iteration = iteration_of(c);
      }
    }
    t->cleanup();
  };
}

ForkedRunner fork_runner(const RunnerSpec& rs, const std::vector<std::string>& gpu_ids,
                         const std::string& trial_id) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    throw Error(ErrorCode::kIO,
                fmt::format("socketpair for trial {}: {}", trial_id, std::strerror(errno)));
  }
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(sv[0]);
    ::close(sv[1]);
    throw Error(ErrorCode::kIO, fmt::format("fork for trial {}: {}", trial_id, std::strerror(err)));
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    if (runner_started_hook != nullptr) runner_started_hook();
    if (!gpu_ids.empty()) {
      ::setenv("CUDA_VISIBLE_DEVICES", fmt::format("{}", fmt::join(gpu_ids, ",")).c_str(), 1);
    }
    if (sv[1] != 3) ::dup2(sv[1], 3);
    ::close_range(4, ~0u, 0);
    ::_exit(run_trial(rs, 3));
  }
  ::close(sv[1]);
  return {pid, UniqueFd(sv[0])};
}

int run_trial(const RunnerSpec& rs, int fd) {
  train_internal::Channel channel(UniqueFd(fd), "the tuner");
  // Who this process runs, for the trial's code (Python's get_context():
  // get_trial_id(), get_trial_name(), get_experiment_name()); its workers
  // are forks and inherit it.
  ::setenv("CAIRN_TRIAL_ID", rs.run.name.c_str(), 1);
  ::setenv("CAIRN_TUNE_EXPERIMENT", rs.run.storage_path.c_str(), 1);
  // Ray's trial resources: the CPUs asked for (else one per worker) and
  // the GPUs.
  const double cpus = rs.resources.cpu > 0 ? rs.resources.cpu : rs.num_workers;
  ::setenv("CAIRN_TRIAL_RESOURCES",
           nlohmann::json{{"CPU", cpus}, {"GPU", rs.resources.gpu}}.dump().c_str(), 1);
  try {
    train_internal::DriverSpec spec;
    spec.train_fn = rs.train_fn;
    spec.train_loop_config = rs.config;
    spec.world_size = rs.num_workers;
    spec.run = rs.run;
    spec.run.resume_existing = true;
    spec.experiment_uri = rs.trial_uri;
    spec.experiment_path = rs.trial_path;
    spec.sweep_scratch = false;
    spec.iteration_from_checkpoint = true;
    spec.restoring = open_storage(rs.trial_uri)->exists(experiment::kTrainerStateKey);
    spec.on_round = [&channel](const train_internal::RoundInfo& info) {
      const nlohmann::json reply =
          ask_the_tuner(channel, {{"t", "round"},
                                  {"row", info.row},
                                  {"checkpoint", info.checkpoint ? nlohmann::json(*info.checkpoint)
                                                                 : nlohmann::json(nullptr)},
                                  {"kept", info.kept}});
      train_internal::RoundDirective d;
      d.save = reply.value("save", false);
      d.stop = reply.value("stop", false);
      d.ends_run = reply.value("end", false);
      if (reply.contains("reset") && reply["reset"].is_object()) d.reset = reply["reset"];
      return d;
    };
    spec.before_retention = [&channel](const std::vector<std::string>& doomed,
                                       const std::vector<std::string>& kept) {
      const nlohmann::json reply =
          ask_the_tuner(channel, {{"t", "retire"}, {"doomed", doomed}, {"kept", kept}});
      return reply.value("defer", std::vector<std::string>());
    };
    train_internal::DriverSpec::Outcome outcome;
    spec.outcome = &outcome;
    // After a driver crash the runner of the previous driver may still be
    // dying with the trial's lock (or its S3 lease not yet expired).
    const Result r = retry_while_locked(
        [&] { return train_internal::run_driver(spec, train_internal::start_local_group); });
    channel.send({{"t", "end"},
                  {"status", outcome.status},
                  {"error", r.error ? nlohmann::json(*r.error) : nlohmann::json(nullptr)},
                  {"failures", outcome.failures}});
    return 0;
  } catch (const std::exception& e) {
    try {
      channel.send({{"t", "end"}, {"status", "errored"}, {"error", e.what()}, {"failures", 0}});
    } catch (const Error&) {
      // ignore-error: the tuner is gone; it counts this runner's exit as a failure
    }
    return 1;
  }
}

}  // namespace cairn::tune_internal
