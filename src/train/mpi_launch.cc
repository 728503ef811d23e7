// fit() under MPI: the bootstrap, the driver's MpiGroup and the agents
// (design at the top of mpi.h).
//
// Driver <-> agent protocol, over one TCP connection per agent, framed like
// every other channel (channel.h):
//
//   agent  -> driver  {"t":"hello","rank":r,"token":T,"host":h}
//   driver -> agent   {"t":"probe","uri":U,"key":K}
//   agent  -> driver  {"t":"probe_result","seen":bool,"why":"..."}
//   driver -> agent   {"t":"launch","context":{...},"checkpoint_uri":U|null,
//                      "train_loop_config":{...}}
//   agent  -> driver  {"t":"worker","message":M}     a message of the worker's
//   driver -> agent   {"t":"to_worker","message":M}  a message for the worker
//   agent  -> driver  {"t":"exit","clean":b,"cause":"...","stderr_tail":"..."}
//   driver -> agent   {"t":"stop"}  ->  agent {"t":"stopped","stderr_tail":"..."}
//   driver -> agent   {"t":"end","result":{...}} | {"t":"end","error":{...}}
//                     | {"t":"end","refused":true,"error":{...}}  (a process
//                     started again for a lost rank that failed the probe)
//
// The worker's own messages (worker.cc) pass through unchanged (except that
// an agent that received SIGTERM marks its worker's reports "preempted"), so the
// driver's loop (driver.cc) is the same for both launchers. An attempt ends
// with "stop", and the driver reads up to the agent's "stopped", so nothing
// of one attempt is mistaken for the next. The token, sent only through MPI,
// keeps a stray connection from being taken for an agent.
#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cairn/error.h"
#include "cairn/storage.h"
#include "experiment/location.h"
#include "manager/layout.h"
#include "train/control/channel.h"
#include "train/control/group.h"
#include "train/control/net.h"
#include "train/control/scratch.h"
#include "train/control/sigterm.h"
#include "train/env_launch.h"
#include "train/host_tier.h"
#include "train/job_boot.h"
#include "train/mpi.h"
#include "train/mpi_agents.h"
#include "train/mpi_bootstrap.h"
#include "train/mpi_messages.h"
#include "train/mpi_peer.h"
#include "train/peer_tier.h"
#include "util/fs.h"
#include "util/json.h"
#include "util/log.h"
#include "util/settings.h"

namespace cairn::train_internal {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// ---------------------------------------------------------------- driver side

// The driver's view of one attempt: world rank 0 is forked here, world rank
// r > 0 by members[r - 1] (every agent, or for an elastic group the agents
// still there, renumbered in the order of their launcher ranks).
class MpiGroup final : public Group {
 public:
  MpiGroup(const LaunchSpec& spec, std::vector<Agent>& agents, std::vector<Agent*> members,
           const std::vector<TrainContext>& places, PeerTier* tier)
      : tier_(tier),
        agents_(agents),
        members_(std::move(members)),
        exited_(places.size(), false),
        tails_(places.size()),
        attempt_(spec.context.attempt) {
    for (size_t i = 0; i < members_.size(); ++i) {
      const Agent& a = *members_[i];
      if (a.gone) {
        throw Error(ErrorCode::kUnavailable,
                    fmt::format("{} is gone, so the group cannot start (attempt {}); the job "
                                "must be restarted (or let the group go on without it: "
                                "ScalingConfig::min_workers)",
                                a.name(), attempt_ + 1));
      }
      world_rank_[&a] = static_cast<int>(i) + 1;
    }
    local_ = start_local_ranks(spec, {place(spec, places[0])});
    // One epoll set for every member's connection and the local group: a
    // poll costs what happened, not a read of every agent (at 1,024 ranks
    // that was 1,023 recv() calls per wake-up, O(N^2) per round).
    if (!epoll_) throw errno_error(errno, "epoll_create1", "the agents' connections");
    for (int fd : local_->wait_fds()) watch(fd, kLocalGroup);
    for (size_t i = 0; i < members_.size(); ++i) {
      if (members_[i]->channel.open()) watch(members_[i]->channel.fd(), i);
    }
    for (size_t i = 0; i < members_.size(); ++i) {
      members_[i]->send(
          {{"t", "launch"},
           {"context", context_to_json(place(spec, places.at(i + 1)))},
           {"checkpoint_uri",
            spec.checkpoint_uri ? nlohmann::json(*spec.checkpoint_uri) : nlohmann::json()},
           {"train_loop_config", spec.train_loop_config}});
    }
  }
  ~MpiGroup() override { stop(); }

