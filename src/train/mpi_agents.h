// The driver's side of its connections to the agents of an MPI or
// torchrun-style launch (mpi_launch.cc has the protocol and the rest):
// accepting them, collecting their answers, the storage probe, and taking
// in a process started again for a lost rank of an elastic group.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cairn/error.h"
#include "train/control/channel.h"
#include "train/control/driver.h"
#include "train/control/net.h"
#include "train/mpi_bootstrap.h"

namespace cairn::train_internal {

// How long the processes of a job may take to find each other, to answer the
// storage probe and to stop a worker. Generous: they bound failures, not work.
constexpr std::chrono::milliseconds kConnectLimit{120'000};
constexpr std::chrono::milliseconds kProbeLimit{120'000};
constexpr std::chrono::milliseconds kStopLimit{60'000};

// Milliseconds left until `deadline`, 0 once it passed.
int remaining_ms(std::chrono::steady_clock::time_point deadline);

// One agent: the process serving world rank `rank` (its launcher's rank).
struct Agent {
  int rank = 0;
  std::string host;
  std::string label = "MPI rank";
  Channel channel;
  bool gone = false;
  // Messages read while waiting for another (collect_kept), for their
  // reader: the group running, or the memory tier across hosts.
  std::deque<nlohmann::json> backlog;

  std::string name() const { return fmt::format("{} {} on host {}", label, rank, host); }
  // Appends what it sent to `messages`, without blocking; false once its
  // connection is gone or broke (then `broken` says why, if it broke).
  bool read(std::vector<nlohmann::json>& messages, std::string& broken) {
    while (!backlog.empty()) {
      messages.push_back(std::move(backlog.front()));
      backlog.pop_front();
    }
    if (gone || !channel.open()) return false;
    try {
      return channel.read_available(messages);
    } catch (const Error& e) {
      broken = e.what();
      return false;
    }
  }
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
// or `limit` passed; other messages are dropped, except the memory tier's
// ("tier_..."), which stay in the agent's backlog. Returns the replies, by
// index (null where none came; such an agent is marked gone).
std::vector<nlohmann::json> collect(std::span<Agent> agents, const std::string& type,
                                    std::chrono::milliseconds limit);

// Reads from the agents of MPI ranks `ranks` until each sent a message of
// type `type`, keeping every other message in its backlog (a group may be
// running); returns the replies in the order of `ranks`. kUnavailable naming
// the agent when one is gone or does not answer within `limit`.
std::vector<nlohmann::json> collect_kept(std::vector<Agent>& agents, const std::vector<int>& ranks,
                                         const std::string& type, std::chrono::milliseconds limit);

// Accepts the other processes of the launch until all have connected or
// none has for `limit` (counted from the last connection, so that a launch
// whose processes start over a long time, as 1,024 of them on a few cores
// do, is not cut off while they still arrive); throws kTimeout naming the
// missing ranks. Fills in the hosts `w` does not know yet (a torchrun-style
// launch learns them from the agents' hellos). An elastic group
// (`min_workers` > 0) starts without the ranks that did not connect in time
// when enough did; they are marked gone and may join a later attempt.
std::vector<Agent> accept_agents(TcpListener& listener, MpiWorld& w, const std::string& token,
                                 const std::string& where, int min_workers,
                                 std::chrono::milliseconds limit = kConnectLimit);

// The storage probe for the whole group before the first attempt: throws,
// naming the first rank whose host does not see the storage.
void probe_storage(std::vector<Agent>& agents, const MpiWorld& w, const DriverSpec& spec,
                   const std::string& token);

// An agent's answer to the driver's {"t":"probe","uri":...,"key":...}:
// {"t":"probe_result","seen":bool} and, when looking failed, "why". The
// Tuner's trial hosts answer the same probe.
nlohmann::json answer_probe(const nlohmann::json& probe);

// An elastic group between attempts: takes in the processes started again
// for lost ranks that have connected by now (without waiting), each in its
// rank's place. With `spec`, a process must first pass the storage probe,
// as the group's did before the first attempt: one whose host does not see
// the experiment's storage (a node that came back without the shared mount)
// is told why and stays out, and the group goes on without it.
// The log says "<rank> is back; <what_next>".
void admit_returning(TcpListener& listener, const MpiWorld& w, const std::string& token,
                     std::vector<Agent>& agents, const DriverSpec* spec,
                     std::string_view what_next = "it joins the next attempt");

}  // namespace cairn::train_internal
