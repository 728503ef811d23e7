// The experiment's checkpoint manager. Ordering that keeps history and
// storage in agreement across crashes:
//   register: commit the checkpoint (commit.cc), then append its record to
//             the history's log, then apply retention (delete each checkpoint
//             manifest-first, then append one record removing them).
//             Retention first appends a "deleting" record naming the
//             checkpoints it is about to delete, so that the history never
//             names, unflagged, a checkpoint whose manifest may be gone.
//   open:     take the lock, read the history (snapshot plus log,
//             manager/history.h) and find the committed checkpoints
//             (scan_with_history: with a version-2 history, one listing of
//             the experiment folder, and only the folders the history does
//             not vouch for are read), then reconcile: committed checkpoints
//             missing from the history are adopted from their manifests (the
//             only manifests read), records whose checkpoint is gone are
//             dropped, uncommitted leftovers and incomplete writes are
//             removed; then apply retention. If that changed anything, the
//             history is rewritten as a new snapshot.
// So after any crash the history on storage differs from the committed set
// by at most the operation that was in flight, and the next open repairs it.
//
// The committed checkpoints are the truth; the history is an index of their
// manifests that open() can always rebuild. So once a checkpoint is
// committed, register succeeds: a history write or retention step that fails
// afterwards (a full disk) is a warning, retention runs anyway to free space,
// the history is then rewritten whole (a new snapshot, covering whatever log
// records did or did not land), and again by every later call and by the
// next open. Before the commit, any failure fails the call and leaves
// nothing visible.
#include "cairn/manager.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "cairn/commit.h"
#include "cairn/error.h"
#include "checkpoint/local_view.h"
#include "checkpoint/manifest_text.h"
#include "manager/history.h"
#include "manager/history_store.h"
#include "manager/layout.h"
#include "manager/retention.h"
#include "manager/scan.h"
#include "util/json.h"
#include "util/log.h"

