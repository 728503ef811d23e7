// The memory tier of a CheckpointManager (MemoryTierConfig,
// docs/memory-tier.md).
//
// The tier is an experiment of its own on a RAM-backed file system,
// <root>/cairn-tier-<uid>/<name>/checkpoints/, kept by an inner
// CheckpointManager (its lock, history, manifest-last commits and recency
// retention), beside owner.json, which names the persistent experiment and
// its creation time so that a tier left by an earlier experiment at the same
// URI is never mistaken for this one's. Indices are shared: the tier hands out
// indices above every index either tier used, and a persisted copy keeps its
// index, so "the newest checkpoint" is the highest index in either tier.
//
// Persistence copies a tier checkpoint into the persistent experiment on a
// thread of its own (CheckpointWriter::copy_from, which checks every file
// against the tier's manifest, then a manifest-last commit keeping the
// tier's metrics, time, layout and ranks) and records it with the persistent
// manager's usual history and retention. One copy runs at a time; a newer
// due checkpoint replaces one still waiting. The tier's retention defers the
// checkpoints waiting or being copied.
//
// Lock order: the outer manager's mu_, then the tier manager's, then this
// struct's mu. The persister takes the outer mu_ only to record a finished
// copy, never while holding mu.
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "cairn/commit.h"
#include "cairn/error.h"
#include "cairn/manager.h"
#include "manager/history.h"
#include "manager/layout.h"
#include "manager/memory_tier.h"
#include "manager/tier_access.h"
#include "manager/tier_policy.h"
#include "util/log.h"
#include "util/settings.h"

namespace cairn {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kOwnerFile = "owner.json";
constexpr std::string_view kCheckpointsFolder = "checkpoints";
constexpr std::string_view kUserFolderPrefix = "cairn-tier-";

fs::path tier_base(std::string_view root) {
  std::string r(root);
  if (r.empty()) r = Settings::from(Environment::process()).memory_tier_dir;
  return fs::path(r) / fmt::format("{}{}", kUserFolderPrefix, ::getuid());
}

uint64_t free_bytes(const fs::path& p) {
  struct statvfs st {};
  if (::statvfs(p.c_str(), &st) != 0) {
    throw Error(ErrorCode::kIO,
                fmt::format("{}: statvfs failed: {}", p.string(),
                            std::error_code(errno, std::generic_category()).message()));
  }
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

std::optional<nlohmann::json> read_owner(const fs::path& file) {
  std::ifstream in(file);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return nlohmann::json::object();  // torn: owned by no one
  return j;
}

// The experiment a tier folder's owner.json names; nullopt when it is
// absent, torn or names none.
std::optional<std::string> owner_experiment(const fs::path& folder) {
  std::optional<nlohmann::json> owner = read_owner(folder / kOwnerFile);
  if (!owner) return std::nullopt;
  const auto named = owner->find("experiment");
  if (named == owner->end() || !named->is_string()) return std::nullopt;
  return named->get<std::string>();
}

void write_owner(const fs::path& file, const nlohmann::json& owner) {
  const fs::path tmp = file.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << owner.dump();
    if (!out.flush()) {
      throw Error(ErrorCode::kIO,
                  fmt::format("{}: could not write the memory tier's owner", tmp.string()));
    }
  }
  // tmpfs: nothing to fsync; the rename makes it whole or absent.
  std::error_code ec;
  fs::rename(tmp, file, ec);
  if (ec) {
    throw Error(ErrorCode::kIO, fmt::format("{}: could not write the memory tier's owner: {}",
                                            file.string(), ec.message()));
  }
}

}  // namespace

struct CheckpointManager::MemoryTier {
  struct Job {
    uint64_t index = 0;
    Checkpoint source;
  };

  CheckpointManager& outer;
  MemoryTierConfig config;
  fs::path folder;
  std::unique_ptr<CheckpointManager> store;
  std::set<std::string> reserved;  // URIs of tier reservations (outer.mu_)
  // Across hosts (manager_internal::TierAccess): persistence is the hosts',
  // and the free memory is the least any host has.
  std::function<void(uint64_t)> external_due;
  std::function<uint64_t()> free_space;
  uint64_t saves_since_persisted = 0;
  double last_persisted_at = 0;
  bool warned_full = false;

