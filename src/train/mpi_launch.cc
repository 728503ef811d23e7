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
//
// The worker's own messages (worker.cc) pass through unchanged (except that
// an agent that received SIGTERM marks its worker's reports "preempted"), so the
// driver's loop (driver.cc) is the same for both launchers. An attempt ends
// with "stop", and the driver reads up to the agent's "stopped", so nothing
// of one attempt is mistaken for the next. The token, sent only through MPI,
// keeps a stray connection from being taken for an agent.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cairn/error.h"
#include "cairn/storage.h"
#include "experiment/location.h"
#include "train/control/channel.h"
#include "train/control/group.h"
#include "train/control/net.h"
#include "train/control/scratch.h"
#include "train/control/sigterm.h"
#include "train/env_launch.h"
#include "train/mpi.h"
#include "train/mpi_bootstrap.h"
#include "util/fs.h"
#include "util/json.h"
#include "util/log.h"
#include "util/settings.h"

namespace cairn::train_internal {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How long the processes of a job may take to find each other, to answer the
// storage probe and to stop a worker. Generous: they bound failures, not work.
constexpr milliseconds kConnectLimit{120'000};
constexpr milliseconds kProbeLimit{120'000};
constexpr milliseconds kStopLimit{60'000};

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}

nlohmann::json context_to_json(const TrainContext& c) {
  return {{"world_rank", c.world_rank},
          {"world_size", c.world_size},
          {"local_rank", c.local_rank},
          {"local_world_size", c.local_world_size},
          {"node_rank", c.node_rank},
          {"experiment_name", c.experiment_name},
          {"storage_path", c.storage_path},
          {"experiment_path", c.experiment_path},
          {"attempt", c.attempt},
          {"rendezvous", {{"master_addr", c.master_addr}, {"master_port", c.master_port}}}};
}

TrainContext context_from_json(const nlohmann::json& j) {
  TrainContext c;
  c.world_rank = j.at("world_rank").get<int>();
  c.world_size = j.at("world_size").get<int>();
  c.local_rank = j.at("local_rank").get<int>();
  c.local_world_size = j.at("local_world_size").get<int>();
  c.node_rank = j.at("node_rank").get<int>();
  c.experiment_name = j.at("experiment_name").get<std::string>();
  c.storage_path = j.at("storage_path").get<std::string>();
  c.experiment_path = j.at("experiment_path").get<std::string>();
  c.attempt = j.at("attempt").get<int>();
  c.master_addr = j.at("rendezvous").at("master_addr").get<std::string>();
  c.master_port = j.at("rendezvous").at("master_port").get<int>();
  return c;
}

nlohmann::json result_to_json(const Result& r) {
  nlohmann::json best = nlohmann::json::array();
  for (const auto& b : r.best_checkpoints) {
    best.push_back({{"uri", b.checkpoint.uri()}, {"metrics", b.metrics}});
  }
  nlohmann::json restores = nlohmann::json::array();
  for (const auto& x : r.restores) {
    restores.push_back({{"attempt", x.attempt}, {"checkpoint", x.checkpoint}, {"tier", x.tier}});
  }
  return {{"metrics", r.metrics},
          {"restores", restores},
          {"checkpoint", r.checkpoint ? nlohmann::json(r.checkpoint->uri()) : nlohmann::json()},
          {"best", best},
          {"path", r.path},
          {"preempted", r.preempted},
          {"history", r.metrics_history},
          {"error", r.error ? nlohmann::json(*r.error) : nlohmann::json()}};
}

Result result_from_json(const nlohmann::json& j) {
  Result r;
  r.metrics = j.at("metrics");
  if (j.at("checkpoint").is_string()) {
    r.checkpoint = Checkpoint::from_directory(j["checkpoint"].get<std::string>());
  }
  for (const auto& b : j.at("best")) {
    r.best_checkpoints.push_back(
        {Checkpoint::from_directory(b.at("uri").get<std::string>()), b.at("metrics")});
  }
  r.path = j.at("path").get<std::string>();
  if (j.at("error").is_string()) r.error = j["error"].get<std::string>();
  r.preempted = j.value("preempted", false);
  if (j.contains("history")) r.metrics_history = j["history"].get<std::vector<nlohmann::json>>();
  for (const auto& x : j.value("restores", nlohmann::json::array())) {
    r.restores.push_back({x.at("attempt").get<int>(), x.at("checkpoint").get<std::string>(),
                          x.at("tier").get<std::string>()});
  }
  return r;
}

nlohmann::json error_to_json(ErrorCode code, std::string_view message) {
  return {{"code", std::string(error_code_name(code))}, {"message", std::string(message)}};
}

Error error_from_json(const nlohmann::json& j, std::string_view prefix) {
  const std::string name = j.value("code", "internal");
  ErrorCode code = ErrorCode::kInternal;
  for (int c = 0; c <= static_cast<int>(ErrorCode::kInternal); ++c) {
    if (error_code_name(static_cast<ErrorCode>(c)) == name) code = static_cast<ErrorCode>(c);
  }
  return Error(code, fmt::format("{}{}", prefix, j.value("message", std::string("unknown"))));
}

// The "t" of a message, "" when it has none or it is not a string (value()
// would throw on a wrong type).
std::string type_of(const nlohmann::json& m) {
  auto it = m.is_object() ? m.find("t") : m.end();
  return it != m.end() && it->is_string() ? it->get<std::string>() : std::string();
}

Error malformed(std::string_view from, const nlohmann::json::exception& e) {
  return Error(ErrorCode::kCorruption,
               fmt::format("malformed message from {}: {}", from, e.what()));
}

std::string random_token() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}{:08x}{:08x}", rd(), rd(), rd(), rd());
}

// ---------------------------------------------------------------- driver side

struct Agent {
  int rank = 0;
  std::string host;
  std::string label = "MPI rank";
  Channel channel;
  bool gone = false;

