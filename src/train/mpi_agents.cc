// The driver's side of its connections to the agents (mpi_agents.h).
#include "train/mpi_agents.h"

#include <poll.h>

#include <algorithm>

#include "cairn/storage.h"
#include "train/mpi.h"
#include "train/mpi_messages.h"
#include "util/json.h"
#include "util/log.h"

namespace cairn::train_internal {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}

std::vector<nlohmann::json> collect(std::span<Agent> agents, const std::string& type,
                                    milliseconds limit) {
  std::vector<nlohmann::json> replies(agents.size());
  std::vector<bool> done(agents.size());
  for (size_t i = 0; i < agents.size(); ++i) {
    done[i] = agents[i].gone;
    // The backlog first: what was kept there came before the channel's.
    std::deque<nlohmann::json> kept;
    for (auto& m : agents[i].backlog) {
      if (!done[i] && type_of(m) == type) {
        replies[i] = std::move(m);
        done[i] = true;
      } else if (type_of(m).rfind("tier_", 0) == 0) {
        kept.push_back(std::move(m));
      }
    }
    agents[i].backlog = std::move(kept);
  }
  const auto deadline = Clock::now() + limit;
  // The first pass reads without waiting: a reply may already sit in a
  // channel's buffer (read with an earlier message), where poll() cannot
  // see it.
  bool first = true;
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
    if (!first) ::poll(fds.data(), fds.size(), wait);  // ignore-error: EINTR: look again
    for (size_t k = 0; k < fds.size(); ++k) {
      if (!first && fds[k].revents == 0) continue;
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
        } else if (type_of(m).rfind("tier_", 0) == 0) {
          a.backlog.push_back(std::move(m));
        }
      }
      if (!open && !done[who[k]]) {
        a.gone = true;
        done[who[k]] = true;
      }
    }
    first = false;
  }
  return replies;
}

std::vector<nlohmann::json> collect_kept(std::vector<Agent>& agents, const std::vector<int>& ranks,
                                         const std::string& type, milliseconds limit) {
  std::vector<nlohmann::json> replies(ranks.size());
  const auto deadline = Clock::now() + limit;
  for (size_t k = 0; k < ranks.size(); ++k) {
    Agent& a = agents.at(static_cast<size_t>(ranks[k] - 1));
    auto it = std::find_if(a.backlog.begin(), a.backlog.end(),
                           [&](const nlohmann::json& m) { return type_of(m) == type; });
    if (it != a.backlog.end()) {
      replies[k] = std::move(*it);
      a.backlog.erase(it);
      continue;
    }
    while (replies[k].is_null()) {
      if (a.gone || !a.channel.open()) {
        throw Error(ErrorCode::kUnavailable,
                    fmt::format("{} is gone; it did not answer \"{}\"", a.name(), type));
      }
      const int wait = remaining_ms(deadline);
      if (wait == 0) {
        throw Error(ErrorCode::kTimeout, fmt::format("{} did not answer \"{}\" within {} s",
                                                     a.name(), type, limit.count() / 1000));
      }
      pollfd fd{a.channel.fd(), POLLIN, 0};
      ::poll(&fd, 1, std::min(wait, 1000));  // ignore-error: EINTR: look again
      std::vector<nlohmann::json> messages;
      bool open = false;
      try {
        open = a.channel.read_available(messages);
      } catch (const Error&) {
        open = false;  // ignore-error: reported as gone just below
      }
      for (auto& m : messages) {
        if (replies[k].is_null() && type_of(m) == type) {
          replies[k] = std::move(m);
        } else {
          a.backlog.push_back(std::move(m));
        }
      }
      if (!open) a.gone = true;
    }
  }
  return replies;
}

namespace {

// Waits up to `limit` for one connection that says hello with this job's
// token and a rank in 1..size-1 that `taken` does not hold; returns it with
// its host (the hello's where `w` does not know it, or with `hello_host`
// always: a process started again may run on another node), or nothing.
std::optional<Agent> accept_one(TcpListener& listener, const MpiWorld& w, const std::string& token,
                                const std::function<bool(int)>& taken, milliseconds limit,
                                bool hello_host = false) {
  const auto deadline = Clock::now() + limit;
  do {
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
    if (rank < 1 || rank >= w.size || taken(rank)) {
      log::warn(fmt::format("driver: dropped a connection claiming {} {}", w.label, rank));
      continue;
    }
    Agent a;
    a.rank = rank;
    std::string host = w.hosts.at(static_cast<size_t>(rank));
    if ((host.empty() || hello_host) && field("host").is_string()) {
      host = field("host").get<std::string>();
    }
    a.host = host.empty() ? std::string("?") : std::move(host);
    a.label = w.label;
    a.channel = std::move(ch);
    a.channel.set_peer(a.name());
    return a;
  } while (remaining_ms(deadline) > 0);
  return std::nullopt;
}

// The storage rule (mpi.h): a probe file every agent must see. Returns, by
// index of `agents`, whether each saw it and why not where it said.
struct ProbeAnswers {
  std::vector<bool> seen;
  std::vector<std::string> why;
};

ProbeAnswers probe_agents(std::span<Agent> agents, const std::string& host0, const DriverSpec& spec,
                          const std::string& token) {
  auto storage = open_storage(spec.experiment_uri);
  const std::string key = fmt::format(".cairn-storage-probe-{}", token);
  storage->put(key, host0);
  for (Agent& a : agents) a.send({{"t", "probe"}, {"uri", spec.experiment_uri}, {"key", key}});
  std::vector<nlohmann::json> replies = collect(agents, "probe_result", kProbeLimit);
  try {
    storage->remove(key);
  } catch (const Error& e) {
    log::warn(fmt::format("could not remove the storage probe {}: {}", key, e.what()));
  }
  ProbeAnswers out{std::vector<bool>(agents.size(), false),
                   std::vector<std::string>(agents.size())};
  for (size_t i = 0; i < agents.size(); ++i) {
    if (!replies[i].is_object()) {
      out.why[i] = "it did not answer";
      continue;
    }
    const nlohmann::json& reply = replies[i];
    out.seen[i] = reply.contains("seen") && reply["seen"].is_boolean() && reply["seen"].get<bool>();
    if (reply.contains("why") && reply["why"].is_string()) out.why[i] = reply["why"];
  }
  return out;
}

}  // namespace