  std::mutex mu;
  std::condition_variable cv;
  std::optional<Job> pending;
  std::optional<uint64_t> in_flight;
  bool stopping = false;
  std::thread thread;

  MemoryTier(CheckpointManager& o, const MemoryTierConfig& c) : outer(o), config(c) {
    const fs::path base = tier_base(config.root);
    const fs::path root = base.parent_path();
    std::error_code ec;
    if (!fs::is_directory(root, ec)) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("MemoryTierConfig.root {}: not a folder (the memory tier needs a "
                              "RAM-backed file system such as /dev/shm)",
                              root.string()));
    }
    fs::create_directories(base, ec);
    if (ec) {
      throw Error(ErrorCode::kIO, fmt::format("{}: could not create the memory tier's folder: {}",
                                              base.string(), ec.message()));
    }
    fs::permissions(base, fs::perms::owner_all, ec);  // the user's checkpoints
    folder = base / tier_policy::tier_folder_name(outer.uri());
    const nlohmann::json owner = {{"experiment", outer.uri()}, {"created_at", outer.created_at_}};
    const fs::path owner_file = folder / kOwnerFile;
    if (auto found = read_owner(owner_file); found && *found != owner) {
      // Only a manager holding the experiment's lock (this one) opens its
      // tier, so nobody uses this folder.
      log::warn(fmt::format("{}: removing the memory tier {} of an earlier experiment at this URI",
                            outer.uri(), folder.string()));
      fs::remove_all(folder, ec);
    }
    fs::create_directories(folder, ec);
    if (ec) {
      throw Error(ErrorCode::kIO, fmt::format("{}: could not create the memory tier: {}",
                                              folder.string(), ec.message()));
    }
    if (!fs::exists(owner_file)) write_owner(owner_file, owner);

    CheckpointConfig store_config;
    store_config.num_to_keep = config.num_to_keep;
    ManagerOptions options;
    options.clock = outer.options_.clock;
    options.warn = outer.options_.warn;
    options.background_delete = false;  // freeing tmpfs pages is quick
    options.before_delete = [this](const std::vector<std::string>& doomed,
                                   const std::vector<std::string>& kept) {
      std::vector<std::string> busy;
      {
        std::lock_guard<std::mutex> g(mu);
        for (const auto& name : doomed) {
          auto index = parse_checkpoint_name(name);
          if (index && ((pending && pending->index == *index) || in_flight == *index))
            busy.push_back(name);
        }
      }
      return with_outer_hook(doomed, kept, std::move(busy));
    };
    store = std::make_unique<CheckpointManager>((folder / kCheckpointsFolder).string(),
                                                store_config, options);
    align_indices();
    last_persisted_at = outer.now();
    const uint64_t persisted_up_to = outer.records_.empty() ? 0 : outer.records_.back().index + 1;
    for (const auto& r : store->records_) saves_since_persisted += r.index >= persisted_up_to;
    log::info(fmt::format("{}: memory tier at {} holds {} checkpoint(s)", outer.uri(),
                          folder.string(), store->records_.size()));
  }

  ~MemoryTier() { stop(); }

  // A checkpoint only memory holds leaves the history when the tier's
  // retention deletes it: the outer manager's ManagerOptions::before_delete
  // hears of it (with every checkpoint either tier keeps) as of any
  // deletion, and what it defers stays too. Under outer.mu_ (the tier's
  // saves run under it, and its opening while the outer manager is built)
  // and under the tier manager's own lock, so it reads outer.records_ and
  // the tier's `tier_kept` rather than merged_records().
  std::vector<std::string> with_outer_hook(const std::vector<std::string>& doomed,
                                           const std::vector<std::string>& tier_kept,
                                           std::vector<std::string> busy) {
    if (!outer.options_.before_delete) return busy;
    auto persisted = [&](uint64_t index) {
      auto it = std::lower_bound(outer.records_.begin(), outer.records_.end(), index,
                                 [](const CheckpointRecord& r, uint64_t i) { return r.index < i; });
      return it != outer.records_.end() && it->index == index;
    };
    std::vector<std::string> lost;
    for (const auto& name : doomed) {
      auto index = parse_checkpoint_name(name);
      const bool is_busy = std::find(busy.begin(), busy.end(), name) != busy.end();
      if (index && !is_busy && !persisted(*index)) lost.push_back(name);
    }
    if (lost.empty()) return busy;
    std::set<uint64_t> kept_indices;
    for (const auto& r : outer.records_) kept_indices.insert(r.index);
    for (const auto& name : tier_kept) {
      if (auto index = parse_checkpoint_name(name)) kept_indices.insert(*index);
    }
    for (const auto& name : busy) {
      if (auto index = parse_checkpoint_name(name)) kept_indices.insert(*index);
    }
    std::vector<std::string> kept;
    for (uint64_t index : kept_indices) kept.push_back(checkpoint_name(index));
    for (auto& name : outer.options_.before_delete(lost, kept)) busy.push_back(std::move(name));
    return busy;
  }

  void stop() {
    {
      std::lock_guard<std::mutex> g(mu);
      stopping = true;
    }
    cv.notify_all();
    if (thread.joinable()) thread.join();
  }

  // Both managers hand out indices above every index either has used. Under
  // outer.mu_ (or while the outer manager is being built).
  void align_indices() {
    const uint64_t next = std::max(outer.next_index_, store->next_index_);
    outer.next_index_ = next;
    store->next_index_ = next;
  }

  uint64_t held_bytes() const {
    uint64_t held = 0;
    for (const auto& r : store->history()) held += r.size_bytes.value_or(0);
    return held;
  }

  // Whether the tier takes a checkpoint of about `estimate` bytes; false
  // (after a warning) when it falls back to persistent storage.
  bool admit(uint64_t estimate) {
    tier_policy::Space space{held_bytes(), free_space ? free_space() : free_bytes(folder),
                             config.max_bytes};
    auto why = tier_policy::shortfall(estimate, config.num_to_keep, space);
    if (!why) {
      if (warned_full)
        log::info(fmt::format("{}: the memory tier takes checkpoints again", outer.uri()));
      warned_full = false;
      return true;
    }
    const std::string message = fmt::format(
        "the memory tier {} cannot hold the next checkpoint: {}", folder.string(), *why);
    if (config.on_insufficient_memory != "persistent_only") {
      throw Error(ErrorCode::kNoSpace,
                  fmt::format("{}: {} (lower MemoryTierConfig.num_to_keep, raise max_bytes or "
                              "set on_insufficient_memory to \"persistent_only\")",
                              outer.uri(), message));
    }
    if (!warned_full)
      outer.warn(fmt::format("{}: {}; saving to persistent storage only", outer.uri(), message));
    warned_full = true;
    return false;
  }

  // The size of the tier's newest checkpoint, else the persistent one's: the
  // estimate for a reservation, whose files are not written yet.
  uint64_t estimate_next() const {
    if (auto r = store->latest(); r && r->size_bytes) return *r->size_bytes;
    if (!outer.records_.empty()) return outer.records_.back().size_bytes.value_or(0);
    return 0;
  }

  // After a tier commit (under outer.mu_): schedules persistence when due.
  void committed(const CheckpointRecord& r) {
    align_indices();
    ++saves_since_persisted;
    const double now = outer.now();
    if (!tier_policy::should_persist(config.persist_every_n, config.persist_every_minutes,
                                     saves_since_persisted, now, last_persisted_at)) {
      return;
    }
    saves_since_persisted = 0;
    last_persisted_at = now;
    if (external_due) {
      external_due(r.index);
      return;
    }
    schedule({r.index, r.checkpoint});
  }

  void schedule(Job job) {
    {
      std::lock_guard<std::mutex> g(mu);
      if (pending) {
        log::info(fmt::format("{}: persisting {} instead of {}, which was still waiting",
                              outer.uri(), checkpoint_name(job.index),
                              checkpoint_name(pending->index)));
      }
      pending = std::move(job);
      if (!thread.joinable()) thread = std::thread([this] { run(); });
    }
    cv.notify_all();
  }

  void run() {
    for (;;) {
      std::optional<Job> job;
      {
        std::unique_lock<std::mutex> g(mu);
        cv.wait(g, [&] { return stopping || pending; });
        if (stopping) return;
        job.swap(pending);
        in_flight = job->index;
      }
      try {
        outer.persist(job->index, job->source);
      } catch (const Error& e) {
        // ignore-error: the checkpoint stays committed in memory and the
        // next due one is persisted; the close persists the newest.
        outer.warn(
            fmt::format("{}: persisting {} in the background failed; it stays in the "
                        "memory tier: {}",
                        outer.uri(), checkpoint_name(job->index), e.what()));
      }
      {
        std::lock_guard<std::mutex> g(mu);
        in_flight.reset();
      }
      cv.notify_all();
    }
  }

  void wait_idle() {
    std::unique_lock<std::mutex> g(mu);
    cv.wait(g, [&] { return !pending && !in_flight; });
  }

  // `r` of the tier as the outer manager reports it: its persistent copy's
  // pin, if it has one (under outer.mu_).
  CheckpointRecord as_memory(CheckpointRecord r) const {
    auto it = std::lower_bound(outer.records_.begin(), outer.records_.end(), r.index,
                               [](const CheckpointRecord& a, uint64_t i) { return a.index < i; });
    r.tier = "memory";
    r.persisted = it != outer.records_.end() && it->index == r.index;
    if (r.persisted) r.pinned = it->pinned;
    return r;
  }
};