  std::string name() const { return fmt::format("{} {} on host {}", label, rank, host); }
  void send(const nlohmann::json& m) {
    if (gone) return;
    try {
      channel.send(m);
    } catch (const Error&) {
      gone = true;  // ignore-error: reported where the group next needs this agent
    }
  }
};

// Reads from `agents` until every one not gone sent a message of type `type`
// or `limit` passed; other messages are dropped. Returns the replies, by
// index (null where none came; such an agent is marked gone).
std::vector<nlohmann::json> collect(std::vector<Agent>& agents, const std::string& type,
                                    milliseconds limit) {
  std::vector<nlohmann::json> replies(agents.size());
  std::vector<bool> done(agents.size());
  for (size_t i = 0; i < agents.size(); ++i) done[i] = agents[i].gone;
  const auto deadline = Clock::now() + limit;
  while (true) {
    std::vector<pollfd> fds;
    std::vector<size_t> who;
    for (size_t i = 0; i < agents.size(); ++i) {
      if (done[i]) continue;
      fds.push_back({agents[i].channel.fd(), POLLIN, 0});
      who.push_back(i);
    }
    if (fds.empty()) break;
    const int wait = remaining_ms(deadline);
    if (wait == 0) {
      for (size_t i : who) {
        log::warn(fmt::format("{} did not answer \"{}\" within {} s; treating it as gone",
                              agents[i].name(), type, limit.count() / 1000));
        agents[i].gone = true;
      }
      break;
    }
    ::poll(fds.data(), fds.size(), wait);  // ignore-error: EINTR just means look again
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      Agent& a = agents[who[k]];
      std::vector<nlohmann::json> messages;
      bool open = false;
      try {
        open = a.channel.read_available(messages);
      } catch (const Error&) {
        open = false;  // ignore-error: a broken agent is a gone agent
      }
      for (auto& m : messages) {
        if (type_of(m) == type && !done[who[k]]) {
          replies[who[k]] = std::move(m);
          done[who[k]] = true;
        }
      }
      if (!open && !done[who[k]]) {
        a.gone = true;
        done[who[k]] = true;
      }
    }
  }
  return replies;
}

