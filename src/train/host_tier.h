// The memory tier across the hosts of an MPI launch (docs/memory-tier.md,
// "Across hosts"): every host keeps the tier's folder at the same path, and
// each rank writes its files into its own host's copy. After the ranks
// upload, each host's files are replicated to the memory of the next
// MemoryTierConfig::replicas hosts (a ring over the hosts, in the order of
// their lowest rank), checked by XXH3 on
// arrival; then the driver commits, and the manifest goes to every host.
// The host leaders (each host's lowest MPI rank; the driver for its own
// host) carry out the operations below, sent by the driver
// (train/peer_tier.h) as messages of the driver <-> agent protocol
// (mpi_launch.cc):
//
//   {"t":"tier_replicate","dir":D,"files":[entry...]}
//        -> {"t":"tier_replicated","own":[path...]}    (or "error")
//   {"t":"tier_commit","dir":D,"control":{key: text}}  no answer
//   {"t":"tier_keep","root":R,"keep":[name...]}        no answer
//   {"t":"tier_inventory","root":R} -> {"t":"tier_held","held":{...}}
//   {"t":"tier_stage","root":R,"remove":[name...],"moves":[...],
//    "control":{name:{key:text}}} -> {"t":"tier_staged"} (or "error")
//   {"t":"tier_persist","index":i,"dir":D,"dest":U,"files":[entry...]}
//        -> {"t":"tier_persisted","index":i,"files":[entry...]} (or "error")
//   {"t":"tier_release","folder":F}                    no answer
//   {"t":"tier_space","root":R} -> {"t":"tier_free","bytes":n}  (free memory)
//
// An entry is {"path","size","xxh3"}. The operations that move files are
// collective over MPI between the leaders (train/mpi_peer.h), so every
// leader gets them in the same order.
//
// Failure: the operations answer with "error" (a message naming the host,
// the file and the peer) rather than throw, except for MPI failures, which
// end the launch as any MPI failure does.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cairn/checkpoint.h"
#include "train/control/entry_message.h"

namespace cairn::train_internal {

// The hosts of a launch (pure).
struct HostLayout {
  std::vector<std::string> names;  // each host once, in the order of its lowest rank
  std::vector<int> leader;         // by host: its lowest rank
  std::vector<int> host_of;        // by rank: its host's index

  size_t count() const { return names.size(); }
  int next(int host) const { return (host + 1) % static_cast<int>(names.size()); }
  int prev(int host) const {
    return (host + static_cast<int>(names.size()) - 1) % static_cast<int>(names.size());
  }
};
HostLayout layout_hosts(const std::vector<std::string>& host_of_rank);

// What one host's tier holds (tier_inventory's answer, by checkpoint name).
struct HeldCheckpoint {
  std::optional<std::string> manifest;         // the manifest's text, if committed there
  std::map<std::string, std::string> control;  // .cairn/ files other than the manifest
  std::map<std::string, uint64_t> files;       // user files present, with their sizes
};
using Held = std::map<std::string, HeldCheckpoint>;
nlohmann::json held_to_json(const Held& h);
Held held_from_json(const nlohmann::json& j);

// The plan of a restore from the memory tier (pure): given what each host
// holds, the newest checkpoint that the hosts hold whole between them (every
// file of its manifest on some host), what moves where so that every host
// holds all of it, and which checkpoints are removed (committed nowhere
// whole: a crash took a host and its replica holder).
struct Move {
  std::string name;  // the checkpoint
  ManifestEntry file;
  int from = 0;  // host index
  int to = 0;
};
struct RestorePlan {
  std::optional<std::string> newest;           // the checkpoint restored from, if any
  std::vector<std::string> remove;             // on every host
  std::vector<Move> moves;                     // for `newest`
  std::set<int> filled;                        // hosts that receive files from a peer
  std::map<std::string, std::string> control;  // `newest`'s .cairn/ files, key -> text
};
// `only`: plan for that checkpoint alone and remove nothing (a restart
// within a launch, whose hosts all hold the tier as the driver wrote it).
// `own_files` (MemoryTierConfig::ranks_read_own_files; the launch's hosts,
// in the order of `by_host`): each host is completed with only the files
// its ranks wrote (files_by_host), not the whole checkpoint.
RestorePlan plan_restore(const std::vector<Held>& by_host,
                         const std::optional<std::string>& only = std::nullopt,
                         const HostLayout* own_files = nullptr);

// The paths of `m` that the ranks of each host of `layout` passed to
// report(), from the manifest's "ranks"."files"; nullopt when it has no such
// map or its group had another size than the launch (every host then
// needs every file).
std::optional<std::vector<std::set<std::string>>> files_by_host(const Manifest& m,
                                                                const HostLayout& layout);

// The part of an operation this process carries out as the leader of host
// `host` of `layout` (the launch's MPI rank of each host's leader takes part
// in the exchanges). Returns the answer to send, or null for none.
nlohmann::json carry_out(const nlohmann::json& op, const HostLayout& layout, int host);

// The type of the answer to operation `op` ("" for one without an answer).
std::string answer_to(const std::string& op);

}  // namespace cairn::train_internal
