// Trials on the hosts of a launch (trial_hosts.h).
#include "tune/trial_hosts.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <climits>
#include <map>
#include <numeric>
#include <thread>

#include <fmt/format.h>

#include "cairn/error.h"
#include "cairn/storage.h"
#include "cairn/tune_schedulers.h"
#include "train/control/channel.h"
#include "train/control/net.h"
#include "train/control/sigterm.h"
#include "train/mpi_messages.h"
#include "tune/gpu_pool.h"
#include "util/log.h"
#include "util/settings.h"

namespace cairn::tune::tuner_internal {

using train_internal::Agent;
using train_internal::Channel;
using train_internal::type_of;

PlaceOffer own_offer(const TuneConfig& tune) {
  PlaceOffer o;
  o.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  o.gpu_ids =
      tune.gpu_ids.empty()
          ? GpuPool::visible_devices(Settings::from(Environment::process()).cuda_visible_devices)
          : tune.gpu_ids;
  return o;
}

int default_slots(int cores, double cpu_per_trial, int num_workers) {
  const double per_trial =
      cpu_per_trial > 0 ? cpu_per_trial : static_cast<double>(std::max(1, num_workers));
  return std::max(1, static_cast<int>(static_cast<double>(std::max(1, cores)) / per_trial));
}

std::vector<PlaceOffer> share_hosts(const std::vector<std::string>& hosts,
                                    std::vector<PlaceOffer> offers) {
  std::map<std::string, int> count;
  for (const std::string& h : hosts) ++count[h];
  std::map<std::string, int> seen;
  for (std::size_t i = 0; i < offers.size(); ++i) {
    const int m = count[hosts.at(i)];
    const int k = seen[hosts.at(i)]++;
    if (m == 1) continue;
    PlaceOffer& o = offers[i];
    o.cores = std::max(1, o.cores / m);
    std::vector<std::string> mine;
    for (std::size_t j = static_cast<std::size_t>(k); j < o.gpu_ids.size();
         j += static_cast<std::size_t>(m)) {
      mine.push_back(o.gpu_ids[j]);
    }
    o.gpu_ids = std::move(mine);
  }
  return offers;
}

std::vector<std::size_t> placement_order(std::span<const int> running, std::span<const int> limit,
                                         const std::vector<bool>& gone) {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < running.size(); ++i) {
    if (!gone.at(i) && running[i] < limit[i]) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return running[a] < running[b]; });
  return order;
}

nlohmann::json runner_to_json(const tune_internal::RunnerSpec& rs,
                              const std::vector<std::string>& gpu_ids) {
  const FailureConfig& f = rs.run.failure_config;
  return {{"config", rs.config},
          {"num_workers", rs.num_workers},
          {"name", rs.run.name},
          {"storage_path", rs.run.storage_path},
          {"max_failures", f.max_failures},
          {"report_timeout_s", f.report_timeout_s},
          {"preemption_grace_s", f.preemption_grace_s},
          {"checkpoint_config", rs.run.checkpoint_config.to_json()},
          {"trial_uri", rs.trial_uri},
          {"trial_path", rs.trial_path},
          {"resources", {{"cpu", rs.resources.cpu}, {"gpu", rs.resources.gpu}}},
          {"gpu_ids", gpu_ids}};
}

tune_internal::RunnerSpec runner_from_json(const nlohmann::json& j,
                                           const tune_internal::RunnerSpec& local,
                                           std::vector<std::string>& gpu_ids) {
  tune_internal::RunnerSpec rs = local;
  rs.config = j.at("config");
  rs.num_workers = j.at("num_workers").get<int>();
  rs.run.name = j.at("name").get<std::string>();
  rs.run.storage_path = j.at("storage_path").get<std::string>();
  rs.run.failure_config.max_failures = j.at("max_failures").get<int>();
  rs.run.failure_config.report_timeout_s = j.at("report_timeout_s").get<double>();
  rs.run.failure_config.preemption_grace_s = j.at("preemption_grace_s").get<double>();
  rs.run.checkpoint_config = CheckpointConfig::from_json(j.at("checkpoint_config"));
  // The Tuner decides when a trial checkpoints (Experiment::start).
  rs.run.checkpoint_config.checkpoint_frequency = 0;
  rs.run.checkpoint_config.checkpoint_at_end = false;
  rs.trial_uri = j.at("trial_uri").get<std::string>();
  rs.trial_path = j.at("trial_path").get<std::string>();
  rs.resources.cpu = j.at("resources").at("cpu").get<double>();
  rs.resources.gpu = j.at("resources").at("gpu").get<double>();
  gpu_ids = j.at("gpu_ids").get<std::vector<std::string>>();
  return rs;
}

