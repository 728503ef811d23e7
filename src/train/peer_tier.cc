// The driver's side of the memory tier across hosts (peer_tier.h).
#include "train/peer_tier.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cairn/error.h"
#include "manager/memory_tier.h"
#include "manager/tier_access.h"
#include "train/mpi_messages.h"
#include "util/log.h"

namespace cairn::train_internal {

namespace fs = std::filesystem;
using manager_internal::TierAccess;
using Clock = std::chrono::steady_clock;

namespace {

// How long a host may take for its part of an operation that moves
// checkpoints: generous, it bounds a failure, not the work.
constexpr std::chrono::milliseconds kTierLimit = std::chrono::minutes(30);

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string error_of(const nlohmann::json& answer) {
  return answer.is_object() && answer.contains("error") && answer["error"].is_string()
             ? answer["error"].get<std::string>()
             : std::string();
}

}  // namespace

PeerTier::PeerTier(std::vector<Agent>& agents, const std::vector<std::string>& hosts,
                   const std::string& experiment_uri, const MemoryTierConfig& config)
    : agents_(agents),
      layout_(layout_hosts(hosts)),
      folder_(memory_tier_folder(experiment_uri, config.root)),
      root_(memory_tier_checkpoints(folder_)),
      replicas_(std::min(config.replicas, static_cast<int>(layout_.count()) - 1)),
      own_files_(config.ranks_read_own_files) {
  log::info(fmt::format(
      "{}: the memory tier spans {} hosts ({}); each host's checkpoint files are replicated "
      "to the memory of the next {} host(s)",
      experiment_uri, layout_.count(), fmt::join(layout_.names, ", "), replicas_));
}

PeerTier::~PeerTier() {
  if (persisting_ && persisting_->mine.valid()) persisting_->mine.wait();
}

void PeerTier::to_others(const nlohmann::json& op) {
  for (int h = 1; h < static_cast<int>(layout_.count()); ++h) leader(h).send(op);
}

std::vector<nlohmann::json> PeerTier::everywhere(const nlohmann::json& op,
                                                 const std::string& answer) {
  to_others(op);
  std::vector<nlohmann::json> out;
  out.push_back(carry_out(op, layout_, 0));
  std::vector<int> ranks(layout_.leader.begin() + 1, layout_.leader.end());
  for (auto& a : collect_kept(agents_, ranks, answer, kTierLimit)) out.push_back(std::move(a));
  return out;
}

std::vector<Held> PeerTier::inventory() {
  std::vector<Held> held;
  const auto answers = everywhere({{"t", "tier_inventory"}, {"root", root_.string()}}, "tier_held");
  for (size_t h = 0; h < answers.size(); ++h) {
    if (const std::string e = error_of(answers[h]); !e.empty()) {
      throw Error(ErrorCode::kIO, fmt::format("reading the memory tier across hosts: {}", e));
    }
    held.push_back(held_from_json(answers[h].at("held")));
  }
  return held;
}

void PeerTier::stage(const RestorePlan& plan) {
  nlohmann::json moves = nlohmann::json::array();
  for (const Move& m : plan.moves) {
    moves.push_back({{"name", m.name},
                     {"path", m.file.path},
                     {"size", m.file.size},
                     {"xxh3", m.file.xxh3},
                     {"from", m.from},
                     {"to", m.to}});
  }
  nlohmann::json control = nlohmann::json::object();
  if (plan.newest) control[*plan.newest] = plan.control;
  for (const Move& m : plan.moves) {
    log::info(fmt::format("memory tier: {} of {} goes to host {} from host {}'s replica",
                          m.file.path, m.name, layout_.names.at(static_cast<size_t>(m.to)),
                          layout_.names.at(static_cast<size_t>(m.from))));
  }
  const auto start = Clock::now();
  const auto answers = everywhere({{"t", "tier_stage"},
                                   {"root", root_.string()},
                                   {"remove", plan.remove},
                                   {"moves", moves},
                                   {"control", control}},
                                  "tier_staged");
  for (const auto& a : answers) {
    if (const std::string e = error_of(a); !e.empty()) {
      throw Error(ErrorCode::kIO, fmt::format("completing {} in the memory tier across hosts: {}",
                                              plan.newest.value_or("the tier"), e));
    }
  }
  if (!plan.moves.empty()) {
    uint64_t bytes = 0;
    for (const Move& m : plan.moves) bytes += m.file.size;
    log::info(
        fmt::format("memory tier: {} completed on every host{} from the replicas: {} "
                    "file(s), {:.1f} MiB moved in {:.2f} s",
                    *plan.newest, own_files_ ? " (with its ranks' files)" : "", plan.moves.size(),
                    static_cast<double>(bytes) / (1 << 20),
                    std::chrono::duration<double>(Clock::now() - start).count()));
  }
}

std::vector<std::string> PeerTier::rank_tiers(const RestorePlan& plan, int world) const {
  std::vector<std::string> out;
  for (int r = 0; r < world && r < static_cast<int>(layout_.host_of.size()); ++r) {
    out.push_back(plan.filled.count(layout_.host_of[static_cast<size_t>(r)]) ? "peer" : "memory");
  }
  return out;
}

void PeerTier::prepare_launch() {
  const std::vector<Held> held = inventory();
  const RestorePlan plan = plan_restore(held, std::nullopt, own_files_ ? &layout_ : nullptr);
  for (const auto& name : plan.remove) {
    const bool committed = std::any_of(held.begin(), held.end(), [&](const Held& h) {
      auto it = h.find(name);
      return it != h.end() && it->second.manifest.has_value();
    });
    if (committed) {
      log::warn(
          fmt::format("memory tier: removing {} from every host: the hosts left hold "
                      "neither all of its files nor their replicas",
                      name));
    } else {
      log::info(
          fmt::format("memory tier: removing {}, the leftover of a save the crash "
                      "interrupted",
                      name));
    }
  }
  if (!plan.newest && plan.remove.empty()) return;
  stage(plan);
  if (plan.newest) {
    staged_[*plan.newest] = rank_tiers(plan, static_cast<int>(layout_.host_of.size()));
  }
}

void PeerTier::opened(CheckpointManager& manager) {
  if (!TierAccess::folder(manager)) return;  // the tier is off
  manager_ = &manager;
  owner_ = slurp(memory_tier_owner(folder_));  // the tier's open wrote it
  TierAccess::spread(
      manager, [this](uint64_t index) { due_ = index; }, [this] { return least_free(); });
}

std::vector<std::string> PeerTier::restoring(const CheckpointRecord& from, int world) {
  const std::string name = fs::path(from.checkpoint.uri()).filename().string();
  if (auto it = staged_.find(name); it != staged_.end()) {
    std::vector<std::string> out = it->second;
    staged_.erase(it);
    out.resize(std::min(out.size(), static_cast<size_t>(world)));
    return out;
  }
  const RestorePlan plan = plan_restore(inventory(), name, own_files_ ? &layout_ : nullptr);
  if (!plan.newest) {
    throw Error(ErrorCode::kUnavailable,
                fmt::format("{}: the hosts no longer hold all of its files in the memory tier",
                            from.checkpoint.uri()));
  }
  if (!plan.moves.empty()) stage(plan);
  return rank_tiers(plan, world);
}

void PeerTier::replicate(const Checkpoint& reserved, const std::vector<ManifestEntry>& files) {
  const std::optional<fs::path> dir = reserved.storage().local_path("");
  if (!manager_ || !dir || dir->parent_path() != root_) return;  // saved to persistent storage
  nlohmann::json list = nlohmann::json::array();
  for (const auto& f : files) list.push_back(entry_message(f));
  const auto answers = everywhere({{"t", "tier_replicate"},
                                   {"root", root_.string()},
                                   {"dir", dir->string()},
                                   {"files", list},
                                   {"replicas", replicas_}},
                                  "tier_replicated");
  std::vector<std::set<std::string>> own;
  for (size_t h = 0; h < answers.size(); ++h) {
    if (const std::string e = error_of(answers[h]); !e.empty()) {
      throw Error(ErrorCode::kIO,
                  fmt::format("replicating {} to the peer hosts' memory: {}", reserved.uri(), e));
    }
    own.push_back(answers[h].at("own").get<std::set<std::string>>());
  }
  if (auto index = parse_checkpoint_name(dir->filename().string())) own_[*index] = std::move(own);
}

void PeerTier::committed(const CheckpointRecord& committed) {
  if (!manager_ || committed.tier != "memory") return;
  const fs::path dir = root_ / checkpoint_name(committed.index);
  nlohmann::json control = {{std::string(kManifestKey), slurp(dir / std::string(kManifestKey))}};
  if (fs::exists(dir / std::string(kMetadataKey))) {
    control[std::string(kMetadataKey)] = slurp(dir / std::string(kMetadataKey));
  }
  to_others({{"t", "tier_commit"},
             {"root", root_.string()},
             {"dir", dir.string()},
             {"control", control},
             {"owner", {{"file", memory_tier_owner(folder_).string()}, {"text", owner_}}}});
  const std::vector<std::string> kept = TierAccess::kept(*manager_);
  to_others({{"t", "tier_keep"}, {"root", root_.string()}, {"keep", kept}});
  for (auto it = own_.begin(); it != own_.end();) {
    it = std::find(kept.begin(), kept.end(), checkpoint_name(it->first)) == kept.end()
             ? own_.erase(it)
             : std::next(it);
  }
  if (due_ && !persisting_) dispatch(*std::exchange(due_, std::nullopt));
}

uint64_t PeerTier::least_free() {
  uint64_t least = UINT64_MAX;
  for (const auto& a : everywhere({{"t", "tier_space"}, {"root", root_.string()}}, "tier_free")) {
    if (const std::string e = error_of(a); !e.empty()) {
      throw Error(ErrorCode::kIO, fmt::format("the memory tier across hosts: {}", e));
    }
    least = std::min(least, a.at("bytes").get<uint64_t>());
  }
  return least;
}

void PeerTier::dispatch(uint64_t index) {
  std::optional<Checkpoint> source = TierAccess::in_memory(*manager_, index);
  if (!source) return;  // retention took it meanwhile
  Manifest manifest;
  try {
    manifest = source->manifest();
  } catch (const Error& e) {
    // ignore-error: the checkpoint stays in memory; the next due one is persisted
    log::warn(fmt::format("{}: not persisting {}: {}", manager_->uri(), source->uri(), e.what()));
    return;
  }
  // Each file is persisted by the first host that wrote it: as replicated
  // by this driver, else (a checkpoint an earlier job saved) as the
  // manifest's ranks say; with neither, by this host, which a restore made
  // hold every file.
  std::vector<nlohmann::json> assigned(layout_.count(), nlohmann::json::array());
  const auto own = own_.find(index);
  const std::optional<std::vector<std::set<std::string>>> wrote =
      own != own_.end() ? std::optional(own->second) : files_by_host(manifest, layout_);
  for (const ManifestEntry& f : manifest.files) {
    size_t host = 0;
    if (wrote) {
      for (size_t h = 0; h < wrote->size(); ++h) {
        if ((*wrote)[h].count(f.path)) {
          host = h;
          break;
        }
      }
    }
    assigned[host].push_back(entry_message(f));
  }
  Persisting p;
  p.index = index;
  p.source = *source;
  const std::string dest = TierAccess::persistent_location(*manager_, index).uri();
  const fs::path dir = root_ / checkpoint_name(index);
  TierAccess::persisting(*manager_, index);
  for (int h = 1; h < static_cast<int>(layout_.count()); ++h) {
    leader(h).send({{"t", "tier_persist"},
                    {"root", root_.string()},
                    {"index", index},
                    {"dir", dir.string()},
                    {"dest", dest},
                    {"files", assigned[static_cast<size_t>(h)]}});
    p.waiting.insert(h);
  }
  const nlohmann::json mine = {{"t", "tier_persist"},
                               {"index", index},
                               {"dir", dir.string()},
                               {"dest", dest},
                               {"files", assigned[0]}};
  p.mine = std::async(std::launch::async,
                      [mine, layout = layout_] { return carry_out(mine, layout, 0); });
  p.waiting.insert(0);
  log::info(fmt::format("{}: persisting {} from the memory of {} host(s)", manager_->uri(),
                        checkpoint_name(index), layout_.count()));
  persisting_ = std::move(p);
}

void PeerTier::on_message(const Agent& agent, const nlohmann::json& m) {
  if (type_of(m) != "tier_persisted" || !persisting_ ||
      m.value("index", uint64_t{0}) != persisting_->index) {
    return;  // an answer to nothing under way
  }
  const auto host = std::find(layout_.leader.begin(), layout_.leader.end(), agent.rank);
  if (host == layout_.leader.end()) return;
  const int h = static_cast<int>(host - layout_.leader.begin());
  if (!persisting_->waiting.erase(h)) return;
  if (const std::string e = error_of(m); !e.empty()) {
    persisting_->errors.push_back(e);
  } else {
    for (const auto& f : m.at("files")) persisting_->files.push_back(entry_of_message(f));
  }
}

void PeerTier::progress() {
  if (!persisting_) return;
  Persisting& p = *persisting_;
  if (p.waiting.count(0) && p.mine.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
    p.waiting.erase(0);
    try {
      const nlohmann::json mine = p.mine.get();
      if (const std::string e = error_of(mine); !e.empty()) {
        p.errors.push_back(e);
      } else {
        for (const auto& f : mine.at("files")) p.files.push_back(entry_of_message(f));
      }
    } catch (const std::exception& e) {
      p.errors.push_back(e.what());
    }
  }
  if (p.waiting.empty()) finish_persisting();
}

void PeerTier::finish_persisting() {
  Persisting p = std::move(*persisting_);
  persisting_.reset();
  try {
    if (!p.errors.empty()) {
      throw Error(ErrorCode::kIO, fmt::format("{}", fmt::join(p.errors, "; ")));
    }
    TierAccess::commit_persisted(*manager_, p.index, *p.source, p.files);
  } catch (const Error& e) {
    // ignore-error: the checkpoint stays committed in memory; the next due
    // one is persisted, and the end of the run persists the newest.
    log::warn(
        fmt::format("{}: persisting {} from the hosts' memory failed; it stays in the "
                    "memory tier: {}",
                    manager_->uri(), checkpoint_name(p.index), e.what()));
  }
  TierAccess::persisting(*manager_, std::nullopt);
  if (due_) dispatch(*std::exchange(due_, std::nullopt));
}

void PeerTier::wait_persisting() {
  while (persisting_) {
    std::vector<int> ranks;
    for (int h : persisting_->waiting) {
      if (h > 0) ranks.push_back(layout_.leader.at(static_cast<size_t>(h)));
    }
    std::vector<nlohmann::json> answers;
    try {
      answers = collect_kept(agents_, ranks, "tier_persisted", kTierLimit);
    } catch (const Error& e) {
      persisting_->errors.push_back(e.what());
      for (int h : std::vector<int>(persisting_->waiting.begin(), persisting_->waiting.end())) {
        if (h > 0) persisting_->waiting.erase(h);
      }
    }
    for (size_t k = 0; k < answers.size(); ++k) {
      on_message(agents_.at(static_cast<size_t>(ranks[k] - 1)), answers[k]);
    }
    if (persisting_ && persisting_->waiting.count(0)) persisting_->mine.wait();
    progress();
  }
}

void PeerTier::release() {
  if (!manager_) return;
  wait_persisting();
  if (std::optional<CheckpointRecord> newest = TierAccess::unpersisted_newest(*manager_)) {
    due_.reset();
    dispatch(newest->index);
    wait_persisting();
    if (TierAccess::unpersisted_newest(*manager_)) {
      throw Error(ErrorCode::kIO,
                  fmt::format("{}: persisting {}, the memory tier's newest checkpoint, failed "
                              "(the log says why); the tier is kept on every host",
                              manager_->uri(), newest->checkpoint.uri()));
    }
  }
  to_others({{"t", "tier_release"}, {"root", root_.string()}, {"folder", folder_.string()}});
}

}  // namespace cairn::train_internal