  std::vector<GroupEvent> poll(int timeout_ms) override {
    ready_.resize(members_.size() + 8);
    // Messages kept while the memory tier waited for an answer (collect_kept)
    // are already read: no waiting for them.
    const bool kept = std::any_of(members_.begin(), members_.end(),
                                  [](const Agent* a) { return !a->backlog.empty(); });
    // ignore-error: EINTR (-1) just means look again
    const int n = ::epoll_wait(epoll_.get(), ready_.data(), static_cast<int>(ready_.size()),
                               kept    ? 0
                               : tier_ ? std::min(timeout_ms, 100)
                                       : timeout_ms);
    std::vector<GroupEvent> events = local_->poll(0);
    std::set<const Agent*> read;
    for (int k = 0; k < n; ++k) {
      const uint64_t who = ready_[static_cast<size_t>(k)].data.u64;
      if (who != kLocalGroup) {
        read_agent(*members_.at(who), events);
        read.insert(members_.at(who));
      }
    }
    // An agent a send() found gone (Agent::send) is lost even if its
    // connection never became readable; kept messages are read too.
    for (Agent* a : members_) {
      if (read.count(a)) continue;
      if ((a->gone && !exited_[world_rank_.at(a)]) || !a->backlog.empty()) read_agent(*a, events);
    }
    if (tier_) tier_->progress();
    return events;
  }

  void send(int rank, const nlohmann::json& message) override {
    if (rank == 0) {
      local_->send(0, message);
      return;
    }
    members_.at(static_cast<size_t>(rank - 1))->send({{"t", "to_worker"}, {"message", message}});
  }

  void stop() override {
    if (stopped_) return;
    stopped_ = true;
    local_->stop();
    for (Agent* a : members_) a->send({{"t", "stop"}});
    // Agents outside this attempt are gone; collect() skips them.
    std::vector<nlohmann::json> replies = collect(agents_, "stopped", kStopLimit);
    for (size_t i = 0; i < agents_.size(); ++i) {
      const auto it = replies[i].is_object() ? replies[i].find("stderr_tail") : replies[i].end();
      const auto member = world_rank_.find(&agents_[i]);
      if (member != world_rank_.end() && it != replies[i].end() && it->is_string() &&
          !it->empty()) {
        tails_[member->second] = it->get<std::string>();
      }
    }
  }

  void wait_all(int timeout_ms) override {
    const auto deadline = Clock::now() + milliseconds(timeout_ms);
    auto all_exited = [&] {
      for (const Agent* a : members_) {
        if (!exited_[world_rank_.at(a)] && !a->gone) return false;
      }
      return true;
    };
    while (!all_exited() && remaining_ms(deadline) > 0) {
      poll(std::min(50, remaining_ms(deadline)));  // events after the end are not needed
    }
    local_->wait_all(remaining_ms(deadline));
    stop();
  }

  std::string stderr_tail(int rank) const override {
    return rank == 0 ? local_->stderr_tail(0) : tails_.at(rank);
  }

  // The epoll set: readable when an agent's connection or the local group is.
  std::vector<int> wait_fds() const override { return {epoll_.get()}; }

 private:
  static constexpr uint64_t kLocalGroup = ~uint64_t{0};  // epoll data of the local group's fds