std::vector<Agent> accept_agents(TcpListener& listener, MpiWorld& w, const std::string& token,
                                 const std::string& where, int min_workers, milliseconds limit) {
  // One connection per agent, held for the whole run: with the usual soft
  // limit of 1024, a driver of 1,024 ranks ran out of descriptors in accept().
  raise_open_file_limit(static_cast<rlim_t>(w.size) + 256,
                        fmt::format("{} processes of the launch", w.size), "a connection to each",
                        "raise it (`ulimit -n` where the processes are started)");
  std::vector<Agent> agents(static_cast<size_t>(w.size - 1));
  std::vector<bool> joined(agents.size(), false);
  size_t count = 0;
  // The limit counts from the last connection, not from the start: it bounds
  // a process that never comes, and a launch's processes start over a time
  // that grows with their number (1,024 on two cores: about a minute).
  auto deadline = Clock::now() + limit;
  const auto taken = [&](int rank) { return joined[static_cast<size_t>(rank - 1)]; };
  while (count < agents.size() && remaining_ms(deadline) > 0) {
    std::optional<Agent> a =
        accept_one(listener, w, token, taken, milliseconds(remaining_ms(deadline)));
    if (!a) continue;
    deadline = Clock::now() + limit;
    const size_t i = static_cast<size_t>(a->rank - 1);
    w.hosts.at(i + 1) = a->host;
    agents[i] = std::move(*a);
    joined[i] = true;
    ++count;
  }
  if (count < agents.size() && min_workers > 0 && static_cast<int>(count) + 1 >= min_workers) {
    for (size_t i = 0; i < agents.size(); ++i) {
      if (joined[i]) continue;
      agents[i].rank = static_cast<int>(i) + 1;
      agents[i].host = w.hosts[i + 1].empty() ? "?" : w.hosts[i + 1];
      agents[i].label = w.label;
      agents[i].gone = true;
    }
    log::warn(
        fmt::format("driver: {} of {} process(es) connected, none more within {} s; the "
                    "elastic group starts with them (ScalingConfig::min_workers is {})",
                    count + 1, w.size, limit.count() / 1000, min_workers));
    return agents;
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
                fmt::format("{}(s) {} did not connect to the driver at {} ({} of {} "
                            "processes did, none more within {} s); the port must be reachable "
                            "from every node ({})",
                            w.label, fmt::join(missing, ", "), where, count + 1, w.size,
                            limit.count() / 1000,
                            w.label == "MPI rank"
                                ? "set CAIRN_MPI_ADDRESS on the driver's node to an address on a "
                                  "network all nodes share"
                                : "MASTER_ADDR must name rank 0's node on a network all nodes "
                                  "share; every process must be started with the same WORLD_SIZE"));
  }
  return agents;
}

void probe_storage(std::vector<Agent>& agents, const MpiWorld& w, const DriverSpec& spec,
                   const std::string& token) {
  const ProbeAnswers answers = probe_agents(agents, w.hosts.at(0), spec, token);
  std::vector<bool> seen(static_cast<size_t>(w.size), true);
  std::vector<std::string> why(static_cast<size_t>(w.size));
  for (size_t i = 0; i < agents.size(); ++i) {
    const size_t r = static_cast<size_t>(agents[i].rank);
    seen[r] = answers.seen[i];
    why[r] = answers.why[i];
  }
  check_shared_storage(w.hosts, seen, spec.experiment_path, why);
}

nlohmann::json answer_probe(const nlohmann::json& probe) {
  nlohmann::json reply = {{"t", "probe_result"}, {"seen", false}};
  try {
    reply["seen"] = open_storage(probe.at("uri").get<std::string>())
                        ->exists(probe.at("key").get<std::string>());
  } catch (const Error& e) {
    reply["why"] = e.what();
  }
  return reply;
}

void admit_returning(TcpListener& listener, const MpiWorld& w, const std::string& token,
                     std::vector<Agent>& agents, const DriverSpec* spec,
                     std::string_view what_next) {
  const auto taken = [&](int rank) { return !agents.at(static_cast<size_t>(rank - 1)).gone; };
  while (std::optional<Agent> a =
             accept_one(listener, w, token, taken, milliseconds(0), /*hello_host=*/true)) {
    if (spec != nullptr) {
      const ProbeAnswers answers = probe_agents({&*a, 1}, w.hosts.at(0), *spec, token);
      if (!answers.seen[0]) {
        std::vector<std::string> hosts = w.hosts;
        hosts.at(static_cast<size_t>(a->rank)) = a->host;
        const Error e = storage_not_shared(hosts, static_cast<size_t>(a->rank),
                                           spec->experiment_path, answers.why[0]);
        log::warn(fmt::format("{} is back but cannot join the group: {}", a->name(), e.what()));
        a->send({{"t", "end"}, {"refused", true}, {"error", error_to_json(e.code(), e.what())}});
        continue;  // its connection closes here
      }
    }
    log::info(fmt::format("{} is back; {}", a->name(), what_next));
    agents.at(static_cast<size_t>(a->rank - 1)) = std::move(*a);
  }
}

}  // namespace cairn::train_internal
