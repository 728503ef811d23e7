// CheckpointManager: the checkpoints of one experiment, with retention.
//
// Layout of an experiment directory (any storage URI):
//
//   <experiment>/.cairn.lock               held by the one manager writing it
//   <experiment>/checkpoint_manager.json   history and retention bookkeeping
//                                          (snapshot; JSON, readable by older
//                                          versions)
//   <experiment>/checkpoint_manager.log/   changes since the snapshot, one
//                                          small checksummed object each
//   <experiment>/checkpoint_000000/ ...    committed checkpoints (see commit.h)
//
// Checkpoint names sort in index order forever: six zero-padded digits up to
// 999,999, then a letter giving the extra width ('a' = 7 digits, 'b' = 8, ...)
// followed by the digits: checkpoint_999999 < checkpoint_a1000000 <
// checkpoint_b10000000. Letters sort after digits in every locale's byte order.
//
// Retention (CheckpointConfig):
//   - keep everything by default;
//   - with num_to_keep = K and a score attribute ("a/b" names both a flat key
//     "a/b" and the nested metrics["a"]["b"], the flat key winning), keep
//     the K best by score in `order` ("max" or "min"); without an attribute,
//     the K most recent;
//   - ties keep the newer; NaN ranks worst; a checkpoint reported without the
//     attribute gets a warning and ranks worst whatever the order;
//   - checkpoints pinned by keep_checkpoint_every_n_hours (one every N hours of
//     the clock) are never deleted; they still count toward the K while they
//     rank among the K best;
//   - the most recent checkpoint is never deleted.
//
// Durability and cost: registering a checkpoint appends one small record to
// the history's log (one object write, fsync'd on file systems), whatever the
// number of checkpoints kept; the log is folded into a new snapshot (atomic
// replace) once it holds more than max(64, kept / 8) records, so the cost is
// O(1) amortized and opening reads a bounded log. Opening lists the
// experiment once and reads a manifest only for a checkpoint the history
// does not hold.
//
// Crash safety: opening a manager takes the experiment lock, removes the
// leftovers of interrupted saves and deletions (checkpoints without a
// manifest or with a torn one: Manifest::torn), and reconciles the persisted
// history with what is committed on storage (a checkpoint committed just
// before a crash is adopted with the metrics in its manifest; a history
// snapshot torn by an interrupted write is rebuilt from the manifests, with
// a warning), then applies the retention policy (so opening with a smaller
// num_to_keep deletes).
//
// Thread-safety: a manager may be used from several threads; calls are
// serialized. Only one manager per experiment may exist at a time, across all
// processes (kLocked otherwise).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cairn/checkpoint.h"