nlohmann::json grid_to_json(const ResultGrid& grid) {
  nlohmann::json trials = nlohmann::json::array();
  for (const TrialResult& r : grid) {
    trials.push_back({{"result", train_internal::result_to_json(r)},
                      {"trial_id", r.trial_id},
                      {"config", r.config},
                      {"status", std::string(to_string(r.status))}});
  }
  const ExperimentStats& s = grid.stats();
  return {{"trials", trials},
          {"metric", grid.metric()},
          {"mode", grid.mode()},
          {"path", grid.experiment_path()},
          {"preempted", grid.preempted()},
          {"stats",
           {{"wall_seconds", s.wall_seconds},
            {"state_saves", s.state_saves},
            {"state_save_seconds", s.state_save_seconds},
            {"last_state_save_seconds", s.last_state_save_seconds},
            {"last_state_bytes", s.last_state_bytes},
            {"trial_starts", s.trial_starts},
            {"trial_start_seconds", s.trial_start_seconds},
            {"trial_starts_timed", s.trial_starts_timed},
            {"results", s.results}}}};
}

ResultGrid grid_from_json(const nlohmann::json& j) {
  std::vector<TrialResult> trials;
  for (const nlohmann::json& t : j.at("trials")) {
    TrialResult r;
    static_cast<Result&>(r) = train_internal::result_from_json(t.at("result"));
    r.trial_id = t.at("trial_id").get<std::string>();
    r.config = t.at("config");
    r.status = trial_status_from_string(t.at("status").get<std::string>());
    trials.push_back(std::move(r));
  }
  ResultGrid grid(std::move(trials), j.at("metric").get<std::string>(),
                  j.at("mode").get<std::string>(), j.at("path").get<std::string>());
  const nlohmann::json& s = j.at("stats");
  ExperimentStats stats;
  stats.wall_seconds = s.at("wall_seconds").get<double>();
  stats.state_saves = s.at("state_saves").get<std::size_t>();
  stats.state_save_seconds = s.at("state_save_seconds").get<double>();
  stats.last_state_save_seconds = s.at("last_state_save_seconds").get<double>();
  stats.last_state_bytes = s.at("last_state_bytes").get<std::size_t>();
  stats.trial_starts = s.at("trial_starts").get<std::size_t>();
  stats.trial_start_seconds = s.at("trial_start_seconds").get<double>();
  stats.trial_starts_timed = s.at("trial_starts_timed").get<std::size_t>();
  stats.results = s.at("results").get<std::size_t>();
  grid.set_stats(stats);
  grid.set_preempted(j.value("preempted", false));
  return grid;
}

// ------------------------------------------------------------- driver side

TrialHosts::TrialHosts(train_internal::JobBoot& boot, const std::string& experiment_uri,
                       const std::string& experiment_path)
    : boot_(boot) {
  probe_.experiment_uri = experiment_uri;
  probe_.experiment_path = experiment_path;
  agents_ = train_internal::accept_agents(*boot.listener, boot.world, boot.token, boot.where,
                                          /*min_workers=*/0);
  try {
    offers_.resize(agents_.size());
    std::vector<std::size_t> all(agents_.size());
    std::iota(all.begin(), all.end(), std::size_t{0});
    take_offers(all);
    train_internal::probe_storage(agents_, boot.world, probe_, boot.token);
    for (std::size_t i = 0; i < agents_.size(); ++i) {
      log::info(fmt::format("Tuner: {} offers {} core(s) and {} GPU(s) for trials", name(i),
                            offers_[i].cores, offers_[i].gpu_ids.size()));
    }
  } catch (const Error& e) {
    end({{"t", "end"}, {"error", train_internal::error_to_json(e.code(), e.what())}});
    throw;
  }
}