namespace cairn {

namespace {

constexpr std::string_view kLockKey = manager_layout::kLockKey;
constexpr std::string_view kStateKey = history::kSnapshotKey;
constexpr std::string_view kTrashPrefix = manager_layout::kTrashPrefix;

double system_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

retention::Policy policy_of(const CheckpointConfig& c) {
  retention::Policy p;
  p.num_to_keep = c.num_to_keep;
  p.by_score = !c.checkpoint_score_attribute.empty();
  p.maximize = c.checkpoint_score_order != "min";
  return p;
}

std::vector<retention::Candidate> candidates_of(const std::vector<CheckpointRecord>& records,
                                                const CheckpointConfig& c) {
  std::vector<retention::Candidate> out;
  for (const auto& r : records) {
    retention::Candidate cand{r.index, std::nullopt, r.pinned};
    if (!c.checkpoint_score_attribute.empty()) {
      auto score = retention::extract_score(r.metrics, c.checkpoint_score_attribute);
      if (score.kind == retention::ScoreKind::kNumber) cand.score = score.value;
    }
    out.push_back(cand);
  }
  return out;
}

std::vector<CheckpointRecord> ranked(const std::vector<CheckpointRecord>& records,
                                     const CheckpointConfig& c) {
  std::map<uint64_t, const CheckpointRecord*> by_index;
  for (const auto& r : records) by_index[r.index] = &r;
  std::vector<CheckpointRecord> out;
  for (uint64_t i : retention::rank(candidates_of(records, c), policy_of(c)))
    out.push_back(*by_index[i]);
  return out;
}

}  // namespace

CheckpointRecord::CheckpointRecord(uint64_t i, Checkpoint where)
    : index(i), name(checkpoint_name(i)), checkpoint(std::move(where)) {}

nlohmann::json CheckpointConfig::to_json() const {
  nlohmann::json j;
  j["num_to_keep"] = num_to_keep ? nlohmann::json(*num_to_keep) : nlohmann::json(nullptr);
  j["checkpoint_score_attribute"] = checkpoint_score_attribute;
  j["checkpoint_score_order"] = checkpoint_score_order;
  j["keep_checkpoint_every_n_hours"] = keep_checkpoint_every_n_hours
                                           ? nlohmann::json(*keep_checkpoint_every_n_hours)
                                           : nlohmann::json(nullptr);
  if (memory_tier.enabled) {
    j["memory_tier"] = {{"root", memory_tier.root},
                        {"num_to_keep", memory_tier.num_to_keep},
                        {"persist_every_n", memory_tier.persist_every_n},
                        {"persist_every_minutes", memory_tier.persist_every_minutes},
                        {"max_bytes", memory_tier.max_bytes},
                        {"on_insufficient_memory", memory_tier.on_insufficient_memory},
                        {"replicas", memory_tier.replicas},
                        {"ranks_read_own_files", memory_tier.ranks_read_own_files}};
  }
  return j;
}

CheckpointConfig CheckpointConfig::from_json(const nlohmann::json& j) {
  CheckpointConfig c;
  if (!j.is_object()) return c;
  if (j.contains("num_to_keep") && j["num_to_keep"].is_number_integer()) {
    c.num_to_keep = j["num_to_keep"].get<int>();
  }
  c.checkpoint_score_attribute = j.value("checkpoint_score_attribute", "");
  c.checkpoint_score_order = j.value("checkpoint_score_order", "max");
  if (j.contains("keep_checkpoint_every_n_hours") &&
      j["keep_checkpoint_every_n_hours"].is_number()) {
    c.keep_checkpoint_every_n_hours = j["keep_checkpoint_every_n_hours"].get<double>();
  }
  if (j.contains("memory_tier") && j["memory_tier"].is_object()) {
    const nlohmann::json& t = j["memory_tier"];
    MemoryTierConfig& m = c.memory_tier;
    m.enabled = true;
    m.root = t.value("root", m.root);
    m.num_to_keep = t.value("num_to_keep", m.num_to_keep);
    m.persist_every_n = t.value("persist_every_n", m.persist_every_n);
    m.persist_every_minutes = t.value("persist_every_minutes", m.persist_every_minutes);
    m.max_bytes = t.value("max_bytes", m.max_bytes);
    m.on_insufficient_memory = t.value("on_insufficient_memory", m.on_insufficient_memory);
    m.replicas = t.value("replicas", m.replicas);
    m.ranks_read_own_files = t.value("ranks_read_own_files", m.ranks_read_own_files);
  }
  return c;
}

void CheckpointConfig::validate() const {
  if (num_to_keep && *num_to_keep < 1) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format(
            "CheckpointConfig.num_to_keep must be at least 1 (or unset to keep all), got {}",
            *num_to_keep));
  }
  if (checkpoint_score_order != "max" && checkpoint_score_order != "min") {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format(
            "CheckpointConfig.checkpoint_score_order must be \"max\" or \"min\", got \"{}\"",
            checkpoint_score_order));
  }
  if (!is_valid_utf8(checkpoint_score_attribute)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("CheckpointConfig.checkpoint_score_attribute \"{}\" is not valid UTF-8",
                            printable(checkpoint_score_attribute)));
  }
  if (checkpoint_frequency < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("CheckpointConfig.checkpoint_frequency must be >= 0, got {}",
                            checkpoint_frequency));
  }
  const MemoryTierConfig& t = memory_tier;
  if (t.num_to_keep < 1) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("MemoryTierConfig.num_to_keep must be at least 1, got {}", t.num_to_keep));
  }
  if (t.persist_every_n < 0) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("MemoryTierConfig.persist_every_n must be >= 0, got {}", t.persist_every_n));
  }
  if (t.replicas < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("MemoryTierConfig.replicas must be >= 0, got {}", t.replicas));
  }
  if (!(t.persist_every_minutes >= 0)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("MemoryTierConfig.persist_every_minutes must be >= 0, got {}",
                            t.persist_every_minutes));
  }
  if (t.on_insufficient_memory != "error" && t.on_insufficient_memory != "persistent_only") {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("MemoryTierConfig.on_insufficient_memory must be \"error\" or "
                            "\"persistent_only\", got \"{}\"",
                            printable(t.on_insufficient_memory)));
  }
  if (keep_checkpoint_every_n_hours && !(*keep_checkpoint_every_n_hours > 0)) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("CheckpointConfig.keep_checkpoint_every_n_hours must be positive, got {}",
                    *keep_checkpoint_every_n_hours));
  }
}

CheckpointManager::CheckpointManager(std::string_view experiment_uri, CheckpointConfig config,
                                     ManagerOptions options)
    : config_(std::move(config)), options_(std::move(options)) {
  config_.validate();
  deleter_ = std::make_unique<Deleter>([this](const std::string& m) { warn(m); });
  storage_ = open_storage(experiment_uri);
  lock_ = storage_->try_lock(kLockKey);
  open();
  open_memory_tier();
}