void CheckpointManager::MemoryTierDeleter::operator()(MemoryTier* tier) const { delete tier; }

std::optional<CheckpointRecord> CheckpointManager::latest_intact(
    std::vector<std::string>* dropped) {
  for (;;) {
    std::optional<CheckpointRecord> r = latest();
    if (!r || r->tier != "memory") return r;
    const std::vector<VerifyProblem> problems = r->checkpoint.verify();
    if (problems.empty()) return r;
    const std::string why = fmt::format(
        "{}: {} in the memory tier is damaged ({}: {}{}); dropped from memory, taking the "
        "next copy",
        uri(), r->name, r->checkpoint.storage().uri_of(problems.front().path),
        problems.front().reason,
        problems.size() > 1 ? fmt::format(", and {} more", problems.size() - 1) : "");
    warn(why);
    if (dropped) dropped->push_back(why);
    drop_from_memory(r->index);
  }
}

void CheckpointManager::drop_from_memory(uint64_t index) {
  std::lock_guard<std::mutex> g(mu_);
  if (!tier_) return;
  {
    // Not persisted from memory any more; a copy under way fails its
    // checks against the manifest (a warning) and is not recorded.
    std::lock_guard<std::mutex> t(tier_->mu);
    if (tier_->pending && tier_->pending->index == index) tier_->pending.reset();
  }
  CheckpointManager& store = *tier_->store;
  std::lock_guard<std::mutex> s(store.mu_);
  store.remove_committed_locked({index});
}