void TrialHosts::take_offers(const std::vector<std::size_t>& which) {
  for (std::size_t i : which) agents_.at(i).send({{"t", "describe"}});
  for (std::size_t i : which) {
    // One at a time keeps the indices plain; each answers at once.
    std::vector<nlohmann::json> offer =
        train_internal::collect({&agents_.at(i), 1}, "offer", train_internal::kProbeLimit);
    if (!offer[0].is_object()) {
      throw Error(ErrorCode::kUnavailable,
                  fmt::format("{} did not offer its cores and GPUs for trials", name(i)));
    }
    PlaceOffer o;
    try {
      o.cores = std::max(1, offer[0].at("cores").get<int>());
      o.gpu_ids = offer[0].at("gpus").get<std::vector<std::string>>();
    } catch (const nlohmann::json::exception& e) {
      throw train_internal::malformed(name(i), e);
    }
    offers_.at(i) = std::move(o);
  }
}

std::vector<std::size_t> TrialHosts::admit_returning() {
  std::vector<bool> was_gone;
  for (const Agent& a : agents_) was_gone.push_back(a.gone);
  train_internal::admit_returning(*boot_.listener, boot_.world, boot_.token, agents_, &probe_,
                                  "it runs trials again once it has offered its cores and GPUs");
  std::vector<std::size_t> back;
  for (std::size_t i = 0; i < agents_.size(); ++i) {
    if (!was_gone[i] || agents_[i].gone) continue;
    try {
      take_offers({i});
    } catch (const Error& e) {
      // ignore-error: it stays out, as a host that did not come back
      log::warn(fmt::format("Tuner: {}: {}", name(i), e.what()));
      agents_[i].gone = true;
      agents_[i].channel.close();
      continue;
    }
    log::info(fmt::format("Tuner: {} is back and offers {} core(s) and {} GPU(s) for trials",
                          name(i), offers_[i].cores, offers_[i].gpu_ids.size()));
    if (i < lost_told_.size()) lost_told_[i] = false;
    back.push_back(i);
  }
  return back;
}

void refuse_hosts(train_internal::JobBoot& boot, const Error& e) {
  try {
    std::vector<Agent> agents =
        train_internal::accept_agents(*boot.listener, boot.world, boot.token, boot.where, 0);
    for (Agent& a : agents) {
      a.send({{"t", "end"}, {"error", train_internal::error_to_json(e.code(), e.what())}});
    }
  } catch (const Error& also) {
    // ignore-error: `e` is what the caller throws; the hosts that did not
    // connect end when they cannot reach the driver
    log::warn(
        fmt::format("Tuner: could not tell every host why the experiment ends: {}", also.what()));
  }
}

TrialHosts::~TrialHosts() {
  end({{"t", "end"},
       {"error", train_internal::error_to_json(ErrorCode::kInternal,
                                               "the Tuner's driver ended without a result")}});
}

void TrialHosts::start(std::size_t i, const std::string& trial, const nlohmann::json& spec) {
  agents_.at(i).send({{"t", "start"}, {"trial", trial}, {"spec", spec}});
}

void TrialHosts::send(std::size_t i, const std::string& trial, const nlohmann::json& message) {
  agents_.at(i).send({{"t", "to"}, {"trial", trial}, {"m", message}});
}

void TrialHosts::kill(std::size_t i, const std::string& trial) {
  agents_.at(i).send({{"t", "kill"}, {"trial", trial}});
}

std::vector<int> TrialHosts::fds() const {
  std::vector<int> fds;
  for (const Agent& a : agents_) {
    if (!a.gone && a.channel.open()) fds.push_back(a.channel.fd());
  }
  return fds;
}