  // Adds `fd` to the epoll set; `who` is the member's index or kLocalGroup.
  void watch(int fd, uint64_t who) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = who;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      throw errno_error(errno, "epoll_ctl", "the agents' connections");
    }
  }

  static TrainContext place(const LaunchSpec& spec, const TrainContext& where) {
    TrainContext c = spec.context;
    c.world_rank = where.world_rank;
    c.world_size = where.world_size;
    c.local_rank = where.local_rank;
    c.local_world_size = where.local_world_size;
    c.node_rank = where.node_rank;
    return c;
  }

  void read_agent(Agent& a, std::vector<GroupEvent>& events) {
    const int rank = world_rank_.at(&a);
    std::vector<nlohmann::json> messages;
    std::string broken;
    bool open = a.read(messages, broken);
    try {
      for (auto& m : messages) read_agent_message(a, rank, m, events);
    } catch (const nlohmann::json::exception& e) {
      open = false;  // an agent that sends nonsense is treated as lost, naming it
      broken = malformed(a.name(), e).what();
    }
    if (!open) {
      a.gone = true;
      if (a.channel.open()) {
        // ignore-error: closing the descriptor removes it from the set anyway
        (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, a.channel.fd(), nullptr);
      }
      a.channel.close();
      if (!exited_[rank]) {
        exited_[rank] = true;
        GroupEvent e;
        e.type = GroupEvent::kExit;
        e.rank = rank;
        e.cause = fmt::format("lost: its process ({}) closed the connection to the driver{}",
                              a.name(), broken.empty() ? "" : ": " + broken);
        events.push_back(std::move(e));
      }
    }
  }

  // One message of the agent serving world rank `rank`; nlohmann's
  // exceptions for a field of the wrong type reach read_agent, which treats
  // the agent as lost.
  void read_agent_message(const Agent& a, int rank, const nlohmann::json& m,
                          std::vector<GroupEvent>& events) {
    const std::string t = type_of(m);
    if (t.rfind("tier_", 0) == 0) {
      if (tier_) tier_->on_message(a, m);
      return;
    }
    if (exited_[rank]) return;
    if (t == "worker") {
      GroupEvent e;
      e.rank = rank;
      e.message = m.value("message", nlohmann::json::object());
      events.push_back(std::move(e));
    } else if (t == "exit") {
      GroupEvent e;
      e.type = GroupEvent::kExit;
      e.rank = rank;
      e.clean = m.value("clean", false);
      e.cause = fmt::format("{} on host {}", m.value("cause", std::string("exited")), a.host);
      tails_[rank] = m.value("stderr_tail", "");
      exited_[rank] = true;
      events.push_back(std::move(e));
    }
  }

  PeerTier* tier_;  // the memory tier across hosts, or null
  std::vector<Agent>& agents_;
  std::vector<Agent*> members_;
  std::map<const Agent*, int> world_rank_;  // members_' world ranks in this attempt
  std::unique_ptr<Group> local_;
  UniqueFd epoll_{::epoll_create1(EPOLL_CLOEXEC)};
  std::vector<epoll_event> ready_;
  std::vector<bool> exited_;
  std::vector<std::string> tails_;
  int attempt_ = 0;
  bool stopped_ = false;
};