void CheckpointManager::open_memory_tier() {
  if (config_.memory_tier.enabled) tier_.reset(new MemoryTier(*this, config_.memory_tier));
}

std::optional<CheckpointRecord> CheckpointManager::register_in_memory(
    const nlohmann::json& metrics, const Checkpoint& checkpoint) {
  std::lock_guard<std::mutex> g(mu_);
  if (!tier_) return std::nullopt;
  check_score(metrics, checkpoint.uri());
  uint64_t estimate = 0;
  try {
    for (const auto& f : checkpoint.files()) estimate += f.size;
  } catch (const Error& e) {
    throw with_context(e, fmt::format("registering {}", checkpoint.uri()));
  }
  if (!tier_->admit(estimate)) return std::nullopt;
  tier_->align_indices();
  CheckpointRecord r = tier_->store->register_checkpoint(metrics, checkpoint);
  tier_->committed(r);
  return tier_->as_memory(std::move(r));
}

std::optional<Checkpoint> CheckpointManager::reserve_in_memory() {
  std::lock_guard<std::mutex> g(mu_);
  if (!tier_ || !tier_->admit(tier_->estimate_next())) return std::nullopt;
  tier_->align_indices();
  Checkpoint c = tier_->store->reserve_next();
  tier_->align_indices();
  tier_->reserved.insert(c.uri());
  return c;
}