// The driver's view of one attempt: world rank 0 is forked here, every other
// rank by its agent.
class MpiGroup final : public Group {
 public:
  MpiGroup(const LaunchSpec& spec, std::vector<Agent>& agents,
           const std::vector<TrainContext>& places)
      : agents_(agents),
        exited_(places.size(), false),
        tails_(places.size()),
        attempt_(spec.context.attempt) {
    for (const Agent& a : agents_) {
      if (a.gone) {
        throw Error(ErrorCode::kUnavailable,
                    fmt::format("{} is gone, so the group cannot start (attempt {}); the job "
                                "must be restarted",
                                a.name(), attempt_ + 1));
      }
    }
    local_ = start_local_ranks(spec, {place(spec, places[0])});
    for (Agent& a : agents_) {
      a.send({{"t", "launch"},
              {"context", context_to_json(place(spec, places.at(a.rank)))},
              {"checkpoint_uri",
               spec.checkpoint_uri ? nlohmann::json(*spec.checkpoint_uri) : nlohmann::json()},
              {"train_loop_config", spec.train_loop_config}});
    }
  }
  ~MpiGroup() override { stop(); }

  std::vector<GroupEvent> poll(int timeout_ms) override {
    std::vector<pollfd> fds;
    for (int fd : wait_fds()) fds.push_back({fd, POLLIN, 0});
    if (!fds.empty()) {
      ::poll(fds.data(), fds.size(), timeout_ms);  // ignore-error: EINTR just means look again
    } else {
      ::usleep(static_cast<useconds_t>(timeout_ms) * 1000);  // only exits are left to see
    }
    std::vector<GroupEvent> events = local_->poll(0);
    for (Agent& a : agents_) read_agent(a, events);
    return events;
  }

  void send(int rank, const nlohmann::json& message) override {
    if (rank == 0) {
      local_->send(0, message);
      return;
    }
    agents_.at(static_cast<size_t>(rank - 1)).send({{"t", "to_worker"}, {"message", message}});
  }

  void stop() override {
    if (stopped_) return;
    stopped_ = true;
    local_->stop();
    for (Agent& a : agents_) a.send({{"t", "stop"}});
    std::vector<nlohmann::json> replies = collect(agents_, "stopped", kStopLimit);
    for (size_t i = 0; i < agents_.size(); ++i) {
      const auto it = replies[i].is_object() ? replies[i].find("stderr_tail") : replies[i].end();
      if (it != replies[i].end() && it->is_string() && !it->empty()) {
        tails_[agents_[i].rank] = it->get<std::string>();
      }
    }
  }