std::vector<TrialHosts::Event> TrialHosts::read() {
  std::vector<Event> events;
  lost_told_.resize(agents_.size(), false);
  for (std::size_t i = 0; i < agents_.size(); ++i) {
    Agent& a = agents_[i];
    if (lost_told_[i]) continue;
    // A host a send() found gone (Agent::send) is lost too, readable or not.
    std::vector<nlohmann::json> messages;
    std::string broken;
    bool open = a.read(messages, broken);
    try {
      for (const nlohmann::json& m : messages) {
        const std::string t = type_of(m);
        Event e;
        e.host = i;
        if (t == "from") {
          e.type = Event::kMessage;
          e.trial = m.at("trial").get<std::string>();
          e.message = m.at("m");
        } else if (t == "exited") {
          e.type = Event::kExited;
          e.trial = m.at("trial").get<std::string>();
          e.wait_status = m.at("status").get<int>();
        } else if (t == "preempted") {
          e.type = Event::kPreempted;
        } else {
          continue;
        }
        events.push_back(std::move(e));
      }
    } catch (const nlohmann::json::exception& e) {
      open = false;  // a host that sends nonsense is treated as lost, naming it
      broken = train_internal::malformed(a.name(), e).what();
    }
    if (!open) {
      a.gone = true;
      a.channel.close();
      lost_told_[i] = true;
      Event e;
      e.type = Event::kLost;
      e.host = i;
      e.why = broken.empty() ? "it closed its connection to the driver" : broken;
      events.push_back(std::move(e));
    }
  }
  return events;
}

void TrialHosts::end(const nlohmann::json& message) {
  if (ended_) return;
  ended_ = true;
  for (Agent& a : agents_) a.send(message);
}

// --------------------------------------------------------------- host side

namespace {

class TrialHost {
 public:
  TrialHost(const train_internal::JobBoot& boot, const TuneConfig& tune,
            const tune_internal::RunnerSpec& local, Channel driver,
            const train_internal::SigtermNotice& sigterm)
      : boot_(boot), tune_(tune), local_(local), driver_(std::move(driver)), sigterm_(sigterm) {}

  ~TrialHost() { kill_all(); }

  ResultGrid run() {
    while (true) {
      std::vector<pollfd> fds{{driver_.fd(), POLLIN, 0}};
      for (const auto& [id, r] : runners_) fds.push_back({r.channel.fd(), POLLIN, 0});
      // A runner's exit is seen within 100 ms (its channel may stay open in
      // its workers for a moment).
      ::poll(fds.data(), fds.size(), 100);  // ignore-error: EINTR just means look again
      tell_preemption();
      relay_runners();
      std::vector<nlohmann::json> messages;
      const bool open = driver_.read_available(messages);
      for (const nlohmann::json& m : messages) {
        try {
          if (std::optional<ResultGrid> grid = handle(m)) return std::move(*grid);
        } catch (const nlohmann::json::exception& e) {
          throw train_internal::malformed(driver_.peer(), e);
        }
      }
      if (!open) {
        throw Error(ErrorCode::kUnavailable,
                    fmt::format("{}: lost the connection to the Tuner's driver ({} 0 on host "
                                "{}); its process ended or its node failed",
                                self(), boot_.world.label, boot_.world.hosts.at(0)));
      }
    }
  }

 private:
  struct Runner {
    pid_t pid = -1;
    Channel channel;
  };

  // SIGTERM to this process alone (its node is being preempted; the driver
  // acts on its own SIGTERM, if it gets one, as the whole launch's): the
  // driver is told once, and pauses and moves this host's trials.
  void tell_preemption() {
    if (preemption_told_ || !sigterm_.received()) return;
    preemption_told_ = true;
    log::warn(
        fmt::format("{}: SIGTERM; the Tuner's driver moves this host's trials elsewhere", self()));
    driver_.send({{"t", "preempted"}});
  }

  std::string self() const {
    return fmt::format("{} {} on host {}", boot_.world.label, boot_.world.rank,
                       boot_.world.hosts.at(static_cast<std::size_t>(boot_.world.rank)));
  }

  std::optional<ResultGrid> handle(const nlohmann::json& m) {
    const std::string t = type_of(m);
    if (t == "describe") {
      const PlaceOffer mine = own_offer(tune_);
      driver_.send({{"t", "offer"}, {"cores", mine.cores}, {"gpus", mine.gpu_ids}});
    } else if (t == "probe") {
      driver_.send(train_internal::answer_probe(m));
    } else if (t == "start") {
      start(m.at("trial").get<std::string>(), m.at("spec"));
    } else if (t == "to") {
      auto it = runners_.find(m.at("trial").get<std::string>());
      if (it == runners_.end()) return std::nullopt;  // it exited meanwhile
      try {
        it->second.channel.send(m.at("m"));
      } catch (const Error&) {
        // ignore-error: the runner died; its exit is reported by relay_runners
      }
    } else if (t == "kill") {
      auto it = runners_.find(m.at("trial").get<std::string>());
      if (it != runners_.end()) ::kill(it->second.pid, SIGKILL);
    } else if (t == "end") {
      kill_all();
      if (m.contains("error") && m.value("refused", false)) {
        throw train_internal::error_from_json(m["error"],
                                              "the driver did not take this process in: ");
      }
      if (m.contains("error")) {
        throw train_internal::error_from_json(m["error"], "the Tuner's driver failed: ");
      }
      return grid_from_json(m.at("grid"));
    }
    return std::nullopt;
  }