// Deletes uncommitted checkpoints' data on a thread of its own, in order.
// Made with the manager, so that every thread may call wait_idle(); its
// thread starts with the first deletion (a keep-all manager never has one).
struct CheckpointManager::Deleter {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Checkpoint> queue;
  bool busy = false;
  bool stopping = false;
  std::function<void(const std::string&)> warn;
  std::thread thread;  // guarded by mu until the destructor

  explicit Deleter(std::function<void(const std::string&)> w) : warn(std::move(w)) {}
  ~Deleter() {
    {
      std::lock_guard<std::mutex> g(mu);
      stopping = true;
    }
    cv.notify_all();
    if (thread.joinable()) thread.join();  // the queue is drained first
  }
  void push(Checkpoint c) {
    {
      std::lock_guard<std::mutex> g(mu);
      queue.push_back(std::move(c));
      if (!thread.joinable()) thread = std::thread([this] { run(); });
    }
    cv.notify_all();
  }
  void wait_idle() {
    std::unique_lock<std::mutex> g(mu);
    cv.wait(g, [&] { return queue.empty() && !busy; });
  }
  void run() {
    for (;;) {
      std::optional<Checkpoint> next;
      {
        std::unique_lock<std::mutex> g(mu);
        cv.wait(g, [&] { return stopping || !queue.empty(); });
        if (queue.empty()) return;
        next.emplace(std::move(queue.front()));
        queue.pop_front();
        busy = true;
      }
      try {
        remove_uncommitted(*next);
      } catch (const Error& e) {
        // ignore-error: the checkpoint is uncommitted already; the next open
        // removes the leftover.
        warn(fmt::format("{}: deleting in the background failed, removed on the next open: {}",
                         next->uri(), e.what()));
      }
      {
        std::lock_guard<std::mutex> g(mu);
        busy = false;
      }
      cv.notify_all();
    }
  }
};

void CheckpointManager::wait_for_deletes() { deleter_->wait_idle(); }

CheckpointManager::~CheckpointManager() {
  if (tier_) {
    try {
      release_memory_tier();
    } catch (const Error& e) {
      // ignore-error: a destructor cannot throw; the tier stays for the next
      // open of this experiment (or `cairn gc --memory-tier`).
      warn(
          fmt::format("{}: the newest checkpoint could not be persisted, the memory tier is "
                      "kept: {}",
                      uri(), e.what()));
      tier_.reset();
    }
  }
  deleter_.reset();  // pending deletions finish while the lock is still held
  // A long log is folded in on close too, so that the next open (or `cairn
  // ls`) reads one snapshot instead of up to live/8 small objects.
  if (!history_stale_ && log_records_ <= kCloseCompactAbove) return;
  try {
    compact();
  } catch (const Error& e) {
    // ignore-error: a destructor cannot throw; the next open rebuilds the
    // history from the committed manifests.
    log::warn(fmt::format("{}: history not written on close: {}", uri(), e.what()));
  }
}

std::string CheckpointManager::uri() const { return storage_->uri(); }

double CheckpointManager::now() const { return options_.clock ? options_.clock() : system_now(); }

void CheckpointManager::warn(const std::string& message) const {
  if (options_.warn)
    options_.warn(message);
  else
    log::warn(message);
}