namespace cairn {

namespace manager_internal {
struct TierAccess;  // src/manager/tier_access.h: the Trainer's multi-host memory tier
}  // namespace manager_internal

// The memory tier (docs/memory-tier.md): checkpoints kept in this host's RAM,
// on a RAM-backed file system (tmpfs) whose files outlive the processes that
// wrote them, so that a restart after a crash of the training processes reads
// the newest state from memory instead of persistent storage; every N-th
// checkpoint, or one every T minutes, is also persisted to the experiment's
// storage on a background thread. Both tiers commit manifest-last: a
// checkpoint is in a tier once its manifest is there, whole.
//
// A manager's tier lives on its host: it serves saves made there
// (CheckpointManager, StateCheckpointManager, the Trainer's local launcher
// and a launch whose ranks all run on one host). A Trainer under mpirun
// whose ranks span several hosts keeps a copy of the tier on every host and
// replicates each host's files to another host's memory (docs/memory-tier.md,
// "Across hosts"); under the torchrun-style launcher or an elastic group
// such a Trainer saves to persistent storage only, with a warning.
struct MemoryTierConfig {
  bool enabled = false;
  // A folder on a RAM-backed file system. Empty: $CAIRN_MEMORY_TIER_DIR,
  // else /dev/shm. An experiment's tier is <root>/cairn-tier-<uid>/<id>/,
  // <id> derived from the experiment's URI.
  std::string root;
  // The newest checkpoints kept in memory; >= 1. A checkpoint being
  // persisted stays until its persistent copy is committed.
  int num_to_keep = 2;
  // Every N-th checkpoint saved to the tier is also persisted (0: not by
  // count); >= 0.
  int persist_every_n = 10;
  // A checkpoint is persisted once this many minutes have passed since the
  // last persisted one (or since the manager opened); 0: not by time; >= 0.
  double persist_every_minutes = 0;
  // The most bytes this experiment's tier may hold; 0: as much as its file
  // system has free.
  uint64_t max_bytes = 0;
  // A save that the tier cannot hold (num_to_keep checkpoints of its size
  // plus the one being written, within max_bytes and the free space):
  //   "error": kNoSpace naming the tier, its need and what is
  //     free; nothing is written;
  //   "persistent_only": saved to persistent storage, with a warning.
  std::string on_insufficient_memory = "error";
  // Across hosts (a Trainer under mpirun whose ranks span hosts): how many
  // other hosts' memory holds a replica of each host's files, the next ones
  // in a ring of the hosts; >= 0. With fewer other hosts, every other host
  // does. A checkpoint survives the loss of up to this many hosts at once.
  int replicas = 1;
  // Across hosts: a restored job moves to each host only the files its
  // ranks wrote (the manifest keeps each file's ranks), not the whole
  // checkpoint, so a rank may read only the files its own rank passed to
  // report() (other ranks' files may be absent from its folder). false: every
  // host is made to hold every file, and any rank may read any rank's files.
  bool ranks_read_own_files = false;

  bool operator==(const MemoryTierConfig&) const = default;
};

struct CheckpointConfig {
  std::optional<int> num_to_keep;                       // unset: keep all; must be >= 1
  std::string checkpoint_score_attribute;               // empty: rank by recency
  std::string checkpoint_score_order = "max";           // "max" or "min"
  std::optional<double> keep_checkpoint_every_n_hours;  // must be > 0
  // When a Tuner's class trainable (cairn/tuner.h) saves: every N-th
  // iteration (0: never by count) and after its last one. A function
  // trainable (Trainer or Tuner) decides in its own loop, so those refuse
  // them (kInvalidArgument; an unset checkpoint_at_end is not refused); the
  // manager ignores them. Not part of to_json(): they are not retention.
  int checkpoint_frequency = 0;  // >= 0
  // Unset: Ray's default, on for a class trainable (its last state is
  // kept) and off for a function trainable.
  std::optional<bool> checkpoint_at_end;
  // The memory tier (above); off by default. Stored in to_json() when on,
  // so that an experiment reopened from its stored configuration (
  // Trainer::restore) finds the checkpoints its tier holds.
  MemoryTierConfig memory_tier;

  // Throws kInvalidArgument naming the bad field.
  void validate() const;