std::optional<CheckpointRecord> CheckpointManager::commit_in_memory(
    const Checkpoint& reserved, const nlohmann::json& metrics,
    const std::vector<ManifestEntry>& files, const nlohmann::json& layout,
    const nlohmann::json* metadata, const nlohmann::json& ranks) {
  std::lock_guard<std::mutex> g(mu_);
  if (!tier_ || !tier_->reserved.count(reserved.uri())) return std::nullopt;
  check_score(metrics, reserved.uri());
  CheckpointRecord r =
      tier_->store->commit_reserved(reserved, metrics, files, layout, metadata, ranks);
  tier_->reserved.erase(reserved.uri());
  tier_->committed(r);
  return tier_->as_memory(std::move(r));
}

bool CheckpointManager::reserved_in_memory_locked(const Checkpoint& reserved) const {
  return tier_ && tier_->reserved.count(reserved.uri()) > 0;
}

bool CheckpointManager::abandon_in_memory(const Checkpoint& reserved) {
  std::lock_guard<std::mutex> g(mu_);
  if (!tier_ || !tier_->reserved.erase(reserved.uri())) return false;
  tier_->store->abandon_reserved(reserved);
  return true;
}

void CheckpointManager::persist(uint64_t index, const Checkpoint& source,
                                const std::vector<ManifestEntry>* written) {
  Checkpoint dest(storage_->child(checkpoint_name(index)));
  Manifest manifest;
  try {
    const Manifest from = source.manifest();
    CheckpointWriter writer(dest);
    if (written) {
      writer.add_written(*written);
    } else {
      writer.copy_from(source);
    }
    if (!from.layout.is_null()) writer.set_layout(from.layout);
    if (!from.ranks.is_null()) writer.set_ranks(from.ranks);
    std::optional<nlohmann::json> metadata;
    if (source.storage().exists(kMetadataKey)) metadata = source.get_metadata();
    manifest = writer.commit(from.metrics, from.created_at, metadata ? &*metadata : nullptr);
  } catch (const Error& e) {
    discard_failed(dest);
    throw with_context(e, fmt::format("persisting {} as {}", source.uri(), dest.uri()));
  }
  std::lock_guard<std::mutex> g(mu_);
  next_index_ = std::max(next_index_, index + 1);
  CheckpointRecord record = add_record(index, dest, manifest);
  settle(fmt::format("persisting {} as {}", source.uri(), dest.uri()), add_change(record));
}

void CheckpointManager::wait_for_persistence() {
  if (tier_) tier_->wait_idle();
}

void CheckpointManager::release_memory_tier() {
  if (!tier_) return;
  tier_->wait_idle();
  std::optional<CheckpointRecord> newest = tier_->store->latest();
  bool persisted = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    // Persistent storage holds it, or a newer one saved there directly.
    persisted = !newest || (!records_.empty() && records_.back().index >= newest->index);
  }
  if (newest) persist_what_the_hook_keeps(*newest);
  if (!persisted) persist(newest->index, newest->checkpoint);
  std::unique_ptr<MemoryTier, MemoryTierDeleter> tier;
  {
    std::lock_guard<std::mutex> g(mu_);
    tier = std::move(tier_);
  }
  tier->stop();
  const fs::path folder = tier->folder;
  tier.reset();  // the tier manager's lock goes with it
  std::error_code ec;
  fs::remove_all(folder, ec);
  if (ec)
    warn(fmt::format("{}: freeing the memory tier {} failed: {}", uri(), folder.string(),
                     ec.message()));
}