void CheckpointManager::open() {
  auto to_warn = [this](const std::string& m) { warn(m); };
  HistoryScan found = scan_with_history(*storage_, to_warn, to_warn);
  const history::Loaded& loaded = found.history;
  const history::State& stored = loaded.state;
  Scan& scan = found.scan;
  const std::map<uint64_t, std::string>& manifests = found.manifests;
  created_at_ = stored.present ? stored.created_at : now();
  last_pinned_at_ = stored.last_pinned_at;
  // The log goes on after the highest seq ever used, so that no object left
  // on storage is mistaken for a newer record.
  next_seq_ = std::max(loaded.max_seq, stored.log_seq) + 1;
  log_seqs_ = loaded.log_seqs;
  log_records_ = loaded.applied;
  // Anything the reconciliation below changes, an older snapshot or format,
  // damaged or already-folded log objects, a deletion that was under way:
  // write a new snapshot (compaction) at once.
  bool changed = !loaded.authoritative() || loaded.log_seqs.size() != loaded.applied ||
                 stored.config.to_json() != config_.to_json() ||
                 std::any_of(stored.records.begin(), stored.records.end(),
                             [](const auto& r) { return r.second.deleting; });

  std::vector<std::string> incomplete = scan.incomplete;
  if (found.trusted) {
    // The listing skipped what the history vouches for, the history's own
    // files among them: the temporaries of its writes a crash cut short
    // (this open holds the lock, so no live writer owns them).
    // At the top only the snapshot's: other files there (a run's results)
    // may have writers of their own.
    for (auto& id : storage_->list_incomplete_at("")) {
      if (id.find(manager_layout::kHistoryKey) != std::string::npos) incomplete.push_back(id);
    }
    for (auto& id : storage_->list_incomplete(manager_layout::kHistoryLogPrefix)) {
      incomplete.push_back(std::move(id));
    }
    // A committed checkpoint's metadata is replaced after its commit; on a
    // file system through a temporary file that a kill can leave. One
    // directory read a checkpoint; object stores replace it in one PUT.
    if (storage_->capabilities().local_root) {
      for (const auto& [index, name] : scan.committed) {
        const std::string folder = join_key(name, ".cairn");
        for (auto& id : storage_->list_incomplete_at(folder)) incomplete.push_back(std::move(id));
      }
    }
  }
  for (const auto& id : incomplete) {
    log::info(fmt::format("removing incomplete write {}", storage_->uri_of(id)));
    storage_->discard_incomplete(id);
  }
  // What the deleter had not freed when the last writer stopped (listed
  // before the leftovers below join it).
  for (const std::string& folder : trash_folders(*storage_)) {
    release(Checkpoint(storage_->child(folder)));
  }
  for (const auto& [index, name] : scan.uncommitted) {
    log::info(fmt::format("removing leftover of an interrupted save or deletion: {}",
                          storage_->uri_of(name)));
    dispose(name);
  }
  for (const auto& [index, damaged] : scan.damaged) {
    warn(
        fmt::format("{}: {} is damaged: {}; it was committed, so it is kept on storage for "
                    "salvage (`cairn show` lists its files) and left out of the history",
                    uri(), damaged.name, damaged.why));
  }
  for (const auto& [index, entry] : stored.records) {
    if (scan.damaged.count(index)) {
      changed = true;
    } else if (!scan.committed.count(index)) {
      log::info(fmt::format(
          "{}: {} is no longer on storage (deleted before a crash); dropping its record", uri(),
          checkpoint_name(index)));
      changed = true;
    }
  }
  records_.reserve(scan.committed.size());
  bool rebased = false;
  for (const auto& [index, name] : scan.committed) {
    Checkpoint where(storage_->child(name));
    auto it = stored.records.find(index);
    if (it != stored.records.end()) {
      CheckpointRecord r(index, where);
      r.metrics = it->second.metrics;
      r.created_at = it->second.created_at;
      r.pinned = it->second.pinned;
      r.size_bytes = it->second.size_bytes;
      r.file_count = it->second.file_count;
      if (!r.size_bytes || !r.file_count) changed |= recount(r);
      records_.push_back(std::move(r));
      continue;
    }
    changed = true;
    Manifest m;
    try {
      m = Manifest::parse(manifests.at(index), where.storage().uri_of(kManifestKey));
    } catch (const Error& e) {
      // ignore-error: a damaged checkpoint stays on storage for the user to inspect
      // (`cairn verify` names it) but is kept out of the history.
      warn(fmt::format("not adopting {}: {}", where.uri(), e.what()));
      continue;
    }
    if (loaded.torn && !rebased) {
      // The torn snapshot held when the experiment began; pins are
      // recomputed from the earliest checkpoint on, as they were made.
      created_at_ = std::min(created_at_, m.created_at);
      rebased = true;
    }
    log::info(fmt::format("{}: adopting {} committed before a crash", uri(), name));
    add_record(index, where, m);
  }
  changed |= set_aside_damaged_latest(manifests);
  // UINT64_MAX is never a checkpoint's index: it means "exhausted".
  const uint64_t after_scan = !scan.max_index                   ? 0
                              : *scan.max_index == kNoMoreIndex ? kNoMoreIndex
                                                                : *scan.max_index + 1;
  next_index_ = std::max(stored.next_index, after_scan);
  if (next_index_ != stored.next_index || last_pinned_at_ != stored.last_pinned_at) changed = true;
  history_stale_ = changed;
  // A crash between a commit and its retention step leaves one extra; apply
  // the policy now, so that repeated crashes never accumulate them.
  settle(uri(), std::nullopt);
}