  // The JSON form persisted with an experiment's history (unset options are
  // null). from_json() takes what it can and leaves defaults for the rest;
  // a field of the wrong type is a nlohmann::json::type_error.
  nlohmann::json to_json() const;
  static CheckpointConfig from_json(const nlohmann::json& j);
};

struct CheckpointRecord {
  CheckpointRecord(uint64_t index, Checkpoint checkpoint);
  uint64_t index = 0;
  std::string name;         // "checkpoint_000012"
  nlohmann::json metrics;   // as reported
  double created_at = 0.0;  // seconds since the Unix epoch
  bool pinned = false;      // kept by keep_checkpoint_every_n_hours
  Checkpoint checkpoint;    // where it lives
  // Its files' total size and number, from its manifest as the history
  // recorded them at commit; absent for a checkpoint an older Cairn recorded
  // (its manifest has them).
  std::optional<uint64_t> size_bytes;
  std::optional<uint64_t> file_count;
  // Where `checkpoint` lives: "persistent" (the experiment's storage) or
  // "memory" (the memory tier; MemoryTierConfig). A checkpoint in both is
  // reported once, as its memory copy, with `persisted` true.
  std::string tier = "persistent";
  bool persisted = true;
};

struct ManagerOptions {
  // Seconds since the Unix epoch; injected so retention by hours is testable.
  std::function<double()> clock;
  // Receives warnings (a checkpoint without the score attribute, an adopted
  // or dropped record). Defaults to the log.
  std::function<void(const std::string&)> warn;
  // Called before retention deletes checkpoints, with the names it is about
  // to delete and the names kept after, oldest first; returns the names among
  // `doomed` to keep for now (a Tuner's experiment state must never name a
  // deleted checkpoint: it defers deleting those its saved state still names
  // until its next save). A deferred checkpoint stays committed and in the
  // history, and retention asks again on the next save or open. An exception
  // leaves them all in place, as a deferral. With a memory tier it also
  // hears of checkpoints only memory holds as they leave (the tier's
  // retention; release_memory_tier(), which persists those it keeps), and
  // it is called from the saving thread or the tier's persister, one call
  // at a time: it must not call the manager.
  std::function<std::vector<std::string>(const std::vector<std::string>& doomed,
                                         const std::vector<std::string>& kept)>
      before_delete;
  // Frees the space of the checkpoints retention removes on a background
  // thread (as Orbax's enable_background_delete), so that a save does not
  // wait for it: unlinking 2 GiB costs about 0.3 s on a file system with
  // online discard. A retired checkpoint still leaves the experiment inside
  // the save: its manifest is deleted (uncommitted), then, where the storage
  // renames (file systems, memory), each of its files is moved into the
  // experiment's trash folder (`.cairn.trash/<name>/`, a rename each,
  // whatever the size) and its folder removed, so that listings and
  // `exists()` no longer see it when the save returns; on an object store
  // its objects stay in its folder, uncommitted, until the deleter removes
  // them. The deleter then frees them in order. wait_for_deletes() and the
  // destructor wait for the pending deletions (the experiment's lock is held
  // until then); the next save (reserve_next, register_checkpoint) first
  // waits for those queued before it, so the disk never holds more than with
  // deletion in the save, and the deletion overlaps whatever the program does
  // between saves. A failed deletion is a warning (given to `warn` on the
  // deleter's thread); what a crash leaves (the trash, an uncommitted
  // folder) the next open removes. The leftovers an open finds go the same
  // way. False: every deletion completes inside the call that retires it.
  // (An AsyncSaver reserves in the save() call without waiting and waits on
  // its writer thread before it writes, prepare_reserved(): an async save
  // issued while a deletion is pending stalls only for its snapshot.)
  bool background_delete = true;
};

// A name for index `index`, and the index of a name (nullopt if not one).
std::string checkpoint_name(uint64_t index);
std::optional<uint64_t> parse_checkpoint_name(std::string_view name);

class CheckpointManager {
  friend struct manager_internal::TierAccess;

 public:
  // Opens (creating if needed) the experiment at `experiment_uri`.
  CheckpointManager(std::string_view experiment_uri, CheckpointConfig config,
                    ManagerOptions options = {});
  ~CheckpointManager();
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  // Persists `checkpoint`'s files as the next checkpoint_NNNNNN, commits it,
  // records `metrics` and applies retention. Returns the new record.
  //
  // Failure is exact: if this throws, nothing committed before is lost, the
  // new checkpoint is not visible and no retention ran. A source that does
  // not exist is kNotFound, a local source that is not a directory
  // kInvalidArgument; a score attribute that is present but not a number,
  // metrics that are not an object, nested deeper than 128 levels or holding
  // invalid UTF-8 are kInvalidArgument — all before anything is written.
  // Once the checkpoint is committed the call succeeds: if writing the
  // history or deleting by retention fails afterwards (a full disk), that is
  // a warning (ManagerOptions::warn), retention still runs to free space,
  // and the history is rewritten by the next call, the destructor or the
  // next open, which rebuilds it from the committed manifests anyway.
  CheckpointRecord register_checkpoint(const nlohmann::json& metrics, const Checkpoint& checkpoint);