  void wait_all(int timeout_ms) override {
    const auto deadline = Clock::now() + milliseconds(timeout_ms);
    auto all_exited = [&] {
      for (const Agent& a : agents_) {
        if (!exited_[a.rank] && !a.gone) return false;
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

  std::vector<int> wait_fds() const override {
    std::vector<int> fds = local_->wait_fds();
    for (const Agent& a : agents_) {
      if (!a.gone && a.channel.open()) fds.push_back(a.channel.fd());
    }
    return fds;
  }

 private:
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
    std::vector<nlohmann::json> messages;
    bool open = !a.gone && a.channel.open();
    std::string broken;
    try {
      if (open) open = a.channel.read_available(messages);
    } catch (const Error& e) {
      open = false;
      broken = e.what();
    }
    try {
      for (auto& m : messages) read_agent_message(a, m, events);
    } catch (const nlohmann::json::exception& e) {
      open = false;  // an agent that sends nonsense is treated as lost, naming it
      broken = malformed(a.name(), e).what();
    }
    if (!open) {
      a.gone = true;
      a.channel.close();
      if (!exited_[a.rank]) {
        exited_[a.rank] = true;
        GroupEvent e;
        e.type = GroupEvent::kExit;
        e.rank = a.rank;
        e.cause = fmt::format("lost: its process ({}) closed the connection to the driver{}",
                              a.name(), broken.empty() ? "" : ": " + broken);
        events.push_back(std::move(e));
      }
    }
  }

  // One message of an agent; nlohmann's exceptions for a field of the wrong
  // type reach read_agent, which treats the agent as lost.
  void read_agent_message(const Agent& a, const nlohmann::json& m,
                          std::vector<GroupEvent>& events) {
    if (exited_[a.rank]) return;
    const std::string t = type_of(m);
    if (t == "worker") {
      GroupEvent e;
      e.rank = a.rank;
      e.message = m.value("message", nlohmann::json::object());
      events.push_back(std::move(e));
    } else if (t == "exit") {
      GroupEvent e;
      e.type = GroupEvent::kExit;
      e.rank = a.rank;
      e.clean = m.value("clean", false);
      e.cause = fmt::format("{} on host {}", m.value("cause", std::string("exited")), a.host);
      tails_[a.rank] = m.value("stderr_tail", "");
      exited_[a.rank] = true;
      events.push_back(std::move(e));
    }
  }

  std::vector<Agent>& agents_;
  std::unique_ptr<Group> local_;
  std::vector<bool> exited_;
  std::vector<std::string> tails_;
  int attempt_ = 0;
  bool stopped_ = false;
};

// Fills in the hosts `w` does not know yet (a torchrun-style launch learns
// them from the agents' hellos).
std::vector<Agent> accept_agents(TcpListener& listener, MpiWorld& w, const std::string& token,
                                 const std::string& where) {
  std::vector<Agent> agents(static_cast<size_t>(w.size - 1));
  std::vector<bool> joined(agents.size(), false);
  size_t count = 0;
  const auto deadline = Clock::now() + kConnectLimit;
  while (count < agents.size() && remaining_ms(deadline) > 0) {
    UniqueFd fd = listener.accept(milliseconds(std::min(1000, remaining_ms(deadline))));
    if (!fd) continue;
    Channel ch(std::move(fd), "a connecting process");
    std::optional<nlohmann::json> hello;
    try {
      hello = ch.recv(10'000);
    } catch (const Error& e) {
      log::warn(fmt::format("driver: dropped a connection that did not say hello: {}", e.what()));
      continue;
    }
    const auto field = [&](const char* key) -> nlohmann::json {
      if (!hello || !hello->is_object()) return nullptr;
      auto it = hello->find(key);
      return it == hello->end() ? nlohmann::json() : *it;
    };
    if (!hello || type_of(*hello) != "hello" || field("token") != token) {
      log::warn("driver: dropped a connection without this job's token");
      continue;
    }
    const int rank = field("rank").is_number_integer() ? field("rank").get<int>() : -1;
    if (rank < 1 || rank >= w.size || joined[static_cast<size_t>(rank - 1)]) {
      log::warn(fmt::format("driver: dropped a connection claiming {} {}", w.label, rank));
      continue;
    }
    Agent& a = agents[static_cast<size_t>(rank - 1)];
    std::string& host = w.hosts.at(static_cast<size_t>(rank));
    if (host.empty()) host = field("host").is_string() ? field("host").get<std::string>() : "?";
    a.rank = rank;
    a.host = host;
    a.label = w.label;
    a.channel = std::move(ch);
    a.channel.set_peer(a.name());
    joined[static_cast<size_t>(rank - 1)] = true;
    ++count;
  }
  if (count < agents.size()) {
    std::vector<std::string> missing;
    for (size_t i = 0; i < agents.size(); ++i) {
      if (!joined[i]) {
        const std::string& host = w.hosts[i + 1];
        missing.push_back(host.empty() ? std::to_string(i + 1)
                                       : fmt::format("{} (host {})", i + 1, host));
      }
    }
    // The ones that did connect learn why the job ends.
    for (size_t i = 0; i < agents.size(); ++i) {
      if (joined[i]) {
        agents[i].send({{"t", "end"},
                        {"error", error_to_json(ErrorCode::kTimeout, "not every rank connected")}});
      }
    }
    throw Error(ErrorCode::kTimeout,
                fmt::format("{}(s) {} did not connect to the driver at {} within {} s; "
                            "the port must be reachable from every node ({})",
                            w.label, fmt::join(missing, ", "), where, kConnectLimit.count() / 1000,
                            w.label == "MPI rank"
                                ? "set CAIRN_MPI_ADDRESS on the driver's node to an address on a "
                                  "network all nodes share"
                                : "MASTER_ADDR must name rank 0's node on a network all nodes "
                                  "share; every process must be started with the same WORLD_SIZE"));
  }
  return agents;
}

// The storage rule (mpi.h): a probe file every rank must see.
void probe_storage(std::vector<Agent>& agents, const MpiWorld& w, const DriverSpec& spec,
                   const std::string& token) {
  auto storage = open_storage(spec.experiment_uri);
  const std::string key = fmt::format(".cairn-storage-probe-{}", token);
  storage->put(key, w.hosts.at(0));
  for (Agent& a : agents) a.send({{"t", "probe"}, {"uri", spec.experiment_uri}, {"key", key}});
  std::vector<nlohmann::json> replies = collect(agents, "probe_result", kProbeLimit);
  try {
    storage->remove(key);
  } catch (const Error& e) {
    log::warn(fmt::format("could not remove the storage probe {}: {}", key, e.what()));
  }
  std::vector<bool> seen(static_cast<size_t>(w.size), true);
  std::vector<std::string> why(static_cast<size_t>(w.size));
  for (size_t i = 0; i < agents.size(); ++i) {
    const size_t r = static_cast<size_t>(agents[i].rank);
    if (!replies[i].is_object()) {
      seen[r] = false;
      why[r] = "it did not answer";
      continue;
    }
    const nlohmann::json& reply = replies[i];
    seen[r] = reply.contains("seen") && reply["seen"].is_boolean() && reply["seen"].get<bool>();
    why[r] = reply.contains("why") && reply["why"].is_string() ? reply["why"].get<std::string>()
                                                               : std::string();
  }
  check_shared_storage(w.hosts, seen, spec.experiment_path, why);
}

Result drive(DriverSpec spec, MpiWorld w, TcpListener& listener, const std::string& token,
             const std::string& where, const ControlAddress& control) {
  std::vector<Agent> agents = accept_agents(listener, w, token, where);
  const std::vector<TrainContext> places = plan_places(w.hosts);
  auto end_all = [&](const nlohmann::json& m) {
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
      // Ranks on other hosts cannot write into this host's memory, and
      // replicas in peers' memory are not built yet (docs/memory-tier.md).
      log::warn(
          fmt::format("{}: the ranks run on several hosts; the memory tier serves one host, "
                      "so checkpoints go to persistent storage only",
                      spec.experiment_path));
      tier.enabled = false;
    }
    GroupFactory start = [&](const LaunchSpec& launch) -> std::unique_ptr<Group> {
      return std::make_unique<MpiGroup>(launch, agents, places);
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

class AgentLoop {
 public:
  AgentLoop(const DriverSpec& spec, const MpiWorld& w, Channel driver)
      : spec_(spec), w_(w), driver_(std::move(driver)) {}

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
      ::poll(fds.data(), fds.size(), 1000);  // ignore-error: EINTR just means look again
      if (group_) relay_worker();
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
                      {"stderr_tail", group_->stderr_tail(w_.rank)}});
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
      if (group_) group_->send(w_.rank, m.at("message"));
    } else if (t == "stop") {
      end_attempt();
      driver_.send({{"t", "stopped"}, {"stderr_tail", tail_}});
    } else if (t == "probe") {
      nlohmann::json reply = {{"t", "probe_result"}, {"seen", false}};
      try {
        reply["seen"] =
            open_storage(m.at("uri").get<std::string>())->exists(m.at("key").get<std::string>());
      } catch (const Error& e) {
        reply["why"] = e.what();
      }
      driver_.send(reply);
    } else if (t == "end") {
      end_attempt();
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

  void end_attempt() {
    if (group_) {
      group_->stop();
      tail_ = group_->stderr_tail(w_.rank);
      group_.reset();
    } else {
      tail_.clear();
    }
    scratch_.reset();
  }

  const DriverSpec& spec_;
  const MpiWorld& w_;
  Channel driver_;
  BackgroundRemover scratch_remover_;  // outlives scratch_
  std::unique_ptr<Group> group_;
  std::unique_ptr<ScratchDir> scratch_;
  std::string tail_;
  const SigtermNotice* sigterm_ = nullptr;  // while run() runs
};

// An agent's whole part in a launch: connect to the driver, say hello, then
// serve its rank until the driver says "end".
Result run_agent(const DriverSpec& spec, const MpiWorld& w,
                 const std::vector<std::string>& addresses, int port, const std::string& token) {
  Channel driver(tcp_connect(addresses, port, kConnectLimit),
                 fmt::format("the driver ({} 0 on host {})", w.label, w.hosts.at(0)));
  driver.send({{"t", "hello"}, {"rank", w.rank}, {"token", token}, {"host", w.hosts.at(w.rank)}});
  for (const auto& p : sweep_dead_scratch_dirs()) {
    log::info(fmt::format("removed {}, the scratch folder of an agent that died", p.string()));
  }
  AgentLoop loop(spec, w, std::move(driver));
  return loop.run();
}

}  // namespace

Result fit_mpi(DriverSpec spec, int num_workers) {
  const MpiWorld w = mpi_join();
  launched_world_ranks(num_workers, w.size);  // every process refuses a mismatch alike

  // Rank 0 listens and broadcasts where; or broadcasts why it cannot.
  std::unique_ptr<TcpListener> listener;
  ControlAddress control;
  nlohmann::json boot = nlohmann::json::object();
  if (w.rank == 0) {
    try {
      const std::string forced = Settings::from(Environment::process()).mpi_address;
      std::vector<std::string> interfaces;
      try {
        interfaces = local_addresses();
      } catch (const Error& e) {
        // ignore-error: the host name is still advertised
        log::warn(fmt::format("driver: cannot list network interfaces: {}", e.what()));
      }
      control = choose_control_address(w.hosts, forced, interfaces, w.hosts.at(0));
      listener = std::make_unique<TcpListener>(control.bind);
      boot = {
          {"addresses", control.advertise}, {"port", listener->port()}, {"token", random_token()}};
    } catch (const Error& e) {
      boot = {{"error", error_to_json(e.code(), e.what())}};
    }
  }
  const std::string boot_source = "the MPI boot message of MPI rank 0";
  std::vector<std::string> addresses;
  int port = 0;
  std::string token;
  try {
    boot = parse_json(mpi_broadcast(w.rank == 0 ? boot.dump() : std::string()), boot_source);
    if (boot.contains("error")) {
      throw error_from_json(boot["error"], "the driver (MPI rank 0) could not listen: ");
    }
    addresses = boot.at("addresses").get<std::vector<std::string>>();
    port = boot.at("port").get<int>();
    token = boot.at("token").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    throw malformed(boot_source, e);
  }
  const std::string where = fmt::format("[{}] port {}", fmt::join(addresses, ", "), port);

  if (w.rank == 0) return drive(std::move(spec), w, *listener, token, where, control);

  return run_agent(spec, w, addresses, port, token);
}

Result fit_env(DriverSpec spec, int num_workers, const EnvLaunch& launch) {
  launched_world_ranks(num_workers, launch.world_size, launch.world_size_source);
  MpiWorld w;
  w.rank = launch.rank;
  w.size = launch.world_size;
  w.label = "rank";
  w.hosts.resize(static_cast<size_t>(launch.world_size));  // the driver learns them at hello
  w.hosts.at(static_cast<size_t>(launch.rank)) = host_name();
  // No channel but the control port itself: the token only tells this
  // job's processes from strays that reach it.
  const std::string token =
      fmt::format("env:{}:{}:{}", launch.world_size, launch.master_addr, launch.control_port);
  const std::string where = fmt::format("{} port {}", launch.master_addr, launch.control_port);
  if (launch.rank == 0) {
    ControlAddress control{launch.bind, {launch.master_addr}};
    TcpListener listener(control.bind, launch.control_port);
    return drive(std::move(spec), std::move(w), listener, token, where, control);
  }
  w.hosts.at(0) = launch.master_addr;
  return run_agent(spec, w, {launch.master_addr}, launch.control_port, token);
}

}  // namespace cairn::train_internal