bool CheckpointManager::set_aside_damaged_latest(const std::map<uint64_t, std::string>& read) {
  // The history vouches for its checkpoints without their manifests being
  // read; the newest is read here (one request) because it is the one a
  // restart restores. A damaged one is set aside, kept on storage, and the
  // newest intact one before it serves as the latest.
  bool changed = false;
  while (!records_.empty()) {
    const CheckpointRecord& newest = records_.back();
    if (read.count(newest.index)) break;  // adopted above: its manifest was just parsed
    try {
      (void)newest.checkpoint.manifest();
      break;
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kCorruption && e.code() != ErrorCode::kNotFound) throw;
      const std::string fallback =
          records_.size() > 1 ? records_[records_.size() - 2].name : std::string("none");
      warn(
          fmt::format("{}: the latest checkpoint {} cannot be read: {}; it is kept on storage "
                      "for salvage and left out of the history; the latest intact one is {}",
                      uri(), newest.name, e.what(), fallback));
      records_.pop_back();
      changed = true;
    }
  }
  return changed;
}

bool CheckpointManager::recount(CheckpointRecord& r) const {
  try {
    const Manifest m = r.checkpoint.manifest();
    r.size_bytes = m.total_bytes();
    r.file_count = m.files.size();
    return true;
  } catch (const Error& e) {
    // ignore-error: kept without them, as before; `cairn verify` names the
    // damaged manifest and `cairn ls` reads it again.
    if (e.code() != ErrorCode::kCorruption && e.code() != ErrorCode::kNotFound) throw;
    return false;
  }
}

uint64_t CheckpointManager::take_index() {
  if (next_index_ >= kNoMoreIndex) {
    throw Error(ErrorCode::kFailedPrecondition,
                fmt::format("{}: every checkpoint index has been used (the next would be {}); "
                            "start a new experiment",
                            uri(), next_index_));
  }
  return next_index_++;
}

CheckpointRecord CheckpointManager::add_record(uint64_t index, const Checkpoint& where,
                                               const Manifest& manifest) {
  CheckpointRecord r(index, where);
  r.metrics = manifest.metrics;
  r.created_at = manifest.created_at;
  r.size_bytes = manifest.total_bytes();
  r.file_count = manifest.files.size();
  if (retention::should_pin(r.created_at, last_pinned_at_.value_or(created_at_),
                            config_.keep_checkpoint_every_n_hours)) {
    r.pinned = true;
    last_pinned_at_ = r.created_at;
  }
  auto pos = std::lower_bound(records_.begin(), records_.end(), index,
                              [](const CheckpointRecord& a, uint64_t i) { return a.index < i; });
  records_.insert(pos, r);
  return r;
}

void CheckpointManager::compact() {
  history::State state;
  state.present = true;
  state.created_at = created_at_;
  state.next_index = next_index_;
  state.last_pinned_at = last_pinned_at_;
  state.config = config_;
  state.log_seq = next_seq_ - 1;  // covers every log object written so far
  for (const auto& r : records_) {
    history::State::Entry& e = state.records[r.index];
    e = {r.metrics, r.created_at, r.pinned, r.size_bytes, r.file_count};
    e.deleting = deleting_.count(r.index) > 0;
  }
  // The snapshot is replaced atomically; a crash before the removals below
  // leaves log objects at or below its log_seq, which readers ignore.
  storage_->put(kStateKey, history::snapshot_json(state).dump(1));
  history_stale_ = false;
  log_records_ = 0;
  if (log_seqs_.empty()) return;
  std::vector<std::string> keys;
  keys.reserve(log_seqs_.size());
  for (uint64_t seq : log_seqs_) keys.push_back(history::log_key(seq));
  try {
    storage_->remove_many(keys);
    log_seqs_.clear();
  } catch (const Error& e) {
    // ignore-error: the snapshot covers them; the next compaction or open
    // removes them.
    log::warn(fmt::format("{}: removing folded history records failed: {}", uri(), e.what()));
  }
}

void CheckpointManager::append_change(nlohmann::json change) {
  if (history_stale_ || history::should_compact(log_records_ + 1, records_.size())) {
    compact();
    return;
  }
  const uint64_t seq = next_seq_++;
  change["seq"] = seq;
  // The seq is used even if the write fails (the object may exist): the
  // compaction that then follows covers it.
  log_seqs_.push_back(seq);
  try {
    storage_->put(history::log_key(seq), history::encode_record(change));
  } catch (const Error&) {
    history_stale_ = true;
    throw;
  }
  ++log_records_;
}