  // Commits a checkpoint whose files other processes already wrote into
  // reserve_next()'s location (the distributed Trainer's path). The index is
  // persisted in the history before reserve_next() returns, so it is never
  // handed out again, even after a crash. kFailedPrecondition once every
  // index below 2^64-1 has been used.
  //
  // kNow (the default) first waits for the deletions earlier saves queued
  // (ManagerOptions::background_delete), so that the disk never holds more
  // than with deletion inside the save, and persists the index: the
  // location is ready to be written into. kDeferred only takes the index,
  // at once, without I/O; prepare_reserved() must make the location ready
  // before anything is written into it (an AsyncSaver reserves in save()
  // and prepares on its writer thread, so that save() stalls for neither).
  // An index taken but never prepared, if the process dies, may be handed
  // out again: nothing was written there.
  enum class Reservation { kNow, kDeferred };
  Checkpoint reserve_next(Reservation how = Reservation::kNow);
  // Makes a kDeferred reservation ready: waits for the pending deletions
  // and persists its index (kNow's work). kFailedPrecondition if `reserved`
  // is not a reservation of this manager; a failure to persist as
  // reserve_next()'s (the reservation stays; abandon it).
  void prepare_reserved(const Checkpoint& reserved);
  // Each entry is checked to exist with its size before the manifest is
  // written; `layout` goes into Manifest::layout, `ranks` into
  // Manifest::ranks and `metadata`, when given, into the checkpoint's
  // metadata. Failure as for register_checkpoint.
  CheckpointRecord commit_reserved(const Checkpoint& reserved, const nlohmann::json& metrics,
                                   const std::vector<ManifestEntry>& files,
                                   const nlohmann::json& layout = nullptr,
                                   const nlohmann::json* metadata = nullptr,
                                   const nlohmann::json& ranks = nullptr);
  // Gives up a reservation after a failed distributed save: removes whatever
  // was written there and forgets it. Its index is not reused.
  void abandon_reserved(const Checkpoint& reserved);

  // Blocks until the data of every checkpoint retention (or the open's
  // repair) has removed so far is deleted and its space freed
  // (ManagerOptions::background_delete; nothing to wait for without it).
  void wait_for_deletes();

  // With the memory tier: waits for the background persistence, persists
  // the newest checkpoint if only memory holds it, and frees the tier (its
  // folder is removed); later saves go to persistent storage only. The
  // destructor does it too. A failure to persist throws (the tier is then
  // kept, for the next open or `cairn gc`); nothing to do without the tier.
  // Not concurrently with saves on other threads.
  void release_memory_tier();
  // With the memory tier: blocks until every persistence scheduled so far
  // has finished (committed, or failed with a warning). Nothing to wait for
  // without the tier.
  void wait_for_persistence();

  // The newest checkpoint across the tiers (its memory copy when both hold it).
  std::optional<CheckpointRecord> latest() const;
  // latest(), checked where a copy in memory is what it names: that copy is
  // verified against its manifest's checksums (a bit flip in RAM), and a
  // damaged one is dropped from the memory tier with a warning naming the
  // file, its description appended to `dropped` when given, and the next
  // copy taken: the persistent copy of the same checkpoint, else the next
  // newest in either tier. A persistent copy is returned unverified. Without
  // the memory tier, latest(). Not concurrently with saves on other threads.
  std::optional<CheckpointRecord> latest_intact(std::vector<std::string>* dropped = nullptr);
  // Every kept checkpoint, best first (by score, or newest first without one).
  // With the memory tier, the checkpoints of both tiers, each once.
  std::vector<CheckpointRecord> best() const;
  // Every kept checkpoint in index order.
  std::vector<CheckpointRecord> history() const;

  const CheckpointConfig& config() const { return config_; }
  std::string uri() const;

 private:
  static constexpr uint64_t kNoMoreIndex = UINT64_MAX;
  // Log records past which the destructor folds the log into a snapshot.
  static constexpr uint64_t kCloseCompactAbove = 64;