Result drive(DriverSpec spec, const ScalingConfig& scaling, MpiWorld w, TcpListener& listener,
             const std::string& token, const std::string& where, const ControlAddress& control) {
  const bool elastic = scaling.min_workers > 0;
  std::vector<Agent> agents = accept_agents(listener, w, token, where, scaling.min_workers);
  std::unique_ptr<PeerTier> peer;  // the memory tier across hosts, if the run has one
  auto end_all = [&](const nlohmann::json& m) {
    // Processes started again for lost ranks after the last attempt learn the end too.
    if (elastic) admit_returning(listener, w, token, agents, nullptr);
    for (Agent& a : agents) a.send(m);
  };
  try {
    experiment::ExperimentLocation loc =
        experiment::locate_experiment(spec.run.storage_path, spec.run.name);
    spec.world_size = w.size;
    spec.run.name = loc.name;
    spec.run.storage_path = loc.storage_path;
    spec.experiment_uri = loc.uri;
    spec.experiment_path = loc.path;
    // Rank 0's rendezvous port lives where the agents reach this node.
    spec.rendezvous_bind = control.bind;
    spec.rendezvous_address = control.advertise.at(0);
    spec.before_start = [&] { probe_storage(agents, w, spec, token); };
    MemoryTierConfig& tier = spec.run.checkpoint_config.memory_tier;
    if (tier.enabled && std::any_of(w.hosts.begin(), w.hosts.end(),
                                    [&](const auto& h) { return h != w.hosts[0]; })) {
      if (w.label == "MPI rank" && !elastic && peer_transport_ready()) {
        // Each host keeps its ranks' files and a replica of the previous
        // host's (peer_tier.h).
        peer = std::make_unique<PeerTier>(agents, w.hosts, spec.experiment_uri, tier);
        if (spec.restoring) peer->prepare_launch();
        spec.tier_hosts = peer.get();
      } else {
        // Replicas move over MPI between a launch's fixed processes.
        log::warn(fmt::format(
            "{}: the ranks run on several hosts and the memory tier across hosts needs an MPI "
            "launch of fixed size (this one is {}), so checkpoints go to persistent storage only",
            spec.experiment_path,
            w.label != "MPI rank" ? "torchrun-style"
            : elastic             ? "elastic"
                                  : "without MPI"));
        tier.enabled = false;
      }
    }
    if (elastic) {
      spec.min_world_size = scaling.min_workers;
      spec.stored_num_workers = scaling.num_workers;
      spec.ranks_available = [&] {
        admit_returning(listener, w, token, agents, &spec);
        return 1 + static_cast<int>(std::count_if(agents.begin(), agents.end(),
                                                  [](const Agent& a) { return !a.gone; }));
      };
    }
    GroupFactory start = [&](const LaunchSpec& launch) -> std::unique_ptr<Group> {
      // Every agent (a gone one refuses the start), or an elastic group's live ones.
      std::vector<Agent*> members;
      std::vector<std::string> hosts{w.hosts.at(0)};
      for (Agent& a : agents) {
        if (elastic && a.gone) continue;
        members.push_back(&a);
        hosts.push_back(a.host);
      }
      return std::make_unique<MpiGroup>(launch, agents, std::move(members), plan_places(hosts),
                                        peer.get());
    };
    Result result = run_driver(spec, start);
    end_all({{"t", "end"}, {"result", result_to_json(result)}});
    return result;
  } catch (const Error& e) {
    end_all({{"t", "end"}, {"error", error_to_json(e.code(), e.what())}});
    throw;
  } catch (const std::exception& e) {
    end_all({{"t", "end"}, {"error", error_to_json(ErrorCode::kInternal, e.what())}});
    throw;
  }
}

// ----------------------------------------------------------------- agent side

// A pipe a thread writes a byte into to wake a poll() loop.
class WakeUp {
 public:
  WakeUp() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
      throw errno_error(errno, "pipe2", "an agent's wake-up pipe");
    }
    read_ = UniqueFd(fds[0]);
    write_ = UniqueFd(fds[1]);
  }
  int read_end() const { return read_.get(); }
  void notify() {
    const char c = 1;
    (void)!::write(write_.get(), &c, 1);  // ignore-error: full means a wake-up is pending
  }
  void drain() {
    char buf[64];
    while (::read(read_.get(), buf, sizeof buf) > 0) {
    }
  }

 private:
  UniqueFd read_;
  UniqueFd write_;
};

class AgentLoop {
 public:
  AgentLoop(const DriverSpec& spec, const MpiWorld& w, Channel driver)
      : spec_(spec), w_(w), driver_(std::move(driver)), layout_(layout_hosts(w.hosts)) {}
  ~AgentLoop() { join_persisting(); }

  Result run() {
    // SIGTERM to this process (Slurm signals the job step's tasks, which
    // are the agents) is a preemption notice, passed on with the worker's
    // next report.
    SigtermNotice sigterm;
    sigterm_ = &sigterm;
    // Ends when the driver says "end" or the connection to it closes.
    while (true) {
      std::vector<pollfd> fds{{driver_.fd(), POLLIN, 0}};
      if (group_) {
        for (int fd : group_->wait_fds()) fds.push_back({fd, POLLIN, 0});
      }
      if (persisting_.joinable()) fds.push_back({persisted_.read_end(), POLLIN, 0});
      ::poll(fds.data(), fds.size(), 1000);  // ignore-error: EINTR just means look again
      if (group_) relay_worker();
      send_persisted();
      std::vector<nlohmann::json> messages;
      const bool open = driver_.read_available(messages);
      for (const auto& m : messages) {
        if (std::optional<Result> r = handle(m)) return *r;
      }
      if (!open) {
        end_attempt();
        throw Error(ErrorCode::kUnavailable,
                    fmt::format("{} {} on host {}: lost the connection to the driver ({} 0 on "
                                "host {}); the driver process ended or its node failed",
                                w_.label, w_.rank, w_.hosts.at(w_.rank), w_.label, w_.hosts.at(0)));
      }
    }
  }