nlohmann::json CheckpointManager::add_change(const CheckpointRecord& r) const {
  return history::add_record(0, r.index,
                             {r.metrics, r.created_at, r.pinned, r.size_bytes, r.file_count},
                             next_index_, last_pinned_at_);
}

void CheckpointManager::apply_retention(std::vector<uint64_t>& removed) {
  // Keep-all deletes nothing: skip ranking the whole history on every save.
  if (!config_.num_to_keep) return;
  std::vector<uint64_t> doomed =
      retention::to_delete(candidates_of(records_, config_), policy_of(config_));
  if (doomed.empty()) return;
  if (options_.before_delete) {
    std::vector<std::string> names;
    std::vector<std::string> kept;
    // Kept: what either tier holds (checkpoints only memory holds included).
    for (const auto& r : merged_records()) {
      const bool dies = std::find(doomed.begin(), doomed.end(), r.index) != doomed.end();
      (dies ? names : kept).push_back(r.name);
    }
    const std::vector<std::string> deferred = options_.before_delete(names, kept);
    std::erase_if(doomed, [&](uint64_t index) {
      auto it = std::find_if(records_.begin(), records_.end(),
                             [&](const auto& r) { return r.index == index; });
      return std::find(deferred.begin(), deferred.end(), it->name) != deferred.end();
    });
  }
  if (doomed.empty()) return;
  announce_deletion(doomed);
  delete_announced(doomed, removed);
}

void CheckpointManager::dispose(const std::string& name) {
  Checkpoint folder(storage_->child(name));
  if (!options_.background_delete) {
    remove_uncommitted(folder);
    return;
  }
  if (!storage_->capabilities().renames) {
    release(folder);
    return;
  }
  // Out of the experiment at once, one rename per file, whatever their size;
  // their space is freed on the deleter's thread. A crash in between leaves
  // files in either folder, both of which the next open empties.
  const std::string trash = fmt::format("{}/{}", kTrashPrefix, name);
  try {
    for (const auto& o : folder.storage().list("")) {
      storage_->rename(fmt::format("{}/{}", name, o.key), fmt::format("{}/{}", trash, o.key));
    }
    remove_uncommitted(folder);  // what no rename moves: incomplete writes, empty folders
  } catch (const Error& e) {
    // ignore-error: uncommitted already; the deleter removes what is left
    // where it lies.
    warn(fmt::format("{}: moving it to {} failed, deleting it in place: {}", folder.uri(),
                     storage_->uri_of(kTrashPrefix), e.what()));
    release(folder);
  }
  release(Checkpoint(storage_->child(trash)));
}

void CheckpointManager::release(const Checkpoint& uncommitted) { deleter_->push(uncommitted); }

void CheckpointManager::announce_deletion(const std::vector<uint64_t>& doomed) {
  deleting_.insert(doomed.begin(), doomed.end());
  try {
    append_change(history::deleting_record(0, doomed));
    return;
  } catch (const Error& e) {
    warn(fmt::format("{}: announcing the deletion of {} checkpoint(s) in the history failed: {}",
                     uri(), doomed.size(), e.what()));
  }
  // The history cannot say that these manifests are going (a full disk), yet
  // retention must run to free space: take the snapshot away instead, so
  // that the next open rebuilds the history from the manifests rather than
  // trust it. It is written whole again after the deletions (history_stale_).
  history_stale_ = true;
  try {
    storage_->remove(kStateKey);
  } catch (const Error&) {
    for (uint64_t index : doomed) deleting_.erase(index);
    throw;  // nothing deleted; retention runs again on the next save or open
  }
}