  void open();
  // The memory tier's side (src/manager/memory_tier.cc). The *_in_memory
  // calls return nullopt/false when the tier does not take the call (off,
  // full and falling back, or a persistent reservation).
  void open_memory_tier();
  // Removes the memory tier's copy of checkpoint `index` (a damaged one).
  void drop_from_memory(uint64_t index);
  // Deletes committed checkpoints `doomed` of this manager, as retention
  // does: the deletion announced in the history, each manifest first, then
  // its data. Call with mu_ held.
  void remove_committed_locked(const std::vector<uint64_t>& doomed);
  // The deletions of announced checkpoints `doomed` (those still recorded),
  // their indices appended to `removed`. Call with mu_ held.
  void delete_announced(const std::vector<uint64_t>& doomed, std::vector<uint64_t>& removed);
  std::optional<CheckpointRecord> register_in_memory(const nlohmann::json& metrics,
                                                     const Checkpoint& checkpoint);
  std::optional<Checkpoint> reserve_in_memory();
  std::optional<CheckpointRecord> commit_in_memory(const Checkpoint& reserved,
                                                   const nlohmann::json& metrics,
                                                   const std::vector<ManifestEntry>& files,
                                                   const nlohmann::json& layout,
                                                   const nlohmann::json* metadata,
                                                   const nlohmann::json& ranks);
  bool abandon_in_memory(const Checkpoint& reserved);
  // Whether `reserved` is the tier's (ready when taken). Call with mu_.
  bool reserved_in_memory_locked(const Checkpoint& reserved) const;
  // Copies tier checkpoint `source` into this experiment at `index` and
  // records it (the persister's work). With `written`, the files are there
  // already (the hosts of a memory tier across hosts wrote them) and are
  // only checked to exist with their sizes.
  void persist(uint64_t index, const Checkpoint& source,
               const std::vector<ManifestEntry>* written = nullptr);
  // The records of both tiers, one per index (under mu_).
  std::vector<CheckpointRecord> merged_records() const;
  // On releasing the tier: the checkpoints only memory holds, older than
  // `newest`, go through before_delete; those it keeps are persisted.
  void persist_what_the_hook_keeps(const CheckpointRecord& newest);
  uint64_t take_index();
  // Writes the whole history as a new snapshot and removes the log objects
  // it folds in (src/manager/history.h).
  void compact();
  // Appends one change to the history's log (or compacts, when the log has
  // grown past its bound or an earlier write failed). Throws on failure,
  // leaving the history marked stale for the next call to rewrite.
  void append_change(nlohmann::json change);
  nlohmann::json add_change(const CheckpointRecord& record) const;
  // Deletes what the policy says; `removed` gets each index deleted, also
  // when a later deletion throws.
  void apply_retention(std::vector<uint64_t>& removed);
  // Records in the history that `doomed` are about to be deleted, before
  // any manifest goes; if it cannot, removes the snapshot so that the next
  // open does not trust the history. Throws (deleting nothing) when neither
  // is possible.
  void announce_deletion(const std::vector<uint64_t>& doomed);
  // Removes the data of the uncommitted checkpoint folder `name`: here, or
  // with background deletion moved into the trash (where the storage
  // renames) and freed by the deleter (ManagerOptions::background_delete).
  void dispose(const std::string& name);
  // Queues an uncommitted folder for the deleter's thread.
  void release(const Checkpoint& uncommitted);
  // Fills `r`'s size and file count from its manifest (a record an older
  // Cairn wrote); false when the manifest cannot be read.
  bool recount(CheckpointRecord& r) const;
  // Open: reads the newest record's manifest (unless it is among `read`, the
  // manifests the open parsed already); while it cannot be read (a
  // checkpoint damaged after its commit), warns naming it and drops its
  // record (the checkpoint stays on storage). Returns whether any was dropped.
  bool set_aside_damaged_latest(const std::map<uint64_t, std::string>& read);
  // Bookkeeping after a commit (or open): records `change`, applies
  // retention, failing only into warnings. See register_checkpoint.
  void settle(std::string_view subject, const std::optional<nlohmann::json>& change);
  void check_score(const nlohmann::json& metrics, std::string_view subject) const;
  void discard_failed(const Checkpoint& dest);
  CheckpointRecord add_record(uint64_t index, const Checkpoint& where, const Manifest& manifest);
  double now() const;
  void warn(const std::string& message) const;