  void start(const std::string& trial, const nlohmann::json& spec) {
    std::vector<std::string> gpu_ids;
    const tune_internal::RunnerSpec rs = runner_from_json(spec, local_, gpu_ids);
    try {
      tune_internal::ForkedRunner r = tune_internal::fork_runner(rs, gpu_ids, trial);
      runners_[trial] = Runner{r.pid, Channel(std::move(r.channel), "trial " + trial)};
      log::info(fmt::format("{}: trial {} started here", self(), trial));
    } catch (const Error& e) {
      log::warn(fmt::format("{}: trial {} could not start: {}", self(), trial, e.what()));
      // As a runner that died at once: the driver counts a failure.
      driver_.send({{"t", "exited"}, {"trial", trial}, {"status", 1 << 8}});
    }
  }

  // Relays what every runner sent, then reports the runners that exited.
  void relay_runners() {
    for (auto it = runners_.begin(); it != runners_.end();) {
      Runner& r = it->second;
      std::vector<nlohmann::json> messages;
      try {
        if (r.channel.open() && !r.channel.read_available(messages)) r.channel.close();
      } catch (const Error& e) {
        log::warn(fmt::format("{}: trial {}: {}", self(), it->first, e.what()));
        r.channel.close();
      }
      for (nlohmann::json& m : messages) {
        driver_.send({{"t", "from"}, {"trial", it->first}, {"m", std::move(m)}});
      }
      int status = 0;
      const pid_t done = ::waitpid(r.pid, &status, WNOHANG);
      if (done != r.pid) {
        ++it;
        continue;
      }
      // Messages sent before the exit are still in the socket.
      if (r.channel.open()) {
        messages.clear();
        try {
          r.channel.read_available(messages);
        } catch (const Error&) {
          // ignore-error: the exit below tells the driver what it needs
        }
        for (nlohmann::json& m : messages) {
          driver_.send({{"t", "from"}, {"trial", it->first}, {"m", std::move(m)}});
        }
      }
      driver_.send({{"t", "exited"}, {"trial", it->first}, {"status", status}});
      it = runners_.erase(it);
    }
  }

  void kill_all() {
    for (auto& [id, r] : runners_) {
      ::kill(r.pid, SIGKILL);
      int status = 0;
      ::waitpid(r.pid, &status, 0);
    }
    runners_.clear();
  }

  const train_internal::JobBoot& boot_;
  const TuneConfig& tune_;
  const tune_internal::RunnerSpec& local_;
  Channel driver_;
  const train_internal::SigtermNotice& sigterm_;
  bool preemption_told_ = false;
  std::map<std::string, Runner> runners_;
};

}  // namespace

ResultGrid serve_trials(const train_internal::JobBoot& boot, const TuneConfig& tune,
                        const tune_internal::RunnerSpec& local) {
  const train_internal::MpiWorld& w = boot.world;
  const std::string& host = w.hosts.at(static_cast<std::size_t>(w.rank));
  Channel driver(
      train_internal::tcp_connect(boot.addresses, boot.port, train_internal::kConnectLimit),
      fmt::format("the Tuner's driver ({} 0 on host {})", w.label, w.hosts.at(0)));
  driver.send({{"t", "hello"}, {"rank", w.rank}, {"token", boot.token}, {"host", host}});
  log::info(
      fmt::format("{} {} on host {}: runs trials for the Tuner's driver", w.label, w.rank, host));
  // SIGTERM here (a scheduler signals every task of the job, or this node
  // alone) is the driver's to act on: this process tells it and stays to
  // relay its runners' last checkpoints and the end.
  train_internal::SigtermNotice sigterm;
  TrialHost loop(boot, tune, local, std::move(driver), sigterm);
  return loop.run();
}

}  // namespace cairn::tune::tuner_internal