void CheckpointManager::settle(std::string_view subject,
                               const std::optional<nlohmann::json>& change) {
  std::optional<Error> history_error;
  if (change) {
    try {
      append_change(*change);
    } catch (const Error& e) {
      history_error = e;  // retried below, once retention has freed what it can
    }
  }
  std::vector<uint64_t> removed;
  try {
    apply_retention(removed);
  } catch (const Error& e) {
    // ignore-error: the checkpoints are committed; retention runs again on
    // the next save and on open, and the caller must not see a committed
    // checkpoint as a failed save.
    warn(fmt::format("{}: applying retention failed, retried on the next save or open: {}", subject,
                     e.what()));
  }
  if (!removed.empty()) {
    try {
      append_change(history::remove_record(0, removed));
    } catch (const Error& e) {
      history_error = e;
    }
  }
  if (history_stale_) {
    try {
      compact();
      history_error.reset();
    } catch (const Error& e) {
      history_error = e;
    }
  }
  if (history_error) {
    // ignore-error: the history is an index of the committed manifests;
    // every later call retries the write and the next open rebuilds it.
    warn(fmt::format("{}: writing {} failed, retried on the next save or open: {}", subject,
                     storage_->uri_of(kStateKey), history_error->what()));
  }
}

void CheckpointManager::check_score(const nlohmann::json& metrics, std::string_view subject) const {
  if (!metrics.is_object() && !metrics.is_null()) {  // null: no metrics
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("{}: metrics must be a JSON object, got {}", subject, metrics.type_name()));
  }
  check_storable_json(metrics, fmt::format("{}: metrics", subject));
  if (config_.checkpoint_score_attribute.empty()) return;
  auto score = retention::extract_score(metrics, config_.checkpoint_score_attribute);
  if (score.kind == retention::ScoreKind::kNotNumber) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{}: score attribute \"{}\" is not a number: {}", subject,
                            config_.checkpoint_score_attribute, score.found));
  }
  if (score.kind == retention::ScoreKind::kMissing) {
    warn(fmt::format("{}: reported without the score attribute \"{}\"; it ranks worst", subject,
                     config_.checkpoint_score_attribute));
  }
}

CheckpointRecord CheckpointManager::register_checkpoint(const nlohmann::json& metrics,
                                                        const Checkpoint& checkpoint) {
  wait_for_deletes();  // see reserve_next()
  if (auto r = register_in_memory(metrics, checkpoint)) return *r;
  std::lock_guard<std::mutex> g(mu_);
  const std::string name = checkpoint_name(next_index_);
  check_score(metrics, storage_->uri_of(name));
  // A typo in the source path must fail here, before an index is used or
  // retention can run: an empty checkpoint would otherwise push out a good one.
  try {
    check_root_exists(checkpoint.storage());
  } catch (const Error& e) {
    throw with_context(e, fmt::format("registering {}", checkpoint.uri()));
  }
  const uint64_t index = take_index();
  Checkpoint dest(storage_->child(name));
  Manifest manifest;
  try {
    CheckpointWriter writer(dest);
    writer.copy_from(checkpoint);
    std::optional<nlohmann::json> metadata;
    if (checkpoint.storage().exists(kMetadataKey)) metadata = checkpoint.get_metadata();
    manifest = writer.commit(metrics, now(), metadata ? &*metadata : nullptr);
  } catch (const Error& e) {
    discard_failed(dest);
    throw with_context(e, fmt::format("registering {} as {}", checkpoint.uri(), dest.uri()));
  }
  CheckpointRecord record = add_record(index, dest, manifest);
  settle(fmt::format("registering {} as {}", checkpoint.uri(), dest.uri()), add_change(record));
  return record;
}

void CheckpointManager::discard_failed(const Checkpoint& dest) {
  try {
    if (!dest.is_committed()) remove_uncommitted(dest);
  } catch (const Error& cleanup) {
    // ignore-error: the leftover is removed on the next open or by `cairn gc`;
    // the original error is what the caller needs.
    log::warn(fmt::format("could not clean up {}: {}", dest.uri(), cleanup.what()));
  }
}

std::optional<CheckpointRecord> CheckpointManager::latest() const {
  std::lock_guard<std::mutex> g(mu_);
  if (tier_) {
    std::vector<CheckpointRecord> all = merged_records();
    if (all.empty()) return std::nullopt;
    return all.back();
  }
  if (records_.empty()) return std::nullopt;
  return records_.back();
}

std::vector<CheckpointRecord> CheckpointManager::best() const {
  std::lock_guard<std::mutex> g(mu_);
  return ranked(tier_ ? merged_records() : records_, config_);
}

std::vector<CheckpointRecord> CheckpointManager::history() const {
  std::lock_guard<std::mutex> g(mu_);
  return tier_ ? merged_records() : records_;
}

std::vector<CheckpointRecord> rank_checkpoints(const std::vector<CheckpointRecord>& records,
                                               const CheckpointConfig& config) {
  return ranked(records, config);
}

}  // namespace cairn