// The checkpoints only memory holds, older than `newest`, leave the history
// with the tier: ManagerOptions::before_delete hears of them first, as of
// any deletion, and those it keeps (a Tuner's saved state still names
// them) are persisted instead, oldest first.
void CheckpointManager::persist_what_the_hook_keeps(const CheckpointRecord& newest) {
  if (!options_.before_delete) return;
  std::vector<CheckpointRecord> memory_only;
  std::vector<std::string> kept;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (const auto& r : merged_records()) {
      if (r.tier == "memory" && !r.persisted && r.index < newest.index) {
        memory_only.push_back(r);
      } else {
        kept.push_back(r.name);
      }
    }
  }
  if (memory_only.empty()) return;
  std::vector<std::string> doomed;
  for (const auto& r : memory_only) doomed.push_back(r.name);
  std::vector<std::string> keep = doomed;
  try {
    keep = options_.before_delete(doomed, kept);
  } catch (const std::exception& e) {
    // ignore-error: a failed hook defers, as for any deletion; they are persisted
    warn(fmt::format("{}: before freeing the memory tier: {}", uri(), e.what()));
  }
  for (const auto& r : memory_only) {
    if (std::find(keep.begin(), keep.end(), r.name) != keep.end()) persist(r.index, r.checkpoint);
  }
}

std::vector<CheckpointRecord> CheckpointManager::merged_records() const {
  std::vector<CheckpointRecord> out = records_;
  if (!tier_) return out;
  for (const auto& r : tier_->store->history()) {
    auto it = std::lower_bound(out.begin(), out.end(), r.index,
                               [](const CheckpointRecord& a, uint64_t i) { return a.index < i; });
    CheckpointRecord m = tier_->as_memory(r);
    if (m.persisted) {
      *it = std::move(m);
    } else {
      out.insert(it, std::move(m));
    }
  }
  return out;
}

fs::path memory_tier_folder(std::string_view experiment_uri, std::string_view root) {
  return tier_base(root) / tier_policy::tier_folder_name(experiment_uri);
}

fs::path memory_tier_checkpoints(const fs::path& tier) { return tier / kCheckpointsFolder; }

fs::path memory_tier_owner(const fs::path& tier) { return tier / kOwnerFile; }

std::optional<std::string> find_memory_tier(std::string_view experiment_uri,
                                            std::string_view root) {
  const fs::path folder = memory_tier_folder(experiment_uri, root);
  if (owner_experiment(folder) != experiment_uri) return std::nullopt;
  const fs::path checkpoints = folder / kCheckpointsFolder;
  std::error_code ec;
  if (!fs::is_directory(checkpoints, ec)) return std::nullopt;
  return open_storage(checkpoints.string())->uri();
}

std::set<uint64_t> merge_memory_tier(std::string_view experiment_uri, ExperimentListing& listing) {
  std::set<uint64_t> held;
  if (!listing.config.memory_tier.enabled) return held;
  const std::optional<std::string> tier =
      find_memory_tier(experiment_uri, listing.config.memory_tier.root);
  if (!tier) return held;
  ExperimentListing memory = read_experiment(*tier);
  std::set<uint64_t> persisted;
  for (const auto& r : listing.checkpoints) persisted.insert(r.index);
  for (auto& r : memory.checkpoints) {
    held.insert(r.index);
    if (persisted.count(r.index) > 0) continue;
    r.tier = "memory";
    r.persisted = false;
    listing.checkpoints.push_back(std::move(r));
  }
  std::stable_sort(
      listing.checkpoints.begin(), listing.checkpoints.end(),
      [](const CheckpointRecord& a, const CheckpointRecord& b) { return a.index < b.index; });
  return held;
}

