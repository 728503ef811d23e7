// StateCheckpointManager: tf.train.CheckpointManager for code that does not
// use the Trainer. It saves StateDicts as numbered checkpoints of one
// directory (any storage URI) and restores them with TensorFlow's
// assert_consumed check.
//
//   StateCheckpointOptions o;
//   o.max_to_keep = 3;
//   o.checkpoint_interval = 100;             // steps
//   StateCheckpointManager mgr("/runs/exp1", o);
//   if (mgr.latest()) mgr.restore(state);     // throws if anything does not match
//   for (uint64_t step = ...; ...) {
//     ...
//     mgr.save(state, step, {{"loss", loss}});  // skipped unless 100 steps passed
//   }
//
// It is built on CheckpointManager (manager.h) by composition: numbering,
// commit protocol, the experiment lock, crash clean-up and retention
// (max_to_keep -> num_to_keep, best_metric -> checkpoint_score_attribute,
// keep_checkpoint_every_n_hours) are the foundation's. Each checkpoint holds
// one safetensors file, state.safetensors, whose metadata is the StateDict's
// metadata plus "step"; the checkpoint's metrics are the given metrics plus
// "step".
//
// Step counter: save() records `step` (or, when omitted, one more than the
// last saved step, starting at 0). With checkpoint_interval = N, save()
// writes only if no checkpoint was saved yet or step >= last saved step + N,
// and returns nullopt otherwise (force = true always saves).
//
// Durability and failure: when save() returns (or an async save's handle
// completes) the checkpoint is committed and durable; on failure nothing
// earlier is lost and the new checkpoint is not visible. restore() verifies
// the file's checksum against the manifest (kCorruption naming the file).
//
// Thread-safety: calls are serialized. One manager per directory across all
// processes (kLocked otherwise).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cairn/async_save.h"
#include "cairn/manager.h"
#include "cairn/state.h"

namespace cairn {

struct StateCheckpointOptions {
  std::optional<int> max_to_keep;                       // unset: keep all
  std::optional<double> keep_checkpoint_every_n_hours;  // pinned: never deleted
  std::optional<uint64_t> checkpoint_interval;          // in steps; unset: every save
  // Rank checkpoints by this metric (nested keys as "a/b") for retention and
  // best(); empty: by recency.
  std::string best_metric;
  std::string best_mode = "max";  // "max" or "min"
  SaveOptions write = {};
  AsyncSaveOptions async = {};  // for save_async()
  // restore() readies save_async()'s staging for the restored state in the
  // background, as reserve() does, so that the first save_async() of a
  // resumed run stalls for a copy of the state rather than for the first
  // touch of fresh memory; so does a restore() that finds no checkpoint (a
  // fresh run's restore-or-start, before its kNotFound), for the state it
  // was given. It holds staging of the state's size (what that
  // save_async() allocates anyway); a synchronous save() before any
  // save_async() frees it. false: restore() allocates nothing.
  bool prepare_async_on_restore = true;
  ManagerOptions manager = {};  // clock, warnings (injected for tests), background_delete
  // Saves to this host's memory first, every N-th persisted in the
  // background (CheckpointConfig::memory_tier; off by default). A restore
  // after a crash of this process reads the newest copy from memory.
  MemoryTierConfig memory_tier = {};
};

// What restore() found.
struct RestoreResult {
  CheckpointRecord record;
  uint64_t step = 0;
  nlohmann::json metadata;  // the saved StateDict metadata (also put into the state)
};

class StateCheckpointManager {
 public:
  // Opens (creating if needed) the directory. Throws kInvalidArgument for bad
  // options, kLocked if another manager holds it.
  StateCheckpointManager(std::string_view directory_or_uri, StateCheckpointOptions options = {});
  // Waits for async saves (errors not yet seen are logged; call wait() first
  // to receive them).
  ~StateCheckpointManager();
  StateCheckpointManager(const StateCheckpointManager&) = delete;
  StateCheckpointManager& operator=(const StateCheckpointManager&) = delete;

  // Saves synchronously; returns the new record, or nullopt when skipped by
  // checkpoint_interval. A best_metric present in `metrics` but not a number
  // is kInvalidArgument before anything is written.
  std::optional<CheckpointRecord> save(const StateDict& state,
                                       std::optional<uint64_t> step = std::nullopt,
                                       const nlohmann::json& metrics = nlohmann::json::object(),
                                       bool force = false);
  // As save(), but returns after snapshotting (async_save.h); nullopt when
  // skipped by checkpoint_interval. With StateCheckpointOptions::async's
  // when_busy = WhenBusy::kSkip, a save issued while the previous one is
  // still writing returns a handle whose skipped() is true; it does not
  // count as the last step saved. Errors surface on the handle, or on the
  // next save/wait.
  std::optional<SaveHandle> save_async(const StateDict& state,
                                       std::optional<uint64_t> step = std::nullopt,
                                       const nlohmann::json& metrics = nlohmann::json::object(),
                                       bool force = false);
  // Readies save_async() for states like `state` (its tensors' names,
  // dtypes and shapes and its metadata; not their values) without waiting:
  // the staging is allocated and touched on the saver's own thread
  // (AsyncSaver::reserve with Reserve::kBackground), so that the first
  // save_async() stalls for a copy of the state rather than for the first
  // touch of fresh memory (several times longer). A save_async() issued
  // before that work ends waits for the rest of it; the next save_async()
  // or wait() throws its error. Throws kInvalidArgument for metadata that
  // is not an object, as save_async().
  void reserve(const StateDict& state);
  // Waits for async saves and for the deletion of what retention removed
  // (ManagerOptions::background_delete); throws an error not yet seen.
  void wait();

  // The newest committed checkpoint.
  std::optional<CheckpointRecord> latest() const;
  // Kept checkpoints, best first (by best_metric, or newest first).
  std::vector<CheckpointRecord> best() const;
  // Kept checkpoints in save order.
  std::vector<CheckpointRecord> checkpoints() const;
  // The last step saved (or being saved), if any.
  std::optional<uint64_t> last_step() const;

  // Loads the latest checkpoint (or `which`) into `state`'s writable entries
  // with the assert_consumed check: every saved tensor matched and every
  // entry found with its dtype and shape, else kInvalidArgument listing the
  // missing, unexpected and mismatched tensors (nothing is written then).
  // kNotFound if there is no checkpoint. Replaces state.metadata. Prepares
  // save_async()'s staging (StateCheckpointOptions::prepare_async_on_restore),
  // with no checkpoint too (before the kNotFound).
  RestoreResult restore(StateDict& state) const;
  RestoreResult restore(StateDict& state, const CheckpointRecord& which) const;
  // Zero-copy access to a checkpoint's state (file backend: mapped).
  MappedState open(const CheckpointRecord& which) const;

  // The statistics of save_async()'s saver (AsyncSaver::Stats); nullopt
  // before save_async(), reserve() or a restore() that prepared it.
  std::optional<AsyncSaver::Stats> async_stats() const;

  // The foundation manager underneath (history, config, uri).
  CheckpointManager& base();

 private:
  // StateCheckpointOptions::prepare_async_on_restore's work, after `after`
  // (for its warning).
  void prepare_after_restore(const StateDict& state, const std::string& after) const;

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cairn
