// The driver's side of the memory tier across the hosts of an MPI launch
// (docs/memory-tier.md, "Across hosts"; the hosts' side is host_tier.h).
// The driver's own host is host 0: the driver carries out its part of every
// operation in-process, and its manager's tier is that host's copy, whose
// history decides what the tier holds. The other hosts' leaders are agents.
//
// - A round: the ranks write into their own host's copy of the reserved
//   folder; replicate() has each host's files copied to the next host(s)
//   and checked; the driver commits its copy; committed() sends the manifest to
//   every host and what the tier keeps, then starts a due persistence.
// - Persistence runs in the background: each host copies the files it
//   wrote (the driver's on a thread of its own) to the persistent location
//   and answers; once every host has, progress() commits the persistent
//   copy. One at a time; a newer due checkpoint replaces one waiting.
// - The launch's start (prepare_launch(), before the manager opens): every
//   host says what it holds; checkpoints that no longer exist whole on the
//   hosts together are removed, and the newest whole one is completed on
//   every host from the peers' replicas.
// - An attempt that restores from the tier: restoring() completes that
//   checkpoint on every host (the ranks of a host may read any rank's files).
//
// Thread-safety: the driver's thread only. Failure: cairn::Error naming the
// host and what failed; a failed persistence is a warning (the checkpoint
// stays in memory).
#pragma once

#include <cstdint>
#include <filesystem>
#include <future>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/control/tier_hosts.h"
#include "train/host_tier.h"
#include "train/mpi_agents.h"

namespace cairn::train_internal {

class PeerTier final : public TierHosts {
 public:
  // `agents`: the launch's agents, by MPI rank - 1; `hosts`: by MPI rank.
  PeerTier(std::vector<Agent>& agents, const std::vector<std::string>& hosts,
           const std::string& experiment_uri, const MemoryTierConfig& config);
  ~PeerTier() override;

  // Before the experiment's manager opens, for a run that continues one.
  void prepare_launch();

  void opened(CheckpointManager& manager) override;
  std::vector<std::string> restoring(const CheckpointRecord& from, int world) override;
  void replicate(const Checkpoint& reserved, const std::vector<ManifestEntry>& files) override;
  void committed(const CheckpointRecord& committed) override;
  void release() override;

  // A "tier_..." message an agent sent while its group ran (MpiGroup routes
  // them here), and progress of the persistence under way (called often).
  void on_message(const Agent& agent, const nlohmann::json& message);
  void progress();

  size_t host_count() const { return layout_.count(); }

 private:
  struct Persisting {
    uint64_t index = 0;
    std::optional<Checkpoint> source;
    std::set<int> waiting;  // hosts yet to answer (0: this one)
    std::vector<ManifestEntry> files;
    std::vector<std::string> errors;
    std::future<nlohmann::json> mine;
  };

  Agent& leader(int host) { return agents_.at(static_cast<size_t>(layout_.leader.at(host) - 1)); }
  // Sends `op` to every other host's leader, carries out this host's part,
  // collects the others' answers of type `answer`: by host (0: this one's).
  std::vector<nlohmann::json> everywhere(const nlohmann::json& op, const std::string& answer);
  void to_others(const nlohmann::json& op);
  std::vector<Held> inventory();
  // Carries out `plan` on every host (removals, moves, control files).
  void stage(const RestorePlan& plan);
  std::vector<std::string> rank_tiers(const RestorePlan& plan, int world) const;
  // The least free memory of any host's tier (the memory bound's).
  uint64_t least_free();
  void dispatch(uint64_t index);
  void finish_persisting();
  void wait_persisting();

  std::vector<Agent>& agents_;
  HostLayout layout_;
  std::filesystem::path folder_;  // this experiment's tier folder (the same on every host)
  std::filesystem::path root_;    // its checkpoints
  std::string owner_;             // this host's owner.json, for the other hosts' copies
  int replicas_ = 1;              // MemoryTierConfig::replicas, at most the other hosts
  bool own_files_ = false;        // MemoryTierConfig::ranks_read_own_files
  CheckpointManager* manager_ = nullptr;
  std::map<uint64_t, std::vector<std::set<std::string>>> own_;  // index -> by host: files it wrote
  std::optional<uint64_t> due_;
  std::optional<Persisting> persisting_;
  std::map<std::string, std::vector<std::string>> staged_;  // prepare_launch's rank tiers
};

}  // namespace cairn::train_internal