namespace manager_internal {

void TierAccess::spread(CheckpointManager& m, std::function<void(uint64_t)> due,
                        std::function<uint64_t()> free_space) {
  std::lock_guard<std::mutex> g(m.mu_);
  if (!m.tier_) {
    throw Error(ErrorCode::kFailedPrecondition,
                fmt::format("{}: has no memory tier to spread across hosts", m.uri()));
  }
  m.tier_->store->files_elsewhere_ = true;
  m.tier_->external_due = std::move(due);
  m.tier_->free_space = std::move(free_space);
}

std::optional<fs::path> TierAccess::folder(const CheckpointManager& m) {
  std::lock_guard<std::mutex> g(m.mu_);
  if (!m.tier_) return std::nullopt;
  return m.tier_->folder;
}

std::optional<Checkpoint> TierAccess::in_memory(const CheckpointManager& m, uint64_t index) {
  std::lock_guard<std::mutex> g(m.mu_);
  if (!m.tier_) return std::nullopt;
  for (const auto& r : m.tier_->store->history()) {
    if (r.index == index) return r.checkpoint;
  }
  return std::nullopt;
}

std::vector<std::string> TierAccess::kept(const CheckpointManager& m) {
  std::lock_guard<std::mutex> g(m.mu_);
  std::vector<std::string> out;
  if (!m.tier_) return out;
  for (const auto& r : m.tier_->store->history()) out.push_back(checkpoint_name(r.index));
  return out;
}

void TierAccess::persisting(CheckpointManager& m, std::optional<uint64_t> index) {
  std::lock_guard<std::mutex> g(m.mu_);
  if (!m.tier_) return;
  {
    std::lock_guard<std::mutex> t(m.tier_->mu);
    m.tier_->in_flight = index;
  }
  m.tier_->cv.notify_all();
}

Checkpoint TierAccess::persistent_location(const CheckpointManager& m, uint64_t index) {
  return Checkpoint(m.storage_->child(checkpoint_name(index)));
}

void TierAccess::commit_persisted(CheckpointManager& m, uint64_t index, const Checkpoint& source,
                                  const std::vector<ManifestEntry>& files) {
  m.persist(index, source, &files);
}

std::optional<CheckpointRecord> TierAccess::unpersisted_newest(const CheckpointManager& m) {
  std::lock_guard<std::mutex> g(m.mu_);
  if (!m.tier_) return std::nullopt;
  std::optional<CheckpointRecord> newest = m.tier_->store->latest();
  if (!newest || (!m.records_.empty() && m.records_.back().index >= newest->index)) {
    return std::nullopt;
  }
  return newest;
}

}  // namespace manager_internal

GcReport collect_memory_tiers(std::string_view root, bool dry_run) {
  GcReport report;
  const fs::path base = tier_base(root);
  std::error_code ec;
  if (!fs::is_directory(base.parent_path(), ec)) {
    throw Error(ErrorCode::kNotFound, fmt::format("{}: no such folder (the memory tiers' root)",
                                                  base.parent_path().string()));
  }
  if (!fs::is_directory(base, ec)) return report;
  for (const auto& entry : fs::directory_iterator(base)) {
    if (!entry.is_directory()) continue;
    const fs::path folder = entry.path();
    const fs::path checkpoints = folder / kCheckpointsFolder;
    const std::string experiment = owner_experiment(folder).value_or("?");
    bool live = false;
    std::unique_ptr<Lock> lock;
    if (fs::is_directory(checkpoints)) {
      auto storage = open_storage(checkpoints.string());
      if (dry_run) {
        live = storage->is_locked(manager_layout::kLockKey);
      } else {
        try {
          lock = storage->try_lock(manager_layout::kLockKey);
        } catch (const Error& e) {
          if (e.code() != ErrorCode::kLocked) throw;
          live = true;
        }
      }
    }
    if (live) {
      report.skipped.push_back(fmt::format("{} (memory tier of {}): in use by a live manager",
                                           folder.string(), experiment));
      continue;
    }
    // Removed while the lock is held, so that no manager opens it meanwhile
    // (unlinking a locked file is allowed).
    if (!dry_run) {
      fs::remove_all(folder, ec);
      if (ec) {
        throw Error(ErrorCode::kIO, fmt::format("{}: could not remove the memory tier: {}",
                                                folder.string(), ec.message()));
      }
    }
    report.removed.push_back(fmt::format("{} (memory tier of {})", folder.string(), experiment));
  }
  return report;
}

}  // namespace cairn