 private:
  void relay_worker() {
    for (GroupEvent& e : group_->poll(0)) {
      if (e.type == GroupEvent::kMessage) {
        if (sigterm_->received() && e.message.value("t", "") == "report") {
          e.message["preempted"] = true;
        }
        driver_.send({{"t", "worker"}, {"message", std::move(e.message)}});
      } else {
        driver_.send({{"t", "exit"},
                      {"clean", e.clean},
                      {"cause", e.cause},
                      {"stderr_tail", group_->stderr_tail(attempt_rank_)}});
      }
    }
  }

  std::optional<Result> handle(const nlohmann::json& m) {
    try {
      return handle_message(m);
    } catch (const nlohmann::json::exception& e) {
      end_attempt();
      throw malformed(driver_.peer(), e);
    }
  }

  std::optional<Result> handle_message(const nlohmann::json& m) {
    const std::string t = type_of(m);
    if (t == "launch") {
      end_attempt();
      launch(m);
    } else if (t == "to_worker") {
      if (group_) group_->send(attempt_rank_, m.at("message"));
    } else if (t == "stop") {
      end_attempt();
      driver_.send({{"t", "stopped"}, {"stderr_tail", tail_}});
    } else if (t == "probe") {
      driver_.send(answer_probe(m));
    } else if (t.rfind("tier_", 0) == 0) {
      tier_operation(m);
    } else if (t == "end") {
      end_attempt();
      join_persisting();
      if (m.contains("error") && m.value("refused", false)) {
        // A process started again that the driver did not take in.
        throw error_from_json(m["error"], "the driver did not take this process in: ");
      }
      if (m.contains("error"))
        throw error_from_json(m["error"], fmt::format("the driver ({} 0) failed: ", w_.label));
      return result_from_json(m.at("result"));
    }
    return std::nullopt;
  }

  void launch(const nlohmann::json& m) {
    LaunchSpec spec;
    spec.train_fn = spec_.train_fn;
    spec.train_loop_config = m.at("train_loop_config");
    spec.context = context_from_json(m.at("context"));
    attempt_rank_ = spec.context.world_rank;  // an elastic group renumbers its ranks
    if (m.at("checkpoint_uri").is_string()) spec.checkpoint_uri = m["checkpoint_uri"];
    try {
      scratch_ = std::make_unique<ScratchDir>(&scratch_remover_);
      spec.scratch_dir = scratch_->path().string();
      scratch_remover_.start();  // the last attempt's folder, in a child of its own
      group_ = start_local_ranks(spec, {spec.context});
    } catch (const Error& e) {
      scratch_.reset();
      driver_.send({{"t", "exit"},
                    {"clean", false},
                    {"cause", fmt::format("could not be started: {}", e.what())},
                    {"stderr_tail", ""}});
    }
  }

  // An operation of the memory tier across hosts for this host, whose
  // leader this process is (host_tier.h). Persisting runs on a thread, the
  // rest here: the operations that move files are collective over MPI with
  // the other hosts' leaders and the driver.
  void tier_operation(const nlohmann::json& op) {
    const int host = layout_.host_of.at(static_cast<size_t>(w_.rank));
    if (!tier_lock_) {
      // Held for the launch, as the driver's manager holds its host's: `cairn
      // gc --memory-tier` on this host leaves the tier alone meanwhile, and a
      // tier folder shared between hosts is refused instead of mixed.
      try {
        const std::string root = op.at("root").get<std::string>();
        std::error_code ec;
        std::filesystem::create_directories(root, ec);  // ignore-error: try_lock says why
        tier_lock_ = open_storage(root)->try_lock(manager_layout::kLockKey);
      } catch (const Error& e) {
        nlohmann::json answer = {{"error", fmt::format("host {}: the memory tier's folder must be "
                                                       "this host's own (RAM): {}",
                                                       layout_.names.at(host), e.what())}};
        answer["t"] = answer_to(type_of(op));
        if (op.contains("index")) answer["index"] = op["index"];
        if (answer["t"] == "") {
          log::warn(answer["error"].get<std::string>());  // an operation without an answer
        } else {
          driver_.send(answer);
        }
        return;
      }
    }
    if (type_of(op) == "tier_release") {
      join_persisting();
      tier_lock_.reset();
    }
    if (type_of(op) == "tier_persist") {
      join_persisting();
      persisting_ = std::thread([this, op, host] {
        nlohmann::json answer;
        try {
          answer = carry_out(op, layout_, host);
        } catch (const std::exception& e) {
          answer = {{"t", "tier_persisted"}, {"index", op.value("index", 0)}, {"error", e.what()}};
        }
        {
          std::lock_guard<std::mutex> g(persisted_mu_);
          persisted_answer_ = std::move(answer);
        }
        persisted_.notify();
      });
      return;
    }
    try {
      nlohmann::json answer = carry_out(op, layout_, host);
      if (!answer.is_null()) driver_.send(answer);
    } catch (const Error& e) {
      // ignore-error: the operations without an answer only tidy up; the
      // next inventory of the tier sees what they left
      log::warn(
          fmt::format("{} {} on host {}: {}", w_.label, w_.rank, w_.hosts.at(w_.rank), e.what()));
    }
  }

