// The manager's reservations: a checkpoint folder handed out before its
// files are written (by other processes in the Trainer, by an AsyncSaver's
// writer thread), then committed with the files' sizes and checksums or
// abandoned. The index is persisted before anything is written into the
// folder (reserve_next, or prepare_reserved for a deferred reservation), so
// a restarted manager never hands out an index something may hold.
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cairn/commit.h"
#include "cairn/error.h"
#include "cairn/manager.h"
#include "manager/history.h"

namespace cairn {

Checkpoint CheckpointManager::reserve_next(Reservation how) {
  // With background deletion, a new checkpoint starts once the deletions
  // queued by earlier saves are done, so the disk never holds more than with
  // deletion in the save (the kept checkpoints and the one being written).
  // Waited for outside the lock: the deleter's warnings may call back.
  // kDeferred leaves this, and persisting the index, to prepare_reserved().
  if (how == Reservation::kNow) wait_for_deletes();
  if (auto c = reserve_in_memory()) return *c;
  std::lock_guard<std::mutex> g(mu_);
  const uint64_t index = take_index();
  Checkpoint dest(storage_->child(checkpoint_name(index)));
  if (how == Reservation::kNow) {
    // Other processes write into the reservation, and one of them may
    // outlive a crash of this one; the index is persisted before anyone
    // writes, so a restarted manager never hands it out again.
    try {
      append_change(history::counters_record(0, next_index_));
    } catch (const Error& e) {
      --next_index_;
      throw with_context(e, fmt::format("reserving {}", dest.uri()));
    }
  } else {
    unprepared_.insert(dest.uri());
  }
  reserved_[dest.uri()] = index;
  return dest;
}

void CheckpointManager::prepare_reserved(const Checkpoint& reserved) {
  wait_for_deletes();  // outside the lock, as in reserve_next()
  std::lock_guard<std::mutex> g(mu_);
  // A reservation in the memory tier was made ready when it was taken.
  if (reserved_in_memory_locked(reserved)) return;
  if (!reserved_.count(reserved.uri())) {
    throw Error(
        ErrorCode::kFailedPrecondition,
        fmt::format("{}: was not reserved by this manager (use reserve_next())", reserved.uri()));
  }
  if (!unprepared_.count(reserved.uri())) return;
  try {
    // Covers every index taken so far, so one record serves them all.
    append_change(history::counters_record(0, next_index_));
  } catch (const Error& e) {
    throw with_context(e, fmt::format("reserving {}", reserved.uri()));
  }
  unprepared_.clear();
}

CheckpointRecord CheckpointManager::commit_reserved(const Checkpoint& reserved,
                                                    const nlohmann::json& metrics,
                                                    const std::vector<ManifestEntry>& files,
                                                    const nlohmann::json& layout,
                                                    const nlohmann::json* metadata,
                                                    const nlohmann::json& ranks) {
  if (auto r = commit_in_memory(reserved, metrics, files, layout, metadata, ranks)) return *r;
  std::lock_guard<std::mutex> g(mu_);
  auto it = reserved_.find(reserved.uri());
  if (it == reserved_.end()) {
    throw Error(
        ErrorCode::kFailedPrecondition,
        fmt::format("{}: was not reserved by this manager (use reserve_next())", reserved.uri()));
  }
  const uint64_t index = it->second;
  check_score(metrics, reserved.uri());
  Manifest manifest;
  try {
    CheckpointWriter writer(reserved);
    if (files_elsewhere_) {
      writer.add_held_elsewhere(files);
    } else {
      writer.add_written(files);
    }
    if (!layout.is_null()) writer.set_layout(layout);
    if (!ranks.is_null()) writer.set_ranks(ranks);
    manifest = writer.commit(metrics, now(), metadata);
  } catch (const Error& e) {
    throw with_context(e, fmt::format("committing {}", reserved.uri()));
  }
  reserved_.erase(it);
  unprepared_.erase(reserved.uri());  // its record persists the counters too
  CheckpointRecord record = add_record(index, reserved, manifest);
  settle(fmt::format("committing {}", reserved.uri()), add_change(record));
  return record;
}

void CheckpointManager::abandon_reserved(const Checkpoint& reserved) {
  if (abandon_in_memory(reserved)) return;
  std::lock_guard<std::mutex> g(mu_);
  if (reserved_.erase(reserved.uri()) == 0) {
    throw Error(ErrorCode::kFailedPrecondition,
                fmt::format("{}: was not reserved by this manager", reserved.uri()));
  }
  unprepared_.erase(reserved.uri());
  discard_failed(reserved);
}

}  // namespace cairn