  CheckpointConfig config_;
  ManagerOptions options_;
  std::shared_ptr<Storage> storage_;
  std::unique_ptr<Lock> lock_;
  mutable std::mutex mu_;
  std::vector<CheckpointRecord> records_;  // index order
  uint64_t next_index_ = 0;
  double created_at_ = 0.0;  // the experiment's start, the first pin's reference
  std::optional<double> last_pinned_at_;
  bool history_stale_ = false;      // storage's history must be rewritten whole (compact())
  uint64_t next_seq_ = 1;           // the next log record's sequence number
  uint64_t log_records_ = 0;        // log records after the snapshot
  std::vector<uint64_t> log_seqs_;  // log objects on storage (to remove on compaction)
  std::map<std::string, uint64_t> reserved_;  // uri -> index, awaiting commit_reserved
  std::set<std::string> unprepared_;          // kDeferred reservations, index not persisted
  // Checkpoints whose deletion the history announced and that are still in
  // records_ (a deletion that failed midway): compact() flags them.
  std::set<uint64_t> deleting_;
  // ManagerOptions::background_delete's thread and queue (src/manager/manager.cc).
  struct Deleter;
  std::unique_ptr<Deleter> deleter_;
  // The memory tier's manager, persister and policy (src/manager/memory_tier.cc).
  struct MemoryTier;
  struct MemoryTierDeleter {
    void operator()(MemoryTier* tier) const;
  };
  std::unique_ptr<MemoryTier, MemoryTierDeleter> tier_;
  // commit_reserved() records the entries unchecked: their files live on
  // other hosts' copies of the location (the tier manager of a memory tier
  // across hosts; manager_internal::TierAccess).
  bool files_elsewhere_ = false;
};

// The experiment as stored, read without taking the lock or changing
// anything: for `cairn ls`, Result::from_path and monitoring.
struct ExperimentListing {
  std::string uri;
  CheckpointConfig config;                    // as last persisted
  std::vector<CheckpointRecord> checkpoints;  // committed, index order
  std::vector<std::string> uncommitted;       // names of leftover directories
  // Committed checkpoints the history does not list whose manifest cannot be
  // read (damaged after the commit): name -> why. Kept, never removed.
  std::map<std::string, std::string> damaged;
};
ExperimentListing read_experiment(std::string_view experiment_uri);

// `records` best first under `config`'s ranking (as CheckpointManager::best).
std::vector<CheckpointRecord> rank_checkpoints(const std::vector<CheckpointRecord>& records,
                                               const CheckpointConfig& config);

// Experiments at or directly below `uri` (relative names; "" when `uri` is an
// experiment itself). An experiment is a folder holding checkpoint_manager.json
// or checkpoint_* folders.
std::vector<std::string> find_experiments(std::string_view uri);

struct GcReport {
  std::vector<std::string> removed;  // URIs of what was removed
  // Experiments skipped, and damaged checkpoints kept (a committed one whose
  // manifest cannot be read is never removed), each with the reason.
  std::vector<std::string> skipped;
};
// Removes the leftovers of interrupted saves and deletions (uncommitted
// checkpoint folders, temp files, empty folders) in every experiment at or
// below `uri`, and this node's views of remote checkpoints (as_directory)
// that no live process uses any more. An experiment whose lock is held by a
// live writer is skipped (its in-flight save looks like a leftover). With
// `dry_run`, reports what would be removed and changes nothing, not even a
// lock file.
GcReport collect_garbage(std::string_view uri, bool dry_run = false);

// Frees the memory tiers (MemoryTierConfig) of this user under `root` (empty:
// $CAIRN_MEMORY_TIER_DIR, else /dev/shm) that no live manager holds: the
// tiers of runs that died. What they held only in memory is lost (a
// restarted run would have resumed from it: free a dead run's tier once it
// will not be restored). A tier whose manager is alive is skipped.
GcReport collect_memory_tiers(std::string_view root = "", bool dry_run = false);

}  // namespace cairn