  // Sends a finished persistence's answer.
  void send_persisted() {
    nlohmann::json answer;
    {
      std::lock_guard<std::mutex> g(persisted_mu_);
      answer.swap(persisted_answer_);
    }
    if (answer.is_null()) return;
    persisted_.drain();
    join_persisting();
    driver_.send(answer);
  }

  void join_persisting() {
    if (persisting_.joinable()) persisting_.join();
  }

  void end_attempt() {
    if (group_) {
      group_->stop();
      tail_ = group_->stderr_tail(attempt_rank_);
      group_.reset();
    } else {
      tail_.clear();
    }
    scratch_.reset();
  }

  const DriverSpec& spec_;
  const MpiWorld& w_;
  Channel driver_;
  HostLayout layout_;
  std::unique_ptr<Lock> tier_lock_;  // this host's memory tier, while it serves the launch
  std::thread persisting_;           // a persistence of this host's files
  std::mutex persisted_mu_;
  nlohmann::json persisted_answer_;    // its answer, once it finished (persisted_mu_)
  WakeUp persisted_;                   // wakes the loop when it did
  BackgroundRemover scratch_remover_;  // outlives scratch_
  std::unique_ptr<Group> group_;
  std::unique_ptr<ScratchDir> scratch_;
  std::string tail_;
  int attempt_rank_ = 0;                    // the world rank of this attempt's worker
  const SigtermNotice* sigterm_ = nullptr;  // while run() runs
};

// An agent's whole part in a launch: connect to the driver, say hello, then
// serve its rank until the driver says "end".
Result run_agent(const DriverSpec& spec, const MpiWorld& w,
                 const std::vector<std::string>& addresses, int port, const std::string& token) {
  Channel driver(tcp_connect(addresses, port, kConnectLimit),
                 fmt::format("the driver ({} 0 on host {})", w.label, w.hosts.at(0)));
  driver.send({{"t", "hello"}, {"rank", w.rank}, {"token", token}, {"host", w.hosts.at(w.rank)}});
  log::info(fmt::format("{} {} on host {}: connected to the driver", w.label, w.rank,
                        w.hosts.at(w.rank)));
  for (const auto& p : sweep_dead_scratch_dirs()) {
    log::info(fmt::format("removed {}, the scratch folder of an agent that died", p.string()));
  }
  AgentLoop loop(spec, w, std::move(driver));
  return loop.run();
}

}  // namespace

Result fit_mpi(DriverSpec spec, const ScalingConfig& scaling) {
  JobBoot b = boot_mpi_job();
  launched_world_ranks(scaling, b.world.size);  // every process refuses a mismatch alike
  if (b.world.rank == 0) {
    return drive(std::move(spec), scaling, b.world, *b.listener, b.token, b.where, b.control);
  }
  return run_agent(spec, b.world, b.addresses, b.port, b.token);
}

Result fit_env(DriverSpec spec, const ScalingConfig& scaling, const EnvLaunch& launch) {
  launched_world_ranks(scaling, launch.world_size, launch.world_size_source);
  JobBoot b = boot_env_job(launch);
  if (b.world.rank == 0) {
    return drive(std::move(spec), scaling, std::move(b.world), *b.listener, b.token, b.where,
                 b.control);
  }
  return run_agent(spec, b.world, b.addresses, b.port, b.token);
}

}  // namespace cairn::train_internal
